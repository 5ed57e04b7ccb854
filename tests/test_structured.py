"""sampling/structured.py over a tiny vocabulary: the allow mask and the matcher step by step, the reasoning
gate, a token the grammar refuses, and that nothing imports llguidance before a structured request."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from openinfer.sampling.sampler import SamplingParams, sample_row
from openinfer.sampling.structured import (Constraint, GrammarError, OutputGrammar, ReasoningGate, compile_grammar,
                                           reasoning_gate)
from openinfer.text.tokenizer import Tokenizer

PIECES = ['{', '}', '"', ':', ',', ' ', 'a', 'b', '1', '2', 't', 'r', 'u', 'e', 'f', 'l', 's', '"a"', 'true', '<eos>']
ID = {p: i for i, p in enumerate(PIECES)}
EOS = ID["<eos>"]
VOCAB = len(PIECES) + 4   # the model's padded rows past the tokenizer's vocabulary
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}


@dataclass
class TinyEngine:
    """What compile_grammar reads of an engine."""
    tokenizer: Tokenizer
    vocab_size: int = VOCAB
    eos_token_ids: frozenset[int] = frozenset({EOS})


@pytest.fixture(scope="module")
def engine() -> TinyEngine:
    hf = HFTokenizer(models.WordLevel({p: i for p, i in ID.items() if p != "<eos>"}, unk_token="a"))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    hf.add_special_tokens([AddedToken("<eos>", special=True)])
    return TinyEngine(Tokenizer(hf, {"eos_token": "<eos>"}))


def allowed(c: Constraint) -> set[str]:
    c.prepare()
    assert c.error is None and c.mask is not None and c.mask.shape == (VOCAB,)
    assert not c.mask[len(PIECES):].any()   # padded ids are never allowed
    return {PIECES[i] for i in np.flatnonzero(c.mask)}


def test_mask_and_matcher_step_by_step(engine: TinyEngine) -> None:
    [c] = compile_grammar(engine, OutputGrammar("json", SCHEMA), 1)
    assert allowed(c) == {"{"}
    assert not c.advance(ID["{"])
    # the key "a" is forced, and forced text comes as our tokenizer writes it (one char a token)
    assert allowed(c) == {'"'}
    for piece in ['"', "a", '"', ":", "1", "2", ",", '"', "b", '"', ":"]:
        assert piece in allowed(c)
        assert not c.advance(ID[piece])
    assert allowed(c) == {"t", "f", "true"}   # a boolean
    assert not c.advance(ID["true"])
    assert allowed(c) == {"}"}
    assert c.advance(ID["}"])   # complete: only eos could follow
    assert c.error is None


def test_sampling_honours_the_mask(engine: TinyEngine) -> None:
    [c] = compile_grammar(engine, OutputGrammar("json", {"type": "object"}), 1)
    c.prepare()
    logits = np.zeros(VOCAB, np.float32)
    logits[ID["a"]] = 50.0   # the model's favourite is not allowed
    rng = np.random.default_rng(0)
    assert sample_row(logits, SamplingParams(temperature=0.0), rng, [], [], allowed=c.mask).token == ID["{"]
    draws = {sample_row(logits, SamplingParams(temperature=1.0, top_k=5), rng, [], [], allowed=c.mask).token
             for _ in range(50)}
    assert draws == {ID["{"]}
    s = sample_row(logits, SamplingParams(temperature=0.0, logprobs=2), rng, [], [], allowed=c.mask)
    assert s.logprob == pytest.approx(0.0) and s.top[1][1] == -np.inf   # all the mass on the one allowed token


def test_reasoning_runs_free_until_its_end_marker(engine: TinyEngine) -> None:
    gate = ReasoningGate((ID["b"], ID["a"]))   # the prompt opened the block
    [c] = compile_grammar(engine, OutputGrammar("json", SCHEMA), 1, gate)
    for piece in ["a", "b", "1", "b"]:   # reasoning: no mask, anything goes
        c.prepare()
        assert c.mask is None and not c.advance(ID[piece])
    assert not c.advance(ID["a"])   # "b a": the end marker; the answer is constrained from here
    assert allowed(c) == {"{"}


def test_a_line_that_may_reason_offers_the_opener_beside_the_answer(engine: TinyEngine) -> None:
    gate = ReasoningGate((ID["b"], ID["a"]), start=ID["t"])
    [reasons, answers] = compile_grammar(engine, OutputGrammar("json", SCHEMA), 2, gate)
    assert allowed(reasons) == {"{", "t"}   # the first token: the answer's or the block's opener
    assert not reasons.advance(ID["t"])
    reasons.prepare()
    assert reasons.mask is None and not reasons.advance(ID["1"])   # inside the block: free
    assert not reasons.advance(ID["b"]) and not reasons.advance(ID["a"])
    assert allowed(reasons) == {"{"}   # after the end marker, the grammar alone
    assert allowed(answers) == {"{", "t"}
    assert not answers.advance(ID["{"])   # no reasoning: constrained from the first token on
    assert allowed(answers) == {'"'}


def test_regex_and_choice(engine: TinyEngine) -> None:
    [digits] = compile_grammar(engine, OutputGrammar("regex", "[12]{2}"), 1)
    assert allowed(digits) == {"1", "2"}
    assert not digits.advance(ID["2"]) and allowed(digits) == {"1", "2"}
    assert digits.advance(ID["1"])   # two digits: complete
    # punctuation in a choice is literal (escaped), not regex syntax
    [choice] = compile_grammar(engine, OutputGrammar("choice", ['"a"', "{1,2}", "true"]), 1)
    assert allowed(choice) == {'"', '"a"', "{", "t", "true"}
    assert not choice.advance(ID["{"]) and allowed(choice) == {"1"}
    for piece in ["1", ",", "2"]:
        assert not choice.advance(ID[piece])
    assert choice.advance(ID["}"])
    with pytest.raises(GrammarError, match="regex"):
        compile_grammar(engine, OutputGrammar("regex", "(("), 1)


@pytest.mark.parametrize("text", [
    'start: "{" pair ("," pair)* "}"\npair: KEY ":" NUM\nKEY: "a" | "b"\nNUM: /[12]+/',   # Lark
    'root ::= "{" pair ("," pair)* "}"\npair ::= [ab] ":" [12]+',                          # GBNF, as vLLM's clients
], ids=["lark", "gbnf"])
def test_context_free_grammar(engine: TinyEngine, text: str) -> None:
    """A grammar no regex can express (repetition of a bracketed pair) drives the mask as the JSON Schema does."""
    [c] = compile_grammar(engine, OutputGrammar("grammar", text), 1)
    assert allowed(c) == {"{"}
    assert not c.advance(ID["{"])
    assert allowed(c) == {"a", "b"}
    for piece in ["a", ":", "1", "2", ",", "b", ":", "2"]:
        assert piece in allowed(c)
        assert not c.advance(ID[piece])
    assert allowed(c) == {"1", "2", ",", "}"}
    assert c.advance(ID["}"])   # complete: only eos may follow


def test_a_bad_grammar_is_a_grammar_error(engine: TinyEngine) -> None:
    for text in ("root ::= foo", "start: undefined_rule", "root ::= [a", "start: ("):
        with pytest.raises(GrammarError):
            compile_grammar(engine, OutputGrammar("grammar", text), 1)


def test_refused_token_and_bad_schema(engine: TinyEngine) -> None:
    first, second = compile_grammar(engine, OutputGrammar("json", SCHEMA), 2)
    assert not first.advance(ID["}"]) and first.error   # outside the grammar: the request must fail
    first.prepare()
    assert first.mask is None
    assert allowed(second) == {"{"}   # the copies are independent
    with pytest.raises(GrammarError, match="foo"):
        compile_grammar(engine, OutputGrammar("json", {"type": "foo"}), 1)


def test_serving_modules_do_not_import_llguidance() -> None:
    code = ("import sys, openinfer.cli, openinfer.engine.engine, openinfer.server, openinfer.server.app, "
            "openinfer.sampling.structured; assert 'llguidance' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_where_reasoning_may_come_first() -> None:
    from openinfer_qwen3.chat import DEMO_TOKENIZER_DIR, QWEN3_CHAT_FORMAT as fmt
    qwen3_tokenizer = Tokenizer.from_dir(DEMO_TOKENIZER_DIR)
    start, end = (qwen3_tokenizer.encode(t) for t in ("<think>", "</think>"))
    head = "<|im_start|>user\n<think>?</think><|im_end|>\n<|im_start|>assistant\n"
    assert fmt.reasoning_ahead(head)   # thinking on: the model opens the block itself
    assert reasoning_gate(fmt, head, qwen3_tokenizer) == ReasoningGate(tuple(end), start[0])
    assert fmt.reasoning_ahead(head + "<think>\nLet me")   # the prompt opened it
    assert reasoning_gate(fmt, head + "<think>\nLet me", qwen3_tokenizer) == ReasoningGate(tuple(end))
    assert not fmt.reasoning_ahead(head + "<think>\n\n</think>\n\n")   # thinking off: closed already
    assert reasoning_gate(fmt, head + "<think>\n\n</think>\n\n", qwen3_tokenizer) is None
