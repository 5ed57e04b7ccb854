"""Scoring a prompt on the GPU at a real shape (prompt logprobs, dummy weights): the time to the first token of one
request with and without prompt_logprobs (medians of 7), for max_num_seqs (the rows a step scores) 64 and 256, and sanity of the
scores (every logprob <= 0, ranks >= 1, a rank-1 token's logprob equal to its top-1 alternative's).

    python scripts/gpu_prompt_logprobs.py [--model qwen3-4b] [--tokens 1024]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.engine.request import PromptLogprobs, Tokens
from openinfer.sampling.sampler import SamplingParams


def first_token_ms(engine, prompt: list[int], k: int | None) -> tuple[float, list]:
    t0 = time.perf_counter()
    stream = engine.submit(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k))
    scored = []
    while engine.has_unfinished():
        engine.step()
        for ev in stream.drain():
            if isinstance(ev, PromptLogprobs):
                scored = ev.samples
            if isinstance(ev, Tokens):
                ms = 1e3 * (time.perf_counter() - t0)
    return ms, scored


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--max-num-seqs", default="64,256")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'max_num_seqs':>12} {'rows/step':>9} {'plain ms':>9} {'scored ms':>10} {'k':>3}  sanity")
    for seqs in map(int, a.max_num_seqs.split(",")):
        engine = build_engine(a.model, EngineArgs(device="cuda", load_format="dummy", max_model_len=4096,
                                                  max_num_seqs=seqs, enable_prefix_caching=False, kv_cache_memory_gib=4))
        engine.runner.backend.activate()
        prompt = rng.integers(0, engine.vocab_size, a.tokens).tolist()
        for k in (None, 1, 5):   # warm-up of each path
            first_token_ms(engine, prompt, k)
        plain = np.median([first_token_ms(engine, prompt, None)[0] for _ in range(7)])
        for k in (1, 5):
            runs = [first_token_ms(engine, prompt, k) for _ in range(7)]
            s = runs[0][1]
            ok = (len(s) == a.tokens - 1 and all(r.logprob <= 0 and r.rank >= 1 for r in s)
                  and all(abs(r.logprob - r.top[0][1]) < 1e-3 for r in s if r.rank == 1)
                  and [r.token for r in s] == prompt[1:])
            print(f"{seqs:>12} {engine.scheduler.max_score_rows:>9} {plain:>9.2f} {np.median([r[0] for r in runs]):>10.2f} {k:>3}  {'ok' if ok else 'FAILED'}")
        del engine


if __name__ == "__main__":
    main()
