"""Tiny random-weight reference checkpoints built with transformers (test dependency only)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np


def build_hf_checkpoint(out_dir: Path, model_type: str, config: Mapping[str, Any], *, seed: int = 0,
                        init_std: float = 0.1, save_dtype: str = "float32", tokenizer_dir: Path | None = None,
                        auto_class: str = "AutoModelForCausalLM", adjust: Callable[[Any], None] | None = None):
    """Build `auto_class` (e.g. AutoModelForImageTextToText for a checkpoint in a VL layout) from
    a config dict with random weights (1-D params perturbed around 1 so norms are not trivially
    identity; `adjust(model)` may then reset some under no_grad), save it as safetensors and
    return the float32 torch model for reference runs."""
    import torch
    import transformers
    from transformers import AutoConfig

    auto = getattr(transformers, auto_class)
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, initializer_range=init_std, **dict(config))
    model = auto.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        if adjust is not None:
            adjust(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    if save_dtype == "float32":
        model.save_pretrained(out_dir)
    else:
        model.to(getattr(torch, save_dtype)).save_pretrained(out_dir)
        model = auto.from_pretrained(out_dir, dtype=torch.float32).eval()
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name != "NOTICE":
                shutil.copy(f, out_dir / f.name)
    return model


def checkpoint_linears(model) -> Iterator[tuple[str, Any]]:
    """(checkpoint module name, the torch tensor holding its [out, in] weight) of every Linear of `model` and every
    routed expert's: transformers 5 keeps a layer's experts fused (gate_up [E, 2I, D] with the gate rows first,
    down [E, D, I]), the checkpoint names them per expert ({experts}.{e}.gate_proj / up_proj / down_proj)."""
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("Experts"):
            inter = mod.down_proj.shape[-1]
            for e in range(mod.gate_up_proj.shape[0]):
                yield f"{name}.{e}.gate_proj", mod.gate_up_proj.data[e, :inter]
                yield f"{name}.{e}.up_proj", mod.gate_up_proj.data[e, inter:]
                yield f"{name}.{e}.down_proj", mod.down_proj.data[e]
        elif type(mod).__name__ == "Linear":
            yield name, mod.weight.data


def hf_logits(model, ids: list[int]) -> np.ndarray:
    """float32 logits [T, vocab] of one prompt, on the model's own device."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0].float().cpu().numpy()


def hf_greedy(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate`. The attention mask is passed explicitly: generate would otherwise
    infer one from pad_token_id and mask every prompt token equal to it (a tokenizer whose BOS is id 0)."""
    import torch
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def hf_greedy_stepwise(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding by calling the model's forward with its own cache, one token at a time.
    For Qwen3.5, transformers 5.24's `generate` diverges from the model's forward from the first
    token (its generation-time cache mishandles the hybrid layers), while this loop equals full
    recomputation. Runs on the model's device; the cache keyword is `cache` from transformers
    5.2x (`past_key_values` still accepted there, with a warning) and `past_key_values` before."""
    import inspect

    import torch
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = []
    with torch.no_grad():
        step = model(torch.tensor([ids], device=model.device), use_cache=True)
        for _ in range(max_new_tokens):
            out.append(int(step.logits[0, -1].argmax()))
            step = model(torch.tensor([[out[-1]]], device=model.device), use_cache=True,
                         **{key: step.past_key_values})
    return out


def assert_within_bf16_noise(ours: np.ndarray, ref32: np.ndarray, ref16: np.ndarray, factor: float = 2.0) -> None:
    """bf16 logits `ours` against transformers in float32 (`ref32`), with transformers' own bf16 run
    (`ref16`) as the yardstick: a deep or recurrent tiny model drifts in bf16 by more than any fixed
    tolerance, so ours may differ from float32 by at most `factor` times what torch's bf16 kernels do
    (RMS and max), and pick the float32 top-1 token about as often as they do."""
    def rms(x: np.ndarray) -> float:
        return float(np.sqrt(np.mean(np.square(x))))

    ours_rms, hf_rms = rms(ours - ref32), rms(ref16 - ref32)
    ours_max, hf_max = float(np.abs(ours - ref32).max()), float(np.abs(ref16 - ref32).max())
    ours_top1 = float((ours.argmax(-1) == ref32.argmax(-1)).mean())
    hf_top1 = float((ref16.argmax(-1) == ref32.argmax(-1)).mean())
    report = (f"vs float32: ours RMS {ours_rms:.4f} max {ours_max:.3f} top-1 {ours_top1:.3f}; "
              f"transformers bf16 RMS {hf_rms:.4f} max {hf_max:.3f} top-1 {hf_top1:.3f}")
    assert ours_rms <= factor * hf_rms and ours_max <= factor * hf_max, report
    assert ours_top1 >= hf_top1 - 0.05, report
    print(report)
