"""Request parsing and validation for every endpoint: honour each field or reject it by name.

Accepted and ignored: the OpenAI metadata in fields.IGNORED. Accepted only at their no-op
value (anything else is a 400): `best_of` 1, `suffix`, `use_beam_search` false, `length_penalty` 1,
`modalities` ["text"] — we have no beam search or suffix insertion. Chat's `parallel_tool_calls` false keeps the first
call only; `reasoning_effort` none or minimal turns thinking off and the other efforts leave it on, on a line that
reasons (a 400 naming it on one that does not, where only "none" is accepted). vLLM's `priority`
orders admission under `--scheduling-policy priority`; the engine refuses a value other than 0 under fcfs.
Chat's `continue_final_message` (with `add_generation_prompt` false) ends the prompt
inside the final message, as transformers renders it, for the model to continue.
Prompt logprobs: completions' `echo` puts the prompt before the text, and with `logprobs` its tokens
before the completion's in `logprobs` (the first prompt token's entries null), as lm-eval's loglikelihood
tasks read them (`max_tokens` 0 scores the prompt alone, as older lm-eval asks; 0 is a 400 otherwise);
vLLM's `prompt_logprobs` (0-20, both endpoints, not streamed) returns vLLM's list
(null, then {token id: {logprob, rank, decoded_token}} per prompt token: the token and the top k), per
choice on completions and once per response on chat. Scored prompts skip the prefix cache: a cached
token has no logits.
`response_format` (both endpoints, as in vLLM): {"type": "text"}; {"type": "json_object"} (any JSON
object); {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}} — the
schema is always enforced, `strict` or not, by constrained decoding (sampling/structured.py): the content is
valid JSON matching it unless max_tokens (or a stop string) cuts it, and finish_reason is "stop" once
it is complete. A malformed format or a schema llguidance rejects is a 400 naming `response_format`.
On a reasoning line the grammar applies to the answer, after the reasoning block; where the model may open
the block itself, its first token is the grammar's or the opener (one that answers at once is constrained).
vLLM's `structured_outputs` (one of json, regex, choice, grammar (Lark or GBNF), json_object) is honoured the
same way, a 400 naming it when malformed or given with response_format; its other keys and the older `guided_*`
are 400s.
Logprobs are those of the masked distribution.
`tool_choice` "required" or a named function ends the prompt with the line's tool-call opener (and the
function's name), so the output is that call. Where the line gives a grammar for its calls
(ChatFormat.tool_call_grammar; Qwen3's and Qwen3.5's do) decoding holds the arguments to the function's
`parameters` schema (and, for "required", the names to the tools'), and a schema llguidance cannot enforce is
a 400 naming `tools`; elsewhere the arguments are the model's, unchecked. A call cut by max_tokens comes back as a
call with its arguments so far, finishing with "length". A forced call together with a `response_format` or
`structured_outputs` is the call, as OpenAI answers it (agent stacks send an output schema on every turn): the format
applies to text answers, and there is none; with tool_choice "auto" the constraint holds, so the model answers in
JSON and makes no tool call. Everything else unknown (e.g. `verbosity`, `functions`, `spaces_between_special_tokens`)
is a 400 naming it.
Honoured beyond OpenAI: vLLM's top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
stop_token_ids, allowed_token_ids (sampled on the host as structured outputs are, and a 400 together with
one), bad_words (the last token of each word's tokens is masked where the output ends with the rest; sampled
on the host too), include_stop_str_in_output, skip_special_tokens, return_tokens_as_token_ids,
return_token_ids (vLLM's fields: prompt_token_ids per choice on completions, per response or first chunk on
chat; token_ids per choice or chunk), truncate_prompt_tokens (the prompt's last N tokens; an echo shows what
was kept), add_special_tokens, chat_template_kwargs, add_generation_prompt, cache_salt (prefix-cache hits only
between requests with the same salt); `logprobs` works on completion batches too. A sampling field the
request leaves out takes the model's default from its generation_config.json where it has one (temperature,
top_p, top_k, min_p, repetition_penalty, as vLLM does), else SamplingParams' (OpenAI's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from openinfer.sampling.sampler import ParamError, SamplingParams
from openinfer.sampling.structured import OutputGrammar
from openinfer.text.tokenizer import Tokenizer

from .errors import bad_request
from .fields import IGNORED, Fields, int_list, is_kind, str_list, token_ids
from .grammar_fields import output_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")   # OpenAI's reasoning effort values
THINKING_OFF = ("none", "minimal")
# chat_template_kwargs that would collide with the arguments the server passes itself
_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "continue_final_message")


@dataclass
class Generation:
    """The generation fields both endpoints share; `params(i, …)` builds choice i's SamplingParams."""
    model: str
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False           # stream_options.continuous_usage_stats: each chunk carries usage so far
    max_tokens: int | None = None            # None: the endpoint's default
    max_tokens_param: str = "max_tokens"     # the name the client used, for error messages
    sampling: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    cache_salt: str = ""                     # prefix-cache hits only among requests with the same salt
    logprobs: int | None = None              # engine top-k; None: no logprobs
    prompt_logprobs: int | None = None       # vLLM's prompt_logprobs, reported in vLLM's form; None: not asked
    echo_logprobs: bool = False              # completions' echo with logprobs: the prompt's tokens in `logprobs`
    stop: list[str] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)   # vLLM's: words whose last token the output never completes
    include_stop: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None   # vLLM's: keep the prompt's last N tokens (-1: max_model_len)
    return_token_ids: bool = False           # vLLM's: the prompt's and each choice's token ids in the response
    tokens_as_ids: bool = False              # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
    grammar: OutputGrammar | None = None      # response_format / structured_outputs; None: free text
    priority: int = 0                         # vLLM's: admission order under the priority scheduling policy

    def params(self, choice: int, max_tokens: int, tokenizer: Tokenizer, vocab_size: int,
               defaults: Mapping[str, Any] = MappingProxyType({})) -> SamplingParams:
        """`defaults`: the model's sampling defaults (generation_config.json), for the fields the request left out."""
        # n choices must differ, reproducibly (wrapping within the 64-bit range)
        seed = None if self.seed is None else (self.seed + choice + 2**63) % 2**64 - 2**63
        p = SamplingParams(max_tokens=max_tokens, seed=seed, logprobs=self.logprobs,
                           prompt_logprobs=self.prompt_top_k(), bad_words_ids=bad_words_ids(tokenizer, self.bad_words),
                           **{**defaults, **self.sampling})
        try:
            return p.validate(vocab_size)
        except ParamError as e:
            param = self.max_tokens_param if e.param == "max_tokens" else e.param
            raise bad_request(str(e), param) from None

    def truncated(self, ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last truncate_prompt_tokens tokens (-1: max_model_len), or all of them."""
        keep = max_model_len if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        return ids[-keep:] if keep is not None and len(ids) > keep else ids

    def prompt_top_k(self) -> int | None:
        """The engine's prompt_logprobs: the most alternatives any report of the prompt needs."""
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echo_logprobs else None) if k is not None]
        return max(wanted) if wanted else None


