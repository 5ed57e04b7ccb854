"""openinfer-deepseek-v2-lite: the DeepSeek-V2 model line (V2-Lite, V2-Lite-Chat, V2, V2-Chat, V2.5)."""
