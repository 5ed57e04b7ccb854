"""ModelRunner.prepare_host (vectorized over the runs) against a per-run construction of the same
inputs, on a mixed step: decode rows, a prefill chunk in the middle of a prompt, a run crossing from
prompt into output ids, ragged block tables."""
from __future__ import annotations

import numpy as np

from openinfer.engine.model_runner import ModelRunner
from openinfer.engine.request import Request, RequestStream
from openinfer.sampling.sampler import SamplingParams
from openinfer.engine.scheduler import ScheduledRun, StepPlan

BS = 4


def request(rid: str, prompt: list[int], output: list[int], blocks: list[int]) -> Request:
    r = Request(rid, prompt, SamplingParams(), RequestStream(rid), 0.0, output_ids=output)
    r.block_ids = blocks
    return r


def per_run(plan: StepPlan) -> dict[str, np.ndarray]:
    ids, pos, slots, rows, qstart = [], [], [], [], [0]
    for run in plan.runs:
        r = run.req
        for p in range(run.start, run.start + run.length):
            ids.append(r.all_ids[p])
            pos.append(p)
            slots.append(r.block_ids[p // BS] * BS + p % BS)
        qstart.append(qstart[-1] + run.length)
        if run.samples:
            rows.append(qstart[-1] - 1)
    width = max(len(run.req.block_ids) for run in plan.runs)
    table = [run.req.block_ids + [0] * (width - len(run.req.block_ids)) for run in plan.runs]
    return dict(token_ids=ids, positions=pos, slot_mapping=slots, block_tables=table, query_start=qstart,
                context_lens=[run.start + run.length for run in plan.runs], sample_rows=rows)


def test_prepare_host_matches_a_per_run_construction():
    rng = np.random.default_rng(0)
    a = request("a", list(rng.integers(0, 99, 9)), [5, 6], [7, 3, 11])          # decode: token 10
    b = request("b", list(rng.integers(0, 99, 14)), [], [2, 9, 4, 8])          # prefill chunk 5 .. 12
    c = request("c", list(rng.integers(0, 99, 6)), [1, 2, 3], [12, 1, 13])     # prompt 4 .. output 8
    d = request("d", [4], [], [10])                                            # a one-token prompt
    plan = StepPlan([ScheduledRun(a, 10, 1, True), ScheduledRun(b, 5, 8, False), ScheduledRun(c, 4, 5, True),
                     ScheduledRun(d, 0, 1, True)])
    runner = ModelRunner(model=None, backend=None, pools=None, block_size=BS)
    h = runner.prepare_host(plan)
    for field, want in per_run(plan).items():
        got = getattr(h, field)
        np.testing.assert_array_equal(got, np.asarray(want), err_msg=field)
    assert (h.token_ids.dtype, h.positions.dtype, h.slot_mapping.dtype, h.block_tables.dtype) == (
        np.int32, np.int32, np.int64, np.int32)
    assert h.state_slots is None and not h.is_decode


def test_token_slice_is_the_all_ids_slice():
    r = request("r", [1, 2, 3], [4, 5], [])
    for start in range(6):
        for end in range(start, 6):
            assert r.token_slice(start, end) == r.all_ids[start:end]


def gathered_as_listed(tables, *reqs) -> None:   # noqa: ANN001
    """The tables' gather of `reqs` is each request's blocks padded with block 0."""
    width = max(len(r.block_ids) for r in reqs)
    want = [r.block_ids + [0] * (width - len(r.block_ids)) for r in reqs]
    np.testing.assert_array_equal(tables.gather(reqs), np.asarray(want, np.int32))


def test_block_tables_follow_growth_departures_and_replaced_lists():
    from openinfer.kv.block_tables import BlockTables
    tables = BlockTables(rows=2, width=2)
    a, b, c = request("a", [1], [], [5]), request("b", [1], [], [6, 7]), request("c", [1], [], [8])

    def check(*reqs):
        gathered_as_listed(tables, *reqs)

    check(a, b)
    a.block_ids.append(9)                 # grows in place
    check(b, a)
    check(a, b, c)                        # a third row: the table grows
    a.block_ids += [10, 11, 12]           # wider than the table
    check(c, a)                           # b left: its row is zeroed and reused
    b.block_ids = [13]                    # b returns with a new list
    c.block_ids = [14, 3]                 # replaced, same length as before plus one
    check(a, b, c)
    c = request("c", [1], [], [7, 3])     # a new request under c's id, its last block where c's was
    check(a, b, c)
    c.block_ids = [15]                    # replaced by a shorter list
    check(c)
    assert not tables.table[[r for r in range(tables.table.shape[0]) if r != tables.held["c"][1]]].any()


def test_block_tables_repeat_the_last_requests_copying_only_what_grew():
    from openinfer.kv.block_tables import BlockTables
    tables = BlockTables(rows=4, width=2)
    a, b, c = request("a", [1], [], [5]), request("b", [1], [], [6, 7]), request("c", [1], [], [8])

    def check(*reqs):
        gathered_as_listed(tables, *reqs)

    check(a, b, c)
    check(a, b, c)                        # a decode step that completed no block
    a.block_ids.append(9)                 # grows in place: the only row copied
    check(a, b, c)
    c.block_ids += [10, 11, 12]           # past the table's width: the table grows
    check(a, b, c)
    b.block_ids = [13]                    # replaced (another list): the full gather
    check(a, b, c)
    check(a, c)                           # b left: its row is zeroed and reused
    b.block_ids.append(14)
    check(a, b, c)
    assert tables.held["b"][2:] == (2, 14)


def test_graphs_capture_with_the_models_pdl_rows():
    """The backend captures decode graphs with PDL up to the model's pdl_decode_rows: 8 by default, every graph
    (None) for the lines measured faster so (the DeepSeek-V3 decoder, Qwen3.5)."""
    from types import SimpleNamespace

    from openinfer.contract.model_line import Model
    from openinfer.layers.mla_moe_decoder import MLAMoEDecoder
    from openinfer_qwen35.model import Qwen35Model
    from openinfer_qwen3.model import Qwen3Model
    asked = []

    class Backend:
        def decode_graphs(self, forward, max_num_seqs, max_model_len, block_size, state_slots=False, pdl_rows=None):
            asked.append(pdl_rows)
    for model in (Qwen3Model, MLAMoEDecoder, Qwen35Model):
        runner = ModelRunner(model=model.__new__(model), backend=Backend(), pools=SimpleNamespace(slots=None),
                             block_size=BS)
        runner.capture_graphs(16, 256)
    assert asked == [8, None, None] and Model.pdl_decode_rows == 8
