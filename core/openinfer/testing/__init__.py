"""A kit for plugin authors: tiny reference models, full-sequence logits, engine drivers.

Importing this package is cheap; torch/transformers are imported only inside the functions
that build reference models (they are test dependencies, never runtime ones).
"""
