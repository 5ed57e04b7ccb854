"""Engine configuration (the `openinfer serve` flags that shape an engine)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from ..kv.block_manager import BLOCK_HASHES
from ..kv.pool import KV_CACHE_DTYPES


# Per-step token budget when none is given. On a GPU a long prompt's prefill is GEMM-bound: 1k-token chunks
# ran a 16k prompt in ~435 ms, 8k ones in ~390 ms (Qwen3-4B shape on an H200), at the price of
# longer pauses for the running decodes while a chunk runs (vLLM's API server picks 8192 on such GPUs too).
# On the CPU a step is slow anyway, and short chunks keep streams moving.
GPU_BATCHED_TOKENS = 8192
CPU_BATCHED_TOKENS = 1024


def default_batched_tokens(device: str) -> int:
    return GPU_BATCHED_TOKENS if device.startswith("cuda") else CPU_BATCHED_TOKENS


# Running sequences when none is given. On the CPU a step is slow anyway; on a GPU the loader seats as many as the
# KV pool holds (loader.auto_max_num_seqs), up to 256: a Qwen3-4B decode step of 256 rows of 1k context reads more
# KV cache than weights, so more rows add little throughput but raise every stream's time per token.
CPU_MAX_NUM_SEQS = 64
GPU_MAX_NUM_SEQS = 256


@dataclass
class EngineArgs:
    device: str = "cpu"                     # cpu | cuda | cuda:N
    dtype: str | None = None                # None: the backend's default (float32 on CPU, bfloat16 on CUDA)
    load_format: str = "auto"               # auto: the checkpoint's safetensors; dummy: random weights of the real shapes
    max_model_len: int | None = None        # None: the model's max_position_embeddings
    max_num_batched_tokens: int | None = None  # per-step token budget (chunked prefill); None: the device's default
    max_num_seqs: int | None = None         # None: 64 on the CPU; on CUDA chosen at load from the KV pool
    block_size: int = 16
    kv_cache_memory_gib: float | None = None  # KV pool size; None: CPU 1 GiB cap / GPU from --gpu-memory-utilization
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    prefix_cache_hash: str = "builtin"      # block keys: builtin (Python's hash) | sha256 (kv/block_manager.py)
    num_state_checkpoints: int | None = None  # hybrid models: prefix checkpoints of the bounded state; None: max_num_seqs
    served_model_name: str | None = None
    tokenizer: str | None = None            # a tokenizer folder used instead of the checkpoint's (or a preset line's)
    seed: int = 0                           # dummy-weight seed
    num_layers: int | None = None           # dummy weights only: the first N decoder layers at the real width
                                            # (benchmarks of a model too large for the device at full depth)
    enforce_eager: bool = False             # CUDA: no graph capture
    pipelined_decode: bool = True           # queue decode step N+1 before step N's host work (pipeline.py)
    kv_offload: bool = False                # save evicted KV blocks to host memory, restore them at admission
    kv_offload_host_gib: float = 8.0        # the host tier's size (pinned memory on CUDA)
    kv_cache_dtype: str = "auto"            # auto: the model dtype; fp8: e4m3 bytes where the line reads them
    generation_config: str = "auto"         # auto: generation_config.json's sampling fields are the defaults; none
    scheduling_policy: str = "fcfs"         # fcfs, or priority: waiting requests admitted by their priority first
    ep: int = 1                             # expert-parallel ranks: one process per device, experts sharded
    kernels: dict[str, str] = field(default_factory=dict)   # op -> the registry implementation it gets (--kernel)
    hf_overrides: dict[str, Any] = field(default_factory=dict)  # config.json fields set before the line reads it

    def __post_init__(self) -> None:
        if not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in self.kernels.items()):
            raise ValueError("kernels maps op names to implementation names, e.g. {'paged_attention': 'mma'}")
        if not isinstance(self.hf_overrides, dict):
            raise ValueError(f"hf_overrides must map config.json fields to values, got {self.hf_overrides!r}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = default_batched_tokens(self.device)
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs is None and not self.device.startswith("cuda"):
            self.max_num_seqs = CPU_MAX_NUM_SEQS
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.num_state_checkpoints is not None and self.num_state_checkpoints < 0:
            raise ValueError("num_state_checkpoints must be >= 0")
        if self.prefix_cache_hash not in BLOCK_HASHES:
            raise ValueError(f"unknown prefix_cache_hash {self.prefix_cache_hash!r}: use one of {', '.join(BLOCK_HASHES)}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"unknown load_format {self.load_format!r}: use auto or dummy")
        if self.num_layers is not None and self.load_format != "dummy":
            raise ValueError("num_layers (--num-layers) cuts the model for benchmarks on random weights: add "
                             "--load-format dummy, or write a reduced-depth checkpoint with `openinfer synth "
                             "--num-layers`")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
        if self.kv_offload and self.kv_offload_host_gib <= 0:
            raise ValueError("kv_offload_host_gib must be > 0")
        if self.kv_offload and not self.enable_prefix_caching:
            raise ValueError("kv_offload needs the prefix cache: it restores evicted prefix-cache blocks")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling_policy {self.scheduling_policy!r}: use fcfs or priority")
        if self.generation_config not in ("auto", "none"):
            raise ValueError(f"unknown generation_config {self.generation_config!r}: use auto or none")
        if self.ep < 1:
            raise ValueError("ep must be >= 1")
        if self.ep > 1 and self.kv_offload:
            raise ValueError("kv_offload is not available with expert parallelism (ep > 1): every rank holds the KV "
                             "cache, and the host tier saves and restores rank 0's only; serve without one of them")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")


def add_kernel_option(p: argparse.ArgumentParser) -> None:
    """`--kernel OP=IMPL`, repeatable: EngineArgs.kernels (through kernels.registry.parse_kernel_overrides)."""
    p.add_argument("--kernel", action="append", default=[], metavar="OP=IMPL",
                   help="give op OP the kernel implementation named IMPL instead of the registry's choice; repeat "
                        "for several ops (`openinfer plugins --plan MODEL` lists each op's implementations)")


def parse_hf_overrides(text: str) -> dict[str, Any]:
    """`--hf-overrides JSON`: a JSON object of config.json fields (EngineArgs.hf_overrides)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): pass a JSON object of config.json fields, e.g. "
                                         "'{\"max_position_embeddings\": 32768}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of config.json fields, got {text!r}")
    return value


def add_kv_cache_dtype_option(p: argparse.ArgumentParser) -> None:
    """`--kv-cache-dtype`: EngineArgs.kv_cache_dtype."""
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="fp8: keep attention keys and values as e4m3 bytes (saturating at +-448, no scale), half the "
                        "memory and decode reads of the model dtype; outputs change by fp8 rounding (lines whose "
                        "kernels read it: qwen3, qwen3.5; CUDA needs bf16 and sm_89+)")


def add_hf_overrides_option(p: argparse.ArgumentParser) -> None:
    """`--hf-overrides JSON`: EngineArgs.hf_overrides (loading.config.with_overrides applies them)."""
    p.add_argument("--hf-overrides", type=parse_hf_overrides, default={}, metavar="JSON",
                   help="a JSON object of config.json fields set before the model line reads the config (an object "
                        "value merges into the field's object), e.g. '{\"max_position_embeddings\": 65536}'")
