"""DeepSeek-V2's chat format: plain turns, no reasoning block and no tool-call syntax.

The checkpoints' template (tokenizer_config.json) renders
`{bos}{system}\\n\\nUser: {u}\\n\\nAssistant: {a}{eos}User: ...\\n\\nAssistant:`; it has no place for tool
calls or tool results, so messages carrying them are refused instead of being dropped from the prompt.
"""
from __future__ import annotations

from openinfer.plugin_api import ChatFormat, ChatTemplateError

ROLES = ("system", "user", "assistant")


class DeepseekV2ChatFormat(ChatFormat):
    def template_messages(self, messages: list[dict]) -> list[dict]:
        for i, m in enumerate(messages):
            if m.get("role") not in ROLES:
                raise ChatTemplateError(f"messages[{i}]: role {m.get('role')!r} is not supported by DeepSeek-V2's "
                                        f"chat template ({', '.join(ROLES)}); it has no tool messages")
            if m.get("tool_calls"):
                raise ChatTemplateError(f"messages[{i}]: tool_calls are not supported by DeepSeek-V2's chat "
                                        "template (the model has no tool-call format)")
        return messages


DEEPSEEK_V2_CHAT_FORMAT = DeepseekV2ChatFormat(assistant_prefix="Assistant:")
