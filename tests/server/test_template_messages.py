"""ChatFormat.template_messages: a model line's message rewrite reaches the template on every route."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from fake_engine import FakeEngine
from openinfer.text.parsers import ChatFormat
from openinfer.text.tokenizer import ChatTemplateError
from openinfer_qwen3.chat import QWEN3_CHAT_FORMAT


@dataclass(frozen=True)
class ShoutingFormat(ChatFormat):
    def template_messages(self, messages: list[dict]) -> list[dict]:
        if any(m.get("content") == "refuse" for m in messages):
            raise ChatTemplateError("refused by the model line")
        return [{**m, "content": m["content"].upper()} for m in messages]


def test_default_is_identity() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert ChatFormat().template_messages(messages) is messages


def test_tokenize_and_chat_use_it(http: httpx.Client, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake, "chat_format", ShoutingFormat(QWEN3_CHAT_FORMAT.reasoning_parser,
                                                            QWEN3_CHAT_FORMAT.tool_parser))
    expected = fake.tokenizer.encode(fake.tokenizer.apply_chat_template([{"role": "user", "content": "HI"}]))
    r = http.post("/tokenize", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
    assert r.json()["tokens"] == expected
    http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 1})
    assert fake.submitted[-1][1] == expected
    for path in ("/tokenize", "/v1/chat/completions"):
        r = http.post(path, json={"model": "fake", "messages": [{"role": "user", "content": "refuse"}]})
        assert r.status_code == 400 and "refused by the model line" in r.json()["error"]["message"]
