"""A kit for plugin authors: tiny reference models, full-sequence logits, engine drivers.

Importing this package is cheap; torch/transformers are imported only inside the functions
that build reference models (they are test dependencies, never runtime ones).

With `openinfer.plugin_api`, this package is all a plugin's tests import from the core: the engine and its
arguments, detection and the plugin set, checkpoints (real, dummy, synthesized), sampling parameters and prefix-cache
block hashes are re-exported here; the CUDA helpers are in `testing.cuda` and `testing.launch_check`.
"""
from __future__ import annotations

from ..backends import NumpyBackend
from ..loading.config import read_model_config
from ..contract.detect import detect_line
from ..engine.engine import Engine, EngineArgs, build_engine
from ..kv.block_manager import block_hashes
from ..kv.pool import bytes_per_block
from ..loading.loader import LoadError, load_rank, read_source
from ..loading.memory_plan import memory_need
from ..contract.plugins import get_plugins
from ..sampling.sampler import SamplingParams
from ..quant import Fp8Weight, Int4Weight, pack_int4, quantize_fp8, quantize_int4, row_scales, unpack_int4
from ..loading.config import with_num_layers
from ..loading.synth import synthesize
from ..loading.weights import Checkpoint, DummyWeights, save_safetensors

__all__ = ["Checkpoint", "DummyWeights", "Engine", "EngineArgs", "Fp8Weight", "Int4Weight", "LoadError", "ModelHost",
           "NumpyBackend", "SamplingParams", "block_hashes", "build_engine", "bytes_per_block", "create_app",
           "detect_line", "get_plugins", "load_rank", "memory_need", "pack_int4", "quantize_fp8", "quantize_int4",
           "read_model_config", "read_source", "row_scales", "save_safetensors", "synthesize", "unpack_int4",
           "with_num_layers"]


def __getattr__(name: str):
    """The server's ModelHost and create_app, imported on first use (they pull in starlette)."""
    if name in ("ModelHost", "create_app"):
        from .. import server
        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
