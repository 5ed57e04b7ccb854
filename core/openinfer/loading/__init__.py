"""Bringing a model up: checkpoint config and weights, the memory plan, the loader that builds an Engine, random
checkpoints (synth), start-up phases, the early CUDA context and the on-disk cache."""