@dataclass
class CompletionRequest:
    gen: Generation
    prompts: list[str | list[int]]
    add_special_tokens: bool = True
    echo: bool = False                       # the prompt goes before each choice's text


@dataclass
class ChatRequest:
    gen: Generation
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None       # None when tool calls are off (no tools, or tool_choice "none")
    template_kwargs: dict[str, Any]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    tool_required: bool = False              # tool_choice "required" or a named function: the output is a call
    tool_name: str | None = None             # ... of this function (a named tool_choice)
    continue_final_message: bool = False     # the prompt ends inside the final message, which the model continues
    parallel_tool_calls: bool = True         # false: the first call only (later ones are dropped)
    reasoning_effort: str | None = None      # checked against the line (reasoning lines only) when rendering
    reasoning_effort_param: str = "reasoning_effort"

    def effort(self, effort: str | None, param: str) -> None:
        """OpenAI's reasoning effort: none / minimal turn thinking off (the one dial a hybrid thinker has: Qwen3's
        enable_thinking; an explicit chat_template_kwargs switch wins), the others leave it on."""
        if effort is not None and effort not in EFFORTS:
            raise bad_request(f"'{param}' must be one of {', '.join(EFFORTS)}; got {effort!r}.", param)
        self.reasoning_effort, self.reasoning_effort_param = effort, param
        if effort in THINKING_OFF:
            self.template_kwargs.setdefault("enable_thinking", False)


