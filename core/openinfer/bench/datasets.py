"""Synthetic workloads: vLLM's random dataset (exact token lengths, optional shared prefix) and a
multi-turn agent dataset whose conversations grow turn by turn (see multiturn.py for the growth)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Used for chat text when no tokenizer is given: common words are close to one token each in BPE vocabularies.
_WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be or has had "
    "not first one their its new after who they two her she been other when there all during into school "
    "time may years more most only over city some world would where later up such used many can state "
    "about national out known university united then made"
).split()


@dataclass
class BenchRequest:
    """One request as the client sends it: a completions prompt (token ids or text) or chat messages."""

    prompt: list[int] | str | None
    prompt_len: int
    output_len: int
    messages: list[dict[str, Any]] | None = None


@dataclass
class Conversation:
    """A multi-turn conversation: a system prefix shared by all conversations, then one user text per turn."""

    system: list[int] | str
    user_turns: list[list[int] | str]
    output_len: int


def load_tokenizer(path: str | None) -> Any:
    """A HF `tokenizers.Tokenizer` from a model directory or a tokenizer.json file, or None."""
    if not path:
        return None
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {p}")
    return Tokenizer.from_file(str(p))


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


class PromptMaker:
    """Token-id sequences of an exact length, and text that tokenizes back to that length."""

    def __init__(self, rng: np.random.Generator, vocab_size: int, tokenizer: Any = None) -> None:
        self.rng = rng
        self.tokenizer = tokenizer
        special: set[int] = set()
        if tokenizer is not None:
            vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
            special = set(tokenizer.get_added_tokens_decoder())
        # Special tokens (EOS, chat markers) would change how the model and the server treat a prompt.
        self.allowed = np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)

    def ids(self, length: int) -> list[int]:
        # Independent random ids, not vLLM's "random offset + consecutive ids": with those, two of N prompts
        # share an offset (and so are identical, a false prefix-cache hit) with probability ~N^2/(2*vocab).
        return self.allowed[self.rng.integers(0, len(self.allowed), length)].tolist()

    def text(self, length: int, prefix: str = "") -> tuple[str, int]:
        """`prefix` + text of `length` more tokens, and its measured token count. Like vLLM, decode random ids
        and repair (drop or add ids at the end) until the whole tokenizes to the target: tokens can merge
        at the seam with the prefix and across decoded ids."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError("text prompts of an exact token length need --tokenizer")
        target = (count_tokens(tok, prefix) if prefix else 0) + length
        ids = self.ids(length)
        for _ in range(10):
            text = prefix + tok.decode(ids)
            n = count_tokens(tok, text)
            if n == target:
                break
            if n > target:
                ids = ids[: max(len(ids) - (n - target), 0)]
            else:
                ids += self.allowed[self.rng.integers(0, len(self.allowed), target - n)].tolist()
        return text, n

    def words(self, length: int) -> str:
        """Approximate-length text without a tokenizer (chat turns only; the server reports the true count)."""
        return " ".join(_WORDS[i] for i in self.rng.integers(0, len(_WORDS), length))


def sample_lengths(rng: np.random.Generator, n: int, length: int, range_ratio: float) -> np.ndarray:
    """Uniform integers in [L(1-r), L(1+r)] like vLLM's random dataset (r=0 gives exactly L)."""
    low, high = int(length * (1 - range_ratio)), int(length * (1 + range_ratio))
    return rng.integers(max(low, 1), max(high, 1) + 1, size=n)


def random_requests(
    maker: PromptMaker,
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    prompt_format: str = "ids",
) -> list[BenchRequest]:
    """`prompt_format`: "ids" (token-id list for /v1/completions), "text" (completions text) or "chat"."""
    in_lens = sample_lengths(maker.rng, n, input_len, range_ratio)
    out_lens = sample_lengths(maker.rng, n, output_len, range_ratio)
    if prompt_format == "ids":
        prefix = maker.ids(prefix_len)
        return [BenchRequest(prefix + maker.ids(int(i)), prefix_len + int(i), int(o)) for i, o in zip(in_lens, out_lens)]
    prefix_text = maker.text(prefix_len)[0] if prefix_len else ""
    out: list[BenchRequest] = []
    for i, o in zip(in_lens, out_lens):
        text, n_tok = maker.text(int(i), prefix_text)
        if prompt_format == "chat":
            out.append(BenchRequest(None, n_tok, int(o), messages=[{"role": "user", "content": text}]))
        else:
            out.append(BenchRequest(text, n_tok, int(o)))
    return out


def multi_turn_conversations(
    maker: PromptMaker,
    n: int,
    turns: int,
    system_len: int,
    user_len: int,
    output_len: int,
    as_text: bool,
) -> list[Conversation]:
    """`as_text` makes text turns (chat): exact-length with a tokenizer, approximate words without one."""

    def part(length: int) -> list[int] | str:
        if not as_text:
            return maker.ids(length)
        if length == 0:
            return ""
        return maker.text(length)[0] if maker.tokenizer is not None else maker.words(length)

    system = part(system_len)  # one shared system prefix: the cross-conversation cache hit
    return [Conversation(system, [part(user_len) for _ in range(turns)], output_len) for _ in range(n)]
