"""The Hugging Face transformers peer on the same GPU and weights (benchmark reference, not serving).

Times, for a checkpoint folder, in bf16 with sdpa attention: one forward over a 1k and a 16k prompt
(cold prefill TTFT, logits of the last row only), and decode TPOT with `generate` at batch 1 and 32
over 1k-token prompts (the default dynamic cache: transformers' out-of-the-box fast path without a
compile warm-up). Also the teacher-forced top-1 agreement of openinfer's logits with transformers'
on random sequences (when openinfer's CUDA engine can load the folder). Prints JSON.
--preset NAME instead of a folder: the preset's shape (`openinfer synth --list`), weights drawn at random on the
GPU (a shape's timings, without writing and loading a checkpoint).

    python scripts/hf_peer.py MODEL_DIR [--agreement]
    python scripts/hf_peer.py --preset deepseek-v2-lite
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def timed(fn, repeats: int = 3) -> float:
    """Median seconds of `fn` after one warm-up call, between CUDA syncs."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--preset", help="a preset shape with random weights, instead of MODEL_DIR")
    ap.add_argument("--agreement", action="store_true")
    a = ap.parse_args()
    if a.preset:
        model = random_model(a.preset)
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.cuda().eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    with torch.no_grad():
        for n in (1024, 16384):
            ids = torch.tensor(rng.integers(0, vocab, (1, n)), device="cuda")
            out[f"prefill_{n}_ms"] = 1e3 * timed(lambda: model(ids, logits_to_keep=1))
        for batch in (1, 32):
            ids = torch.tensor(rng.integers(0, vocab, (batch, 1024)), device="cuda")

            def gen(k: int) -> None:
                model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0)
            short, long_ = timed(lambda: gen(2), 1), timed(lambda: gen(34), 1)
            out[f"decode_b{batch}_tpot_ms"] = 1e3 * (long_ - short) / 32
        if a.agreement:
            out.update(agreement(model, a.model, vocab, rng))
    print(json.dumps(out))


def random_model(preset: str) -> torch.nn.Module:
    """transformers' model of a preset's config, its weights initialised at random on the GPU."""
    from openinfer.contract.plugins import get_plugins
    line = next(l for l in get_plugins().lines.values() if preset in l.presets)
    config = dict(line.presets[preset])
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")


def agreement(model, path: str, vocab: int, rng: np.random.Generator) -> dict[str, float]:
    """Teacher-forced top-1 agreement on 4 random 512-token sequences, openinfer vs transformers (bf16)."""
    from openinfer.engine.engine import EngineArgs, build_engine
    from openinfer.testing.engine import prompt_logits
    eng = build_engine(path, EngineArgs(device="cuda", kv_cache_memory_gib=2, max_num_seqs=4, enforce_eager=True))
    same = total = 0
    for _ in range(4):
        ids = rng.integers(0, vocab, 512).tolist()
        ours = prompt_logits(eng, ids).argmax(1)
        ref = model(torch.tensor([ids], device="cuda")).logits[0].float().argmax(1).cpu().numpy()
        same += int((ours == ref).sum())
        total += len(ids)
    return {"top1_agreement": same / total, "agreement_tokens": total}


if __name__ == "__main__":
    main()