def _generation(f: Fields, max_tokens_keys: tuple[str, ...]) -> Generation:
    g = Generation(model=f.get("model", "str", required=True))
    g.n = f.ranged("n", "int", 1, 128, 1)
    g.stream = f.get("stream", "bool", False)
    if (opts := f.sub("stream_options")) is not None:
        if not g.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        g.include_usage = opts.get("include_usage", "bool", False)
        g.continuous_usage = opts.get("continuous_usage_stats", "bool", False)   # vLLM's: usage in every chunk
        opts.get("include_obfuscation", "bool")  # padding against side channels; we send none
        opts.finish()
    for key in max_tokens_keys:  # the first one present wins (max_completion_tokens over max_tokens)
        if (value := f.get(key, "int")) is not None and g.max_tokens is None:
            g.max_tokens, g.max_tokens_param = value, key
    s = g.sampling
    for key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        if (value := f.get(key, "number")) is not None:
            s[key] = float(value)
    for key in ("top_k", "min_tokens"):
        if (value := f.get(key, "int")) is not None:
            s[key] = value
    s["ignore_eos"] = f.get("ignore_eos", "bool", False)
    s["stop_token_ids"] = int_list(f, "stop_token_ids") or []
    s["allowed_token_ids"] = int_list(f, "allowed_token_ids")
    s["logit_bias"] = _logit_bias(f)
    g.seed = f.ranged("seed", "int", -2**63, 2**63 - 1)   # vLLM's range: a 64-bit signed integer
    if (salt := f.get("cache_salt", "str")) == "":
        raise bad_request("'cache_salt' must be a non-empty string if given.", "cache_salt")
    g.cache_salt = salt or ""
    g.stop = [x for x in str_list(f, "stop") if x]
    g.bad_words = [x for x in str_list(f, "bad_words") if x.strip()]
    g.include_stop = f.get("include_stop_str_in_output", "bool", False)
    g.skip_special_tokens = f.get("skip_special_tokens", "bool", True)
    g.tokens_as_ids = f.get("return_tokens_as_token_ids", "bool", False)
    g.return_token_ids = f.get("return_token_ids", "bool", False)
    g.truncate_prompt_tokens = f.get("truncate_prompt_tokens", "int")
    if g.truncate_prompt_tokens is not None and g.truncate_prompt_tokens < 1 and g.truncate_prompt_tokens != -1:
        raise bad_request("'truncate_prompt_tokens' must be -1 (the model's context length) or at least 1.",
                          "truncate_prompt_tokens")
    f.only("best_of", 1)
    f.only("use_beam_search", False)
    f.only("length_penalty", 1.0, 1)   # a beam-search knob
    g.priority = f.get("priority", "int", 0)   # vLLM's: the engine refuses a value other than 0 unless it runs the
    # priority scheduling policy
    g.prompt_logprobs = f.ranged("prompt_logprobs", "int", 0, 20)
    if g.prompt_logprobs is not None and g.stream:
        raise bad_request("'prompt_logprobs' is not available when streaming: send 'stream': false (on completions, "
                          "'echo' with 'logprobs' streams the prompt's logprobs).", "prompt_logprobs")
    g.grammar = output_grammar(f)
    return g


