"""Kimi-K2 (and DeepSeek-V3) model line for openinfer."""
