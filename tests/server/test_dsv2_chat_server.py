"""The DeepSeek-V2 line behind the real server: a tiny synthesized checkpoint (openinfer synth's tiny
preset, a tiny tokenizer with the checkpoints' chat template) served to the openai client. A chat turn is
the engine's greedy continuation of the rendered prompt; a tool message and tools are 400s naming them."""
from __future__ import annotations

import shutil
from typing import Iterator

import openai
import pytest

from openinfer.engine.engine import Engine, EngineArgs, build_engine
from openinfer.server import ModelHost
from openinfer.loading.synth import synthesize
from openinfer.testing.engine import generate, greedy
from openinfer.testing.tokenizers import tiny_bpe_tokenizer_dir
from server_harness import LiveServer

pytest.importorskip("openinfer_deepseek_v2_lite")

TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
            "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
            "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
            "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER = [{"role": "user", "content": "Name three prime numbers."}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("dsv2-served")
    synthesize("deepseek-v2-lite-tiny", out, dtype="F32")
    tok = tiny_bpe_tokenizer_dir(tmp_path_factory.mktemp("dsv2-tok"), [BOS, EOS],
                                 {"bos_token": BOS, "eos_token": EOS, "chat_template": TEMPLATE})
    for f in tok.iterdir():
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def engine(checkpoint) -> Iterator[Engine]:
    e = build_engine(str(checkpoint), EngineArgs(max_model_len=512)).start()
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    with LiveServer(ModelHost({"dsv2": engine})) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def test_chat_turn_is_the_greedy_continuation(client: openai.OpenAI, engine: Engine, checkpoint) -> None:
    r = client.chat.completions.create(model="dsv2", messages=USER, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    text = engine.tokenizer.apply_chat_template(USER, add_generation_prompt=True)
    assert text == f"{BOS}User: Name three prime numbers.\n\nAssistant:"
    ids = engine.tokenizer.encode(text)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 8
    [(want, _, _)] = generate(build_engine(str(checkpoint), EngineArgs(max_model_len=512)), [ids], greedy(8))
    assert r.choices[0].message.content == engine.tokenizer.decode(want)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"


def test_a_tool_message_is_refused_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]: role 'tool' is not supported"):
        client.chat.completions.create(model="dsv2", max_tokens=4, messages=USER + [
            {"role": "tool", "content": "2, 3, 5", "tool_call_id": "a"}])


def test_tools_are_refused_naming_the_field(client: openai.OpenAI) -> None:
    """The line has no tool-call format: tools would reach neither the template nor an output parser."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="dsv2", max_tokens=4, messages=USER, tools=tools, tool_choice=choice)
        assert e.value.body["param"] == ("tools" if choice == "auto" else "tool_choice")
    r = client.chat.completions.create(model="dsv2", max_tokens=2, messages=USER, tools=tools, tool_choice="none")
    assert r.usage.completion_tokens >= 1
