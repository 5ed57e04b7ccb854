"""The tiny GLM-5.2 shape the tests build (a module of its own: this folder's conftest is not importable by name
when the whole suite runs, since another plugin's conftest may be found first)."""

# hidden 64, 4 layers (0 dense, 1-3 MoE), indexer full, full, shared, full; index_topk 4 < every prompt
TINY = dict(vocab_size=768, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            routed_scaling_factor=2.5, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16, index_topk=4,
            index_topk_freq=2, index_skip_topk_offset=2, rms_norm_eps=1e-5, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 8e6}, tie_word_embeddings=False)
