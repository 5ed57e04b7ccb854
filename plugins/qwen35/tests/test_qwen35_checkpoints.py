"""The prompt's last-full-block state checkpoint, saved by the prefill step itself (kv/hybrid.py):
the prefill is not cut there, the checkpoint row holds the state as of the boundary token (the
state an engine has after prefilling just the tokens before it), and resending the prompt or a
later turn hits it with unchanged greedy output, whole or chunked (the boundary inside a chunk,
and inside the conv window of the chunk's first tokens)."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing import Engine
from openinfer.testing.engine import collect, generate, greedy, run_to_completion
from openinfer.testing.hf_reference import hf_greedy_stepwise

from test_qwen35_fidelity import engine_for, tokens

PROMPT, BOUNDARY = 45, 32   # block 16: the last full block before the prompt's last token ends at 32


def state_row(eng: Engine, row: int) -> dict[str, np.ndarray]:
    """Every Gated DeltaNet layer's conv window and recurrent state in one state row, on the host."""
    be = eng.runner.backend
    return {part: np.asarray(be.to_host(a[row]), np.float32) for part, a in eng.runner.pools.slots["gdn"].items()}


def checkpoint_row(eng: Engine, ids: list[int], boundary: int) -> int:
    """The row of the checkpoint at `boundary` of prompt `ids` (whose blocks the engine has hashed)."""
    from openinfer.testing import block_hashes
    h = block_hashes(ids, eng.blocks.block_size)[boundary // eng.blocks.block_size - 1]
    row = eng.blocks.checkpoints.rows.get(h)
    assert row is not None, f"no checkpoint at {boundary}"
    return row


def state_after(ckpt, ids: list[int], **kw) -> dict[str, np.ndarray]:
    """The state a plain engine holds after prefilling `ids` (its one request has slot row 1)."""
    eng = engine_for(ckpt, enable_prefix_caching=False, **kw)
    generate(eng, [ids], greedy(1))
    return state_row(eng, 1)


def assert_states_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    for part in want:
        np.testing.assert_allclose(got[part], want[part], rtol=tol, atol=tol, err_msg=part)


def test_the_prompt_prefills_in_one_step_and_saves_its_last_full_block(untied):
    ckpt, hf = untied
    eng = engine_for(ckpt, block_size=16)
    ids = tokens(PROMPT, seed=31)
    stream = eng.submit(ids, greedy(12))
    assert eng.step().num_tokens == PROMPT                 # no cut at the boundary
    assert_states_close(state_row(eng, checkpoint_row(eng, ids, BOUNDARY)), state_after(ckpt, ids[:BOUNDARY]))
    run_to_completion(eng, [stream])
    first, _, cached0 = collect(stream)
    [(again, fin, cached1)] = generate(eng, [ids], greedy(12))
    assert cached0 == 0 and cached1 == fin.cached_tokens == BOUNDARY
    assert first == again == hf_greedy_stepwise(hf, ids, 12)
    turn2 = ids + first + tokens(9, seed=32)               # hits turn 1's rolling decode checkpoint at 48
    [(out, _, cached2)] = generate(eng, [turn2], greedy(8))
    [(plain, _, c)] = generate(engine_for(ckpt, enable_prefix_caching=False), [turn2], greedy(8))
    assert cached2 == 48 and c == 0 and out == plain


@pytest.mark.parametrize("budget", [7, 10, 11, 33])
def test_chunked_prefill_saves_the_boundary_inside_a_chunk(untied, budget):
    """Budget 7: the chunk [28, 35) crosses 32 four tokens in; 10: [30, 40) two tokens in, so the
    saved conv window reaches back into the previous chunk's state; 11: [22, 33), one token
    before its end; 33: [0, 33), the first chunk."""
    ckpt, hf = untied
    eng = engine_for(ckpt, block_size=16, max_num_batched_tokens=budget)
    ids = tokens(PROMPT, seed=33)
    [(first, _, _)] = generate(eng, [ids], greedy(8))
    saved = state_row(eng, checkpoint_row(eng, ids, BOUNDARY))
    assert_states_close(saved, state_after(ckpt, ids[:BOUNDARY], max_num_batched_tokens=budget))
    [(again, _, cached)] = generate(eng, [ids], greedy(8))
    assert cached == BOUNDARY and first == again == hf_greedy_stepwise(hf, ids, 8)


def test_sha256_block_keys_reach_the_state_checkpoints(untied):
    """--prefix-cache-hash sha256 on the hybrid model: the checkpoints are keyed by the same sha256
    chain as the blocks, so a resent prompt and a second turn hit exactly as with the builtin keys."""
    ckpt, _ = untied
    runs = []
    for scheme in ("builtin", "sha256"):
        eng = engine_for(ckpt, block_size=16, prefix_cache_hash=scheme)
        ids = tokens(PROMPT, seed=34)
        [(first, _, _)] = generate(eng, [ids], greedy(8))
        [(again, _, cached)] = generate(eng, [ids], greedy(8))
        [(turn2, _, cached2)] = generate(eng, [ids + first + tokens(9, seed=35)], greedy(6))
        runs.append((first, again, cached, turn2, cached2))
    assert runs[0] == runs[1] and runs[1][2] == BOUNDARY and runs[1][4] > BOUNDARY