def bad_words_ids(tokenizer: Tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids as it would start the text and after a space (where those differ, have the same
    length and begin differently), as vLLM tokenizes them."""
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out.append(bare)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out


def _logit_bias(f: Fields) -> dict[int, float]:
    raw = f.get("logit_bias", "object", {})
    out: dict[int, float] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.lstrip("-").isdigit()) or not is_kind(value, "number"):
            raise bad_request("'logit_bias' must map token ids to numbers.", "logit_bias", "invalid_type")
        out[int(key)] = float(value)
    return out


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    f = Fields(body)
    gen = _generation(f, ("max_tokens",))
    if (k := f.ranged("logprobs", "int", 0, 20)) is not None:
        gen.logprobs = k
    req = CompletionRequest(gen, _prompts(f), f.get("add_special_tokens", "bool", True), f.get("echo", "bool", False))
    gen.echo_logprobs = req.echo and gen.logprobs is not None
    f.only("suffix", "")
    f.finish(IGNORED)
    return req


def _prompts(f: Fields) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    prompt = f.data.get("prompt")
    f.get("prompt", "str" if isinstance(prompt, str) else "list", required=True)
    if isinstance(prompt, str):
        return [prompt]
    if prompt and token_ids(prompt):
        return [prompt]
    if prompt and all(isinstance(p, str) or (isinstance(p, list) and p and token_ids(p)) for p in prompt):
        return prompt
    raise bad_request("'prompt' must be a string, an array of strings, a non-empty array of token ids, "
                      "or an array of non-empty token-id arrays.", "prompt", "invalid_type")


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    f = Fields(body)
    gen = _generation(f, ("max_completion_tokens", "max_tokens"))
    if f.get("logprobs", "bool", False):
        gen.logprobs = f.ranged("top_logprobs", "int", 0, 20, 0)
    elif f.get("top_logprobs", "int") is not None:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    messages = parse_messages(f)
    tools, forced = parse_tools(f)
    req = ChatRequest(gen, messages, tools, template_kwargs(f), f.get("add_generation_prompt", "bool", True),
                      f.get("add_special_tokens", "bool", False), forced is not None, forced or None)
    if req.tool_required and not req.add_generation_prompt:
        raise bad_request("A tool_choice that forces a call needs 'add_generation_prompt' true: the call opens the "
                          "assistant turn.", "tool_choice")
    req.continue_final_message = _continue_final_message(f, req.add_generation_prompt)
    req.parallel_tool_calls = f.get("parallel_tool_calls", "bool", True)
    req.effort(f.get("reasoning_effort", "str"), "reasoning_effort")
    f.only("modalities", ["text"])
    f.finish(IGNORED)
    return req


def _continue_final_message(f: Fields, add_generation_prompt: bool) -> bool:
    """vLLM's continue_final_message, which needs add_generation_prompt false (the two end the prompt apart)."""
    cont = f.get("continue_final_message", "bool", False)
    if cont and add_generation_prompt:
        raise bad_request("'continue_final_message' needs 'add_generation_prompt' false: the prompt either ends inside "
                          "the final message or opens a new one.", "continue_final_message")
    return cont


def parse_messages(f: Fields) -> list[dict[str, Any]]:
    raw = f.get("messages", "list", required=True)
    if not raw:
        raise bad_request("'messages' must not be empty.", "messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise bad_request(f"'messages[{i}]' must be an object.", f"messages[{i}]", "invalid_type")
        mf = Fields(m, f"messages[{i}]")
        role = mf.get("role", "str", required=True)
        if role not in ROLES:
            raise bad_request(f"'messages[{i}].role' must be one of {', '.join(ROLES)}; got '{role}'.",
                              f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(mf.get("content", "list")):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad_request(f"'messages[{i}].content[{j}]': only text parts are supported.",
                                      f"messages[{i}].content[{j}]")
        else:
            mf.get("content", "str")
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            mf.get(key, "str")
        mf.get("tool_calls", "list")
        mf.only("refusal", "")
        mf.finish()
        messages.append(template_message(m))
    return messages


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A validated message as the chat template reads it. "developer" is OpenAI's newer name for the system role;
    templates know only "system". Null content (an assistant turn that only called tools) renders as "", as in
    vLLM: templates read message.content unguarded."""
    return {**m, "role": "system" if m["role"] == "developer" else m["role"], "content": m.get("content") or ""}


def parse_tools(f: Fields) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The tools the model may call (None: tool calls off) and the forced call: None (tool_choice "auto" or "none"),
    "" ("required": a call of a function the model picks) or a function's name."""
    tools = f.get("tools", "list")
    for i, tool in enumerate(tools or []):
        name = f"tools[{i}]"
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict)
                and isinstance(tool["function"].get("name"), str) and tool["function"]["name"]):
            raise bad_request(f"'{name}' must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}.", name)
        if not isinstance(tool["function"].get("parameters", {}), dict):
            raise bad_request(f"'{name}.function.parameters' must be a JSON Schema object.",
                              f"{name}.function.parameters")
    choice = f.data.get("tool_choice")
    f.get("tool_choice", "object" if isinstance(choice, dict) else "str")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None, None
    if isinstance(choice, dict):
        fn = choice.get("function")
        if not (choice.get("type") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str)
                and set(choice) == {"type", "function"} and set(fn) == {"name"}):
            raise bad_request("A named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": …}}.",
                              "tool_choice")
        names = [t["function"]["name"] for t in tools or []]
        if fn["name"] not in names:
            raise bad_request(f"tool_choice names function {fn['name']!r}, which is not in 'tools' "
                              f"({', '.join(map(repr, names)) or 'none given'}).", "tool_choice")
        return tools, fn["name"]
    if choice not in ("auto", "required"):
        raise bad_request(f"tool_choice {choice!r} is not supported: use \"auto\", \"none\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": …}}.", "tool_choice")
    if not tools:
        raise bad_request(f"tool_choice \"{choice}\" needs a non-empty 'tools' list.", "tool_choice")
    return tools, ("" if choice == "required" else None)


