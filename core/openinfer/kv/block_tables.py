"""The block tables of the requests a step runs, kept from step to step as rows of one numpy array.

A running request's block list only grows, so each step copies just the blocks added since the last
one (usually none, or one every block_size decode steps) instead of rebuilding B x blocks entries: at
batch 128 and 16k context that rebuild alone cost ~3 ms a step. A request keeps its row while it
appears in consecutive steps; one that misses a step (finished, or a prefill left out by the token
budget) gives its row back and is copied afresh when it returns. A list that was replaced rather than
grown (shorter, or its last copied block differs), or a new request under a reused id, is copied afresh.
A decode step runs the requests of the step before in the same order, with the same lists (block_manager
only appends to one or replaces it): then the lists that grew are found with numpy, not a Python step per row.
"""
from __future__ import annotations

from operator import is_
from typing import Sequence

import numpy as np

from ..engine.request import Request


class BlockTables:
    def __init__(self, rows: int = 8, width: int = 64) -> None:
        self.table = np.zeros((rows, width), np.int32)   # a row is zero past its request's blocks
        # request id -> (request, row, blocks copied, the last of them): the last id tells a replaced list
        # apart without reading the table back
        self.held: dict[str, tuple[Request, int, int, int]] = {}
        self.free = list(range(rows - 1, -1, -1))
        # the last gather's requests, their block lists and counts then, and table rows: what a decode step repeats
        none = np.zeros(0, np.intp)
        self.last: tuple[list[Request], list[list[int]], np.ndarray, np.ndarray] = ([], [], none, none)

    def gather(self, reqs: Sequence[Request]) -> np.ndarray:
        """[len(reqs), most blocks] int32, each row the request's blocks padded with block 0."""
        lists = [r.block_ids for r in reqs]
        last = self.last
        if len(reqs) == len(last[0]) and all(map(is_, reqs, last[0])) and all(map(is_, lists, last[1])):
            return self._regather(reqs, lists)
        rows, width = self._gather(reqs)
        self.last = list(reqs), lists, np.array([len(ids) for ids in lists], np.int64), rows
        return self.table[rows, :width]

    def _regather(self, reqs: Sequence[Request], lists: list[list[int]]) -> np.ndarray:
        """The last gather's requests again, in order, with the same block lists (a decode step): only the lists
        that grew since are copied, found without a Python step per row."""
        _, _, counts, rows = self.last
        now = np.fromiter(map(len, lists), np.int64, len(lists))
        for i in np.flatnonzero(now != counts).tolist():
            r = reqs[i]
            self.held[r.request_id] = self._copy(r, self.held[r.request_id])
        counts[:] = now
        return self.table[rows, : max(1, int(now.max(initial=0)))]

    def _gather(self, reqs: Sequence[Request]) -> tuple[np.ndarray, int]:
        """Every request's row brought up to date, rows of requests not in `reqs` given back: (table rows, width)."""
        held, kept = self.held, {}
        rows, width, pop, copy = [], 1, held.pop, self._copy
        for r in reqs:
            ids, rid = r.block_ids, r.request_id
            entry = pop(rid, None)
            if entry is None or entry[0] is not r or entry[2] != len(ids) or (ids and ids[-1] != entry[3]):
                entry = copy(r, entry)   # new, grown or replaced: a few rows a step at most
            kept[rid] = entry
            rows.append(entry[1])
            if entry[2] > width:   # not max(): a builtin call per row is slow here
                width = entry[2]
        self.held = kept
        for _, row, n, _ in held.values():   # requests this step does not run
            self.table[row, :n] = 0
            self.free.append(row)
        return np.array(rows, np.intp), width

    def _copy(self, r: Request, entry: tuple[Request, int, int, int] | None) -> tuple[Request, int, int, int]:
        """Bring the request's row up to date: a fresh row, the added blocks, or the whole list again."""
        ids = r.block_ids
        was, row, n, last = entry or (r, self._take(), 0, 0)
        if was is not r or n > len(ids) or (n and ids[n - 1] != last):
            self.table[row, :n] = 0
            n = 0
        if len(ids) > n:
            if len(ids) > self.table.shape[1]:
                self._grow(self.table.shape[0], max(len(ids), 2 * self.table.shape[1]))
            self.table[row, n: len(ids)] = ids[n:]
        return r, row, len(ids), ids[-1] if ids else 0

    def _take(self) -> int:
        if not self.free:
            old = self.table.shape[0]
            self._grow(2 * old, self.table.shape[1])
            self.free = list(range(2 * old - 1, old - 1, -1))
        return self.free.pop()

    def _grow(self, rows: int, width: int) -> None:
        table = np.zeros((rows, width), np.int32)
        table[: self.table.shape[0], : self.table.shape[1]] = self.table
        self.table = table
