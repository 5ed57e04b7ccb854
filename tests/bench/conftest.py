"""Fixtures for the bench tests: a stub server per test, and the bench CLI behind a tiny argparse."""

from __future__ import annotations

import argparse
from typing import Iterator

import pytest

from bench_stub import StubServer, StubState
from openinfer.bench.cli import add_parser


@pytest.fixture
def stub() -> Iterator[tuple[str, StubState]]:
    state = StubState()
    with StubServer(state) as url:
        yield url, state


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="openinfer")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)
