"""DeepSeek-V2's chat format: the checkpoints' template rendered by the engine's tokenizer, plain output
(no reasoning, no tool calls), and messages the template has no place for refused, not dropped."""
from __future__ import annotations

import pytest

from openinfer.plugin_api import ChatTemplateError, Tokenizer
from openinfer_deepseek_v2_lite.chat import DEEPSEEK_V2_CHAT_FORMAT

from dsv2_tiny import BOS, EOS


def test_template_renders_the_deepseek_v2_turns(tokenizer_dir):
    tok = Tokenizer.from_dir(tokenizer_dir)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    text = tok.apply_chat_template(DEEPSEEK_V2_CHAT_FORMAT.template_messages(messages), add_generation_prompt=True)
    assert text == f"{BOS}You are terse.\n\nUser: hi\n\nAssistant: hello{EOS}User: again\n\nAssistant:"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id == 0 and ids.count(1) == 1 and tok.eos_token_ids == frozenset({1})
    assert tok.apply_chat_template(messages[1:2], add_generation_prompt=False) == f"{BOS}User: hi\n\n"


def test_output_is_plain_content():
    text = " Two, three and five. <think>not a tag here</think> <tool_call>{}</tool_call>"
    out = DEEPSEEK_V2_CHAT_FORMAT.parse("User: hi\n\nAssistant:", text)
    assert out.content == text and out.reasoning == "" and not out.tool_calls
    assert not DEEPSEEK_V2_CHAT_FORMAT.reasoning_ahead("User: hi\n\nAssistant:")
    assert DEEPSEEK_V2_CHAT_FORMAT.forced_tool_call("User: hi\n\nAssistant:", None) is None


@pytest.mark.parametrize("message, error", [
    ({"role": "tool", "content": "22 C", "tool_call_id": "a"}, r"messages\[1\]: role 'tool' is not supported"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function",
                                                           "function": {"name": "f", "arguments": "{}"}}]},
     r"messages\[1\]: tool_calls are not supported"),
])
def test_messages_the_template_cannot_hold_are_refused(message, error):
    with pytest.raises(ChatTemplateError, match=error):
        DEEPSEEK_V2_CHAT_FORMAT.template_messages([{"role": "user", "content": "hi"}, message])
