"""openinfer-qwen35: the Qwen3.5 model line (Qwen3.5-4B, 9B, 27B)."""
