"""The tiny DeepSeek-V2 test models' configs and tokenizer (a module of its own name: every plugin's tests
have a conftest, so `from conftest import` would find another plugin's when the suite runs together)."""
from __future__ import annotations

# tokenizer_config.json's chat_template of deepseek-ai/DeepSeek-V2-Lite-Chat (and V2-Chat)
CHAT_TEMPLATE = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
                 "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                 "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
                 "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
                 "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TOKENIZER_CONFIG = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
                    "pad_token": EOS, "chat_template": CHAT_TEMPLATE, "tokenizer_class": "LlamaTokenizerFast",
                    "model_max_length": 16384}
VOCAB = 400

# models.md §5.4, with a third layer so two MoE layers follow the dense one
TINY = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
            first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
            vocab_size=VOCAB, max_position_embeddings=2560, rope_theta=10000.0, rms_norm_eps=1e-6,
            rope_scaling={"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                          "mscale_all_dim": 0.707, "original_max_position_embeddings": 64},
            bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
# the full V2 / V2.5 structure: q-LoRA and group-limited routing (8 experts in 4 groups, 2 groups kept)
FULL = dict(TINY, q_lora_rank=24, topk_method="group_limited_greedy", n_group=4, topk_group=2,
            routed_scaling_factor=2.5)
