"""Writes a small Kimi tokenizer folder (the Kimi tests' own: tiktoken ranks trained on a fixed text, Kimi's special
tokens and chat template) for benchmarks of the kimi-k2 presets with --load-format dummy, whose token ids are random:
the line ships no tokenizer, and a preset needs one to load.
    python scripts/kimi_tokenizer.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/kimi_k2/tests"))
from kimi_tiny import CORPUS, RANKS, tokenizer_config, train_ranks, write_ranks  # noqa: E402
from openinfer_kimi_k2.tokenizer import KIMI_PATTERN  # noqa: E402


def main(out: Path) -> None:
    ranks = train_ranks(CORPUS, KIMI_PATTERN, RANKS - 256)
    out.mkdir(parents=True, exist_ok=True)
    write_ranks(out / "tiktoken.model", ranks)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(len(ranks)), ensure_ascii=False))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": len(ranks) + 2}))   # <|im_end|>
    print(f"wrote a Kimi tokenizer ({len(ranks)} ranks) to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
