"""A kit for plugin authors: tiny reference models, full-sequence logits, engine drivers.

Importing this package is cheap; torch/transformers are imported only inside the functions
that build reference models (they are test dependencies, never runtime ones).

With `openinfer.plugin_api`, this package is all a plugin's tests import from the core: the engine and its
arguments, detection and the plugin set, checkpoints (real, dummy, synthesized), sampling parameters and prefix-cache
block hashes are re-exported here; the CUDA helpers are in `testing.cuda` and `testing.launch_check`.
"""
from __future__ import annotations

from ..backends import NumpyBackend
from ..config import read_model_config
from ..detect import detect_line
from ..engine import Engine, EngineArgs, build_engine
from ..kv.block_manager import block_hashes
from ..kv.pool import bytes_per_block
from ..loader import LoadError
from ..plugins import get_plugins
from ..sampling import SamplingParams
from ..synth import synthesize
from ..weights import Checkpoint, DummyWeights, save_safetensors

__all__ = ["Checkpoint", "DummyWeights", "Engine", "EngineArgs", "LoadError", "NumpyBackend", "SamplingParams",
           "block_hashes", "build_engine", "bytes_per_block", "detect_line", "get_plugins", "read_model_config",
           "save_safetensors", "synthesize"]
