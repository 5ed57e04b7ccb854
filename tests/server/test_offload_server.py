"""A server over the demo engine with --kv-offload: the tier's metrics on /metrics, and the `bench prefix`
ladder measuring a real host-restore rung against it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from server_harness import LiveServer
from openinfer.cli import main
from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.server import ModelHost
from openinfer.testing.engine import demo_kv_gib



@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=demo_kv_gib(40),
                                           kv_offload=True, kv_offload_host_gib=demo_kv_gib(256))).start()
    try:
        with LiveServer(ModelHost({"demo": engine})) as url:
            yield url
    finally:
        engine.shutdown()


def test_offload_metrics_are_exported(url: str) -> None:
    text = httpx.get(url + "/metrics").text
    assert 'vllm:cache_config_info{block_size="16",model_name="demo",num_gpu_blocks="40",num_cpu_blocks="256"} 1' in text
    for name in ("saved_blocks_total", "restored_blocks_total", "dropped_blocks_total", "host_usage_perc",
                 "host_capacity_blocks", "queries_total", "hits_total", "hit_rate"):
        assert f'openinfer:kv_offload_{name}{{model_name="demo"}}' in text


def test_bench_prefix_measures_host_restores(url: str, tmp_path: Path) -> None:
    out = tmp_path / "prefix.json"
    assert main(["bench", "prefix", "--base-url", url, "--lengths", "64,128", "--repeats", "2", "--vocab-size",
                 "150000", "--host-restore", "--evict-concurrency", "4", "--output-json", str(out)]) == 0
    rows = {(r["length"], r["tier"]): r for r in json.loads(out.read_text())["results"]}
    for n in (64, 128):                 # whole blocks: all but the last token is reused
        assert rows[(n, "cold")]["median_cached_tokens"] == 0
        assert rows[(n, "warm")]["median_cached_tokens"] == n - 1   # its block is copied on the device
        assert rows[(n, "host")]["median_cached_tokens"] == n - 1   # every block restored, the last one too
        assert rows[(n, "host")]["median_restored_blocks"] == n // 16
    text = httpx.get(url + "/metrics").text
    assert 'openinfer:kv_offload_restored_blocks_total{model_name="demo"} 0.0' not in text
