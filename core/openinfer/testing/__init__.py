"""A kit for plugin authors: tiny reference models, full-sequence logits, engine drivers.

Importing this package is cheap; torch/transformers are imported only inside the functions
that build reference models (they are test dependencies, never runtime ones).

With `openinfer.plugin_api`, this package is all a plugin's tests import from the core: the engine and its
arguments, detection and the plugin set, checkpoints (real, dummy, synthesized), sampling parameters and prefix-cache
block hashes are re-exported here; the CUDA helpers are in `testing.cuda` and `testing.launch_check`.
"""
from __future__ import annotations

from ..detect import detect_line
from ..engine import Engine, EngineArgs, build_engine
from ..kv.block_manager import block_hashes
from ..loader import LoadError
from ..plugins import get_plugins
from ..sampling import SamplingParams
from ..synth import synthesize
from ..weights import Checkpoint, DummyWeights, save_safetensors

__all__ = ["Checkpoint", "DummyWeights", "Engine", "EngineArgs", "LoadError", "SamplingParams", "block_hashes",
           "build_engine", "detect_line", "get_plugins", "save_safetensors", "synthesize"]
