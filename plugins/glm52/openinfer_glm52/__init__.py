"""openinfer-glm52: the GLM-5 / GLM-5.1 / GLM-5.2 model line (MLA + DeepSeek Sparse Attention + MoE)."""
