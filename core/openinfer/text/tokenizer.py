"""Tokenizer: HF `tokenizers` for text <-> ids, jinja2 for the checkpoint's chat template.

Reads a checkpoint directory the way transformers does (tokenizer.json, tokenizer_config.json,
chat_template.jinja, generation_config.json / config.json for eos ids) without importing it.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import unicodedata
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from ..loading.disk_cache import cache_root, write_atomic

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
_REASONING_ALIASES = ("reasoning", "thinking")  # other names clients use for reasoning_content


class ChatTemplateError(ValueError):
    """The chat template refused the conversation (raise_exception) or failed to render it."""


def byte_level_chars() -> tuple[str, ...]:
    """GPT-2 bytes_to_unicode: the printable stand-in byte-level BPE vocabularies use for each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return tuple(chr(table[b]) for b in range(256))


def _byte_decoder() -> dict[str, int]:
    """Byte-level vocab chars -> raw bytes."""
    return {c: b for b, c in enumerate(byte_level_chars())}


def _token_content(tok: Any) -> str | None:
    # tokenizer_config writes special tokens as a string or as an AddedToken dict.
    return tok.get("content") if isinstance(tok, dict) else tok


def _unpacked(gz: Path) -> HFTokenizer:
    """A tokenizer.json.gz, parsed from its unpacked copy in the disk cache (keyed by the archive's
    content hash; made at the first load): skips the gunzip and the ~35 MB of transient bytes and
    string at every start after that. Where the cache cannot be written, from the unpacked bytes."""
    data = gz.read_bytes()
    path = cache_root() / "tokenizers" / f"{hashlib.sha256(data).hexdigest()[:24]}.json"
    if not path.is_file():
        raw = gzip.decompress(data)
        try:
            write_atomic(path, raw)
        except OSError:
            return HFTokenizer.from_str(raw.decode("utf-8"))
    return HFTokenizer.from_file(str(path))


def _cut_after_final_message(text: str, final: dict) -> str:
    """The rendered chat up to the end of its final message's content (transformers' continue_final_message:
    the last occurrence, or of the stripped content where a template trims messages)."""
    content = final.get("content") or ""
    if isinstance(content, list):   # content parts: the text of the last one
        content = content[-1].get("text", "") if content else ""
    for needle in (content, content.strip()):
        if needle and (i := text.rfind(needle)) >= 0:
            return text[: i + len(needle)]
    raise ChatTemplateError("continue_final_message is set but the final message's content is empty or does not "
                            "appear in the rendered chat")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's override: no HTML escaping (jinja's default tojson escapes <, >, &, ').
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class _GenerationTag(jinja2.ext.Extension):
    # HF's {% generation %}…{% endgeneration %} marks assistant text for training masks;
    # templates that use it must still compile, and rendering just keeps the body.
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _normalize_message(message: dict) -> dict:
    # Like transformers: drop None values (templates test `is defined`, not `is none`) and alias
    # reasoning fields. Text-only content-part lists are joined, as vLLM does for string templates.
    msg = {k: v for k, v in message.items() if v is not None}
    if "reasoning_content" not in msg:
        for alias in _REASONING_ALIASES:
            if alias in msg:
                msg["reasoning_content"] = msg[alias]
                break
    content = msg.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        msg["content"] = "\n".join(p.get("text", "") for p in content)
    return msg


