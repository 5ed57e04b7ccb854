"""Sampling: SamplingParams and the host sampler, the device sampler's packed inputs and its numpy reference, the
Philox generator, and grammar constraints (structured outputs)."""
