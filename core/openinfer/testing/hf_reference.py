"""Tiny random-weight reference checkpoints built with transformers (test dependency only)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def build_hf_checkpoint(out_dir: Path, model_type: str, config: Mapping[str, Any], *, seed: int = 0,
                        init_std: float = 0.1, save_dtype: str = "float32", tokenizer_dir: Path | None = None):
    """Build `AutoModelForCausalLM` from a config dict with random weights (1-D params perturbed
    around 1 so norms are not trivially identity), save it as safetensors and return the
    float32 torch model for reference runs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, initializer_range=init_std, **dict(config))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    out_dir.mkdir(parents=True, exist_ok=True)
    if save_dtype == "float32":
        model.save_pretrained(out_dir)
    else:
        model.to(getattr(torch, save_dtype)).save_pretrained(out_dir)
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name != "NOTICE":
                shutil.copy(f, out_dir / f.name)
    return model


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids: list[int], max_new_tokens: int) -> list[int]:
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()
