"""Pipelined decode (engine/pipeline.py) on the demo model through emulated graphs: with the switch on,
every stream gets exactly the events of the serial engine — batches of different lengths, stop
tokens hit mid-batch, max_tokens, an abort mid-decode, a request arriving mid-decode, seeded
sampling and logprobs (which fall back to serial steps) — and the pipelined path did run."""
from __future__ import annotations

import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.engine.request import Finished, Tokens
from openinfer.sampling.sampler import SamplingParams
from openinfer.testing.engine import greedy
from openinfer.testing.graphs import emulate_graphs
from openinfer.testing.pipelined import abort, pipelined_launches, run_script, submit


def _engine(pipelined: bool, max_num_seqs: int = 8):
    return build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01, max_num_seqs=max_num_seqs,
                                         pipelined_decode=pipelined))


def _compare(script, min_launches: int = 1, max_launches: int | None = None, max_num_seqs: int = 8):
    serial, piped = _engine(False, max_num_seqs), _engine(True, max_num_seqs)
    for eng in (serial, piped):
        emulate_graphs(eng)
    serial_launches, launches = pipelined_launches(serial), pipelined_launches(piped)
    want = run_script(serial, script)
    got = run_script(piped, script)
    assert got == want
    assert serial_launches == [] and min_launches <= len(launches) <= (max_launches or len(launches))
    for eng in (serial, piped):   # every block and reservation came back
        assert eng.blocks.reserved == 0 and not eng.scheduler.running and not eng._ended
    return want


def _prompt(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 150000 for i in range(n)]


def _tokens(events) -> list[int]:
    return [t for ev in events if isinstance(ev, Tokens) for t in ev.token_ids]


def test_batch_of_different_lengths_and_max_tokens():
    want = _compare({0: [submit(f"r{i}", _prompt(3 + 5 * i, i), greedy(4 + 3 * i)) for i in range(5)]}, 10)
    assert [len(_tokens(want[f"r{i}"])) for i in range(5)] == [4 + 3 * i for i in range(5)]


def test_stop_tokens_hit_mid_batch():
    """Each request stops on a token it is known to generate (from a first greedy run), so rows
    finish at different steps while the others go on."""
    probe = _compare({0: [submit(f"r{i}", _prompt(4 + i, 10 + i), greedy(12)) for i in range(4)]})
    script = {0: []}
    for i in range(4):
        stop = _tokens(probe[f"r{i}"])[2 + 2 * i]
        script[0].append(submit(f"r{i}", _prompt(4 + i, 10 + i), greedy(12, stop_token_ids=[stop])))
    got = _compare(script)
    reasons = [next(ev for ev in got[f"r{i}"] if isinstance(ev, Finished)).reason for i in range(4)]
    assert reasons.count("stop") >= 3


def test_abort_mid_decode_and_a_request_arriving_mid_decode():
    got = _compare({0: [submit("a", _prompt(6, 1), greedy(30)), submit("b", _prompt(9, 2), greedy(30))],
                    5: [abort("a")],
                    8: [submit("c", _prompt(5, 3), greedy(10))]}, 10)
    assert got["a"][-1].reason == "abort" and len(_tokens(got["c"])) == 10


def test_requests_waiting_behind_a_full_batch_do_not_stop_the_pipeline():
    """More requests than seats: the ones waiting cannot be admitted until a seat frees, so the running batch
    pipelines meanwhile (every step of the first pair's decode but the ones around a seat changing hands)."""
    got = _compare({0: [submit(f"r{i}", _prompt(5 + i, 20 + i), greedy(10 + 4 * i)) for i in range(5)]},
                   12, max_num_seqs=2)
    assert [len(_tokens(got[f"r{i}"])) for i in range(5)] == [10 + 4 * i for i in range(5)]


def test_a_waiting_request_that_fits_a_free_seat_is_admitted_at_once():
    """A seat is free and the pool holds the waiting request: the engine stops pipelining, so the newcomer is
    scheduled in the step after the one in flight; with both seats taken a newcomer waits."""
    eng = _engine(True, max_num_seqs=2)
    emulate_graphs(eng)
    sch = eng.scheduler
    a = eng.submit(_prompt(6, 1), greedy(30))
    for _ in range(4):
        eng.step()
    b = eng.submit(_prompt(7, 2), greedy(5))
    eng._drain()
    assert sch.can_admit()
    eng.step()   # collects the step in flight and queues none behind it
    assert eng._inflight is None
    eng.step()
    assert len(sch.running) == 2 and not sch.waiting
    c = eng.submit(_prompt(8, 3), greedy(5))
    eng._drain()
    assert not sch.can_admit()   # both seats taken
    while eng.has_unfinished():
        eng.step()
    assert all(s.done for s in (a, b, c))


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True),
                                    greedy(12, logprobs=2)])
def test_rows_that_are_not_plain_greedy_keep_the_batch_serial(params):
    """A sampled or logprobs row in the batch: no step is pipelined, and the streams are the same."""
    _compare({0: [submit("g", _prompt(7, 4), greedy(12)), submit("s", _prompt(5, 5), params)]}, 0, 0)


def test_min_tokens_rows_pipeline_only_once_their_stop_ids_count():
    """Stop ids held back by min_tokens make a row host-sampled: serial until then, pipelined after."""
    stop = _tokens(_compare({0: [submit("m", _prompt(6, 6), greedy(16))]})["m"])[3]
    got = _compare({0: [submit("m", _prompt(6, 6), greedy(16, min_tokens=8, stop_token_ids=[stop]))]}, 1)
    assert len(_tokens(got["m"])) >= 8


def test_serve_and_bench_latency_pipeline_unless_told_not_to():
    from openinfer.cli import _engine_args, build_parser
    parser = build_parser()
    assert EngineArgs().pipelined_decode
    assert _engine_args(parser.parse_args(["serve"])).pipelined_decode
    assert not _engine_args(parser.parse_args(["serve", "--no-pipelined-decode"])).pipelined_decode
    assert parser.parse_args(["bench", "latency"]).pipelined_decode
    assert not parser.parse_args(["bench", "latency", "--no-pipelined-decode"]).pipelined_decode
