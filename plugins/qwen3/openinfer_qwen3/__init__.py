"""openinfer-qwen3: the Qwen3 dense model line (Qwen3-4B, 8B and friends)."""