class Tokenizer:
    """Encode/decode, special-token facts and chat-template rendering for one checkpoint."""

    def __init__(self, hf: HFTokenizer, config: dict | None = None, chat_template: str | list | None = None,
                 extra_eos_ids: set[int] | frozenset[int] = frozenset()) -> None:
        self._hf = hf
        config = config or {}
        self.add_bos_token = bool(config.get("add_bos_token", False))
        # Added tokens: tokenizer_config's added_tokens_decoder wins over tokenizer.json (as in HF).
        added = {i: t.special for i, t in hf.get_added_tokens_decoder().items()}
        for sid, tok in config.get("added_tokens_decoder", {}).items():
            added[int(sid)] = bool(tok.get("special", False))
        self.special_ids: frozenset[int] = frozenset(i for i, s in added.items() if s)
        self._added_ids = frozenset(added)
        self.special_tokens: dict[str, str] = {
            name: content for name in _SPECIAL_NAMES if (content := _token_content(config.get(name)))}
        self.bos_token_id: int | None = self._id_of("bos_token")
        eos = self._id_of("eos_token")
        self.eos_token_ids: frozenset[int] = frozenset(extra_eos_ids | ({eos} if eos is not None else set()))
        self.chat_template = chat_template if chat_template is not None else config.get("chat_template")
        self._templates: dict[str, jinja2.Template] = {}
        decoder = json.loads(hf.decoder.__getstate__()) if hf.decoder is not None else {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        self._byte_level = any(p.get("type") == "ByteLevel" for p in parts)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
        elif (path / "tokenizer.json.gz").is_file():
            hf = _unpacked(path / "tokenizer.json.gz")
        else:
            raise FileNotFoundError(f"no tokenizer.json (or tokenizer.json.gz) in {path}; openinfer needs the "
                                    "fast-tokenizer file that Hugging Face checkpoints ship")
        return cls.with_folder(hf, path)

    @classmethod
    def with_folder(cls, hf: HFTokenizer, path: str | Path) -> Tokenizer:
        """`hf` with a checkpoint folder's tokenizer_config.json, chat template and eos ids (generation_config.json,
        config.json), as transformers reads them."""
        path = Path(path)
        config = _read_json(path / "tokenizer_config.json")
        template = None
        if (path / "chat_template.jinja").is_file():  # newer checkpoints keep the template in its own file
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        eos: set[int] = set()
        for name in ("generation_config.json", "config.json"):
            value = _read_json(path / name).get("eos_token_id")
            eos.update(value if isinstance(value, list) else [] if value is None else [value])
        return cls(hf, config, template, eos)

    # ---- vocabulary ----
    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def _id_of(self, name: str) -> int | None:
        content = self.special_tokens.get(name)
        return None if content is None else self._hf.token_to_id(content)

    # ---- text <-> ids ----
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # the batch call releases the GIL while Rust encodes (encode() holds it: a 10 MB prompt froze every other
        # thread for seconds); the fast variant skips the offsets nobody reads
        ids = self._hf.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        # tokenizer_config's add_bos_token, for tokenizer.json files whose post-processor lacks it.
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None \
                and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)), without encoding it: no token stands for more characters of the
        normalized text than the longest token has bytes. 0 where the normalizer is one this cannot follow."""
        form, longest = self._length_bound
        if longest == 0:
            return 0
        if form is not None and not unicodedata.is_normalized(form, text):
            text = unicodedata.normalize(form, text)   # composing can shorten the text a token covers
        return -(-len(text) // longest)

    @cached_property
    def _length_bound(self) -> tuple[str | None, int]:
        """(the normalizer's Unicode form or None, the longest token's bytes; 0 if not known)."""
        normalizer = json.loads(self._hf.normalizer.__getstate__()) if self._hf.normalizer is not None else {}
        form = normalizer.get("type")
        if form not in (None, "NFC", "NFD", "NFKC", "NFKD"):
            return None, 0
        vocab = self._hf.get_vocab(with_added_tokens=True)
        # a byte-level token's characters are its bytes; elsewhere a word marker may add one
        longest = max(len(t) if self._byte_level else len(t.encode()) + 1 for t in vocab)
        return form, longest

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:  # our special_ids (config flags), not tokenizer.json's, decide
            ids = [i for i in ids if i not in self.special_ids]
        return self._hf.decode(ids, skip_special_tokens=False)

    @cached_property
    def _bytes_of_char(self) -> dict[str, int]:
        return _byte_decoder()

    def token_bytes(self, token_id: int) -> list[int]:
        """The raw UTF-8 bytes one token stands for (OpenAI logprobs' `bytes`)."""
        token = self._hf.id_to_token(token_id)
        if token is None:
            return []
        if token_id in self._added_ids:
            return list(token.encode("utf-8"))
        if self._byte_level:
            table = self._bytes_of_char
            return [table[c] for c in token] if all(c in table for c in token) else list(token.encode("utf-8"))
        if m := _BYTE_FALLBACK.match(token):
            return [int(m.group(1), 16)]
        return list(token.replace("\u2581", " ").encode("utf-8"))  # SentencePiece word marker

    def token_text(self, token_id: int) -> str:
        """One token as text for logprobs; a partial UTF-8 sequence shows as OpenAI's 'bytes:\\xNN'."""
        raw = bytes(self.token_bytes(token_id))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    # ---- chat template ----
    def _template_source(self, tools: list[dict] | None) -> str:
        template = self.chat_template
        if isinstance(template, list):  # older configs: [{"name": "default" | "tool_use", "template": ...}]
            named = {t["name"]: t["template"] for t in template}
            template = named.get("tool_use") if tools and "tool_use" in named else named.get("default")
        if not template:
            raise ChatTemplateError("this tokenizer has no chat template (no chat_template in "
                                    "tokenizer_config.json and no chat_template.jinja); use /v1/completions")
        return template

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, continue_final_message: bool = False,
                            **kwargs: Any) -> str:
        """Render the conversation to prompt text; kwargs (e.g. enable_thinking) reach the template.
        continue_final_message: the text ends where the final message's content does (no end-of-turn after it),
        so the model continues that message, as transformers renders it."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
        text = self._render(messages, tools, add_generation_prompt, kwargs)
        return _cut_after_final_message(text, messages[-1]) if continue_final_message else text

    def _render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                kwargs: dict[str, Any]) -> str:
        source = self._template_source(tools)
        if source not in self._templates:
            try:
                self._templates[source] = _compile(source)
            except jinja2.TemplateSyntaxError as e:
                raise ChatTemplateError(f"chat template does not compile: {e}") from e
        variables = {**self.special_tokens, **kwargs}  # kwargs override the special tokens, like HF
        try:
            return self._templates[source].render(
                messages=[_normalize_message(m) for m in messages], tools=tools,
                add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from e
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {e}") from e
