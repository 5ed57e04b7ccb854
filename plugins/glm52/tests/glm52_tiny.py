"""The tiny GLM-5.2 shape the tests build (a module of its own: this folder's conftest is not importable by name
when the whole suite runs, since another plugin's conftest may be found first)."""

# hidden 64, 4 layers (0 dense, 1-3 MoE), indexer full, full, shared, full; index_topk 4 < every prompt
TINY = dict(vocab_size=768, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            routed_scaling_factor=2.5, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16, index_topk=4,
            index_topk_freq=2, index_skip_topk_offset=2, rms_norm_eps=1e-5, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 8e6}, tie_word_embeddings=False)

# GLM-5-FP8's quantization_config: no modules_to_not_convert, so the indexer's weights_proj is kept in float by
# the rule transformers applies to every quantized GLM-5 (_keep_in_fp32_modules), not by the checkpoint's list
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _fp8_targets(model):
    """(checkpoint module name, torch [out, in] weight) of every Linear GLM-5-FP8 stores in FP8: all but lm_head,
    the router (not a Linear) and the indexer's weights_proj."""
    from openinfer.testing.hf_reference import checkpoint_linears
    return ((name, w) for name, w in checkpoint_linears(model)
            if name != "lm_head" and not name.endswith("weights_proj"))


def quantize_fp8_in_place(model) -> dict:
    """Replace each FP8 Linear's weight by its dequantized value (the reference's weights); returns
    {module: (e4m3 bytes, weight_scale_inv)} for write_fp8_checkpoint."""
    import torch

    from openinfer.testing import Fp8Weight, quantize_fp8, row_scales
    codes = {}
    with torch.no_grad():
        for name, weight in _fp8_targets(model):
            data, scale_inv = quantize_fp8(weight.float().numpy())
            weight.copy_(torch.from_numpy(Fp8Weight(data, row_scales(scale_inv, weight.shape[0])).dequant()))
            codes[name] = (data, scale_inv)
    return codes


def write_fp8_checkpoint(ref_dir, codes: dict, quant: dict = FP8_QUANT) -> None:
    """Turn the saved reference in `ref_dir` (dequantized weights) into the FP8 checkpoint in place: the codes'
    Linears as `weight` F8_E4M3 + `weight_scale_inv` F32, and the config's quantization_config."""
    import json

    import torch
    from safetensors.torch import load_file, save_file
    config = json.loads((ref_dir / "config.json").read_text())
    (ref_dir / "config.json").write_text(json.dumps({**config, "quantization_config": quant}, indent=1))
    tensors = load_file(str(ref_dir / "model.safetensors"))
    for name, (data, scale_inv) in codes.items():
        assert name + ".weight" in tensors, f"{name}: not a checkpoint tensor"
        tensors[name + ".weight"] = torch.from_numpy(data).view(torch.float8_e4m3fn)
        tensors[name + ".weight_scale_inv"] = torch.from_numpy(scale_inv)
    save_file(tensors, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