@dataclass
class TokenizeRequest:
    model: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    template_kwargs: dict[str, Any]
    tools: list[dict[str, Any]] | None
    continue_final_message: bool = False


def template_kwargs(f: Fields) -> dict[str, Any]:
    """chat_template_kwargs (e.g. Qwen3's enable_thinking), without the arguments the server passes itself."""
    kwargs = f.get("chat_template_kwargs", "object", {})
    for key in _RESERVED_TEMPLATE_KWARGS:
        if key in kwargs:
            raise bad_request(f"'chat_template_kwargs.{key}' is set by the server; pass it as a request field.",
                              f"chat_template_kwargs.{key}")
    return kwargs


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    f = Fields(body)
    model = f.get("model", "str", required=True)
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise bad_request("Give exactly one of 'prompt' and 'messages'.", "prompt")
    prompt = f.get("prompt", "str")
    messages = parse_messages(f) if body.get("messages") is not None else None
    req = TokenizeRequest(model, prompt, messages, f.get("add_special_tokens", "bool", messages is None),
                          f.get("add_generation_prompt", "bool", True), template_kwargs(f), f.get("tools", "list"))
    if messages is not None:
        req.continue_final_message = _continue_final_message(f, req.add_generation_prompt)
    f.finish()
    return req


def parse_detokenize(body: dict[str, Any]) -> tuple[str, list[int]]:
    f = Fields(body)
    model = f.get("model", "str", required=True)
    tokens = int_list(f, "tokens")
    if tokens is None:
        raise bad_request("'tokens' is a required property.", "tokens", "missing_required")
    f.finish()
    return model, tokens
