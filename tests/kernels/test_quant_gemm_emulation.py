"""CPU emulation of the tensor-core path of the quantized routed experts (no GPU): quant.moe_experts_quant at
prefill-sized batches, its recorded launches (moe_align, quant.cu's moe_gate_up_<fmt>_m<MT> / moe_down_<fmt>_m<MT>,
the combine) run lane by lane through test_moe_emulation's grouped-GEMM model with quant.cu's QuantExperts policy
modelled byte by byte: the stages' packed chunks and 4-byte scale words as cp.async leaves them, the chunks expanded
into the bf16 tile with the kernels' bit tricks (test_quant_launch_args' models of Int4::expand_bf16 /
Fp8::expand_bf16, checked there on every nibble and byte), each tile value times its scale the reference's dequantized
weight to the bit; against numpy_quant.moe_experts_quant. Also the path choice and launch arguments at Kimi-K2's width.
Mirrors the kernels: change both together."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")
from fake_device import flat, run  # noqa: E402
from openinfer.kernels import numpy_quant  # noqa: E402
from openinfer.kernels.cuda import module, moe, quant  # noqa: E402
from openinfer.kernels.cuda.moe import BF16_TILE_BYTES, GEMM_BK, GEMM_BN, GEMM_STAGES, gemm_smem  # noqa: E402
from openinfer.quant import Fp8Weight, Int4Weight  # noqa: E402
from openinfer.quant.int4 import tile_position  # noqa: E402
from openinfer.testing.launch_check import fake, record_launches  # noqa: E402
from test_attention_mma_emulation import bf  # noqa: E402
from test_moe_emulation import LD, emulate_align, emulate_tiles  # noqa: E402
from test_quant_launch_args import _random_stack, fp8_expand_bf16, int4_expand_bf16  # noqa: E402

BF16 = module.BF16
CHUNK = {"int4": 32, "fp8": 16}     # weights of a 16-byte chunk (Int4::CHUNK, Fp8::CHUNK)
GROUP = {"int4": 32, "fp8": 128}    # weights of a scale


class QuantRows:
    """quant.cu's QuantExperts<F, S> at expert e of a stack: a stage is bytes (64 rows x RAW chunks, then a 4-byte
    scale word a row), tile() expands them into a NaN-initialised bf16 [64, LD] tile."""

    def __init__(self, fmt, q, s, e, rows, K, ref, stages=GEMM_STAGES):
        self.fmt, self.K, self.ref, self.n = fmt, K, ref, rows   # ref: the expert's dequantized [rows, K] weights
        self.raw = GEMM_BK // CHUNK[fmt]
        ns = max(1, GEMM_BK // GROUP[fmt])
        self.group_kk = GEMM_BK // 16 // ns
        self.row_bytes, self.scale_cols = K // CHUNK[fmt] * 16, -(-K // GROUP[fmt])
        if fmt == "int4":   # Int4Tiles: chunk pairs of scales
            self.scale_cols = 2 * -(-self.scale_cols // 2)
        self.q = flat(q).view(np.uint8)[e * rows * self.row_bytes:]
        self.ssize = s.itemsize
        self.s = flat(s).view(np.uint8)[e * rows * self.scale_cols * self.ssize:]
        self.scales = GEMM_BN * self.raw * 16
        self.st = np.zeros((stages, self.scales + GEMM_BN * 4), np.uint8)
        self.written = np.zeros(self.st.shape, bool)
        self.rows, self.k0 = [None] * stages, [None] * stages

    def load(self, stage, k0, rows):
        self.rows[stage], self.k0[stage] = list(rows), k0
        for i in range(GEMM_BN * self.raw):   # copy(i): chunk i % RAW of row i / RAW
            r, c = divmod(i, self.raw)
            k = k0 + c * CHUNK[self.fmt]
            ok = rows[r] >= 0 and k < self.K
            src = self._chunk_index(rows[r], k // CHUNK[self.fmt]) * 16
            self.st[stage, i * 16: i * 16 + 16] = self.q[src: src + 16] if ok else 0
            self.written[stage, i * 16: i * 16 + 16] = True
        for r in range(GEMM_BN):   # then each row's scale word
            src = self._scale_index(rows[r], k0 // CHUNK[self.fmt]) * self.ssize
            at = self.scales + r * 4
            assert src % 4 == 0, "a 4-byte cp.async reads an aligned word"
            self.st[stage, at: at + 4] = self.s[src: src + 4] if rows[r] >= 0 else 0
            self.written[stage, at: at + 4] = True

    def _chunk_index(self, row, c):
        """Int4Tiles / Fp8 chunk_index of the expert's row `row` (quant.cuh)."""
        if self.fmt == "fp8":
            return row * (self.K // 16) + c
        tile, i = tile_position(row, self.n)
        return (tile * (self.K // 32) + c) * 16 + i

    def _scale_index(self, row, c):
        if self.fmt == "fp8":
            return row * self.scale_cols + c // 8
        tile, i = tile_position(row, self.n)
        return (tile * self.scale_cols + c - c % 2) * 16 + 2 * i + c % 2

    def tile(self, stage):
        dq = np.full((GEMM_BN, LD), np.nan, np.float32)
        for i in range(GEMM_BN * self.raw):
            assert self.written[stage, i * 16: i * 16 + 16].all(), "a chunk expanded before it was copied"
            words = self.st[stage, i * 16: i * 16 + 16].view(np.uint32)
            vals = (int4_expand_bf16(words) if self.fmt == "int4" else fp8_expand_bf16(words)).reshape(-1)
            np.testing.assert_array_equal(bf(vals), vals)   # bf16 values: the tile holds them as they are
            r, c = divmod(i, self.raw)
            dq[r, c * CHUNK[self.fmt]: (c + 1) * CHUNK[self.fmt]] = vals
        self._check_exact(stage, dq)
        return dq.ravel()

    def scale(self, stage, r, g):
        at = self.scales + r * 4 + g * self.ssize
        assert self.written[stage, at: at + self.ssize].all()
        word = self.st[stage, at: at + self.ssize]
        v = (word.view(np.uint16).astype(np.uint32) << 16).view(np.float32)[0] if self.ssize == 2 \
            else word.view(np.float32)[0]
        return np.float32(v)

    def _check_exact(self, stage, dq):
        """Each tile value times its group's scale is the reference's dequantized weight, bit for bit."""
        k0, span = self.k0[stage], 16 * self.group_kk
        for r, row in enumerate(self.rows[stage]):
            if row >= 0:
                s = np.repeat([self.scale(stage, r, g) for g in range(GEMM_BK // span)], span).astype(np.float32)
                np.testing.assert_array_equal(dq[r, :GEMM_BK] * s, self.ref[row, k0: k0 + GEMM_BK])


def emulate_qgemm(call, stacks):
    """moe_gate_up_<fmt>_m<MT> / moe_down_<fmt>_m<MT> on their recorded arguments."""
    fmt = call.name.split("_")[-2]
    gate_up = call.name.startswith("moe_gate_up")
    q, s = call.args[4:6]
    host = stacks["gate_up" if gate_up else "down"]
    rows = host.shape[1]
    mt = emulate_tiles(call, lambda e, N, K, stages: QuantRows(fmt, q, s, e, rows, K, host.dequant(e), stages))
    assert call.smem == gemm_smem(mt, quant.mma_stage_bytes(fmt), BF16_TILE_BYTES)
    assert call.block == moe.GEMM_THREADS


def emulate_qcombine(call):
    """quant.cu's moe_combine: each token's local pairs in slot order, plus the addend, rounded once."""
    yk, ids, k, D, E_local, offset, addend, y = call.args
    k, D = int(k), int(D)
    T = call.grid[0]
    local = flat(ids)[: T * k].reshape(T, k) - int(offset)
    rows = flat(yk)[: T * k * D].reshape(T, k, D)
    acc = np.where(((local >= 0) & (local < int(E_local)))[..., None], rows, 0).sum(axis=1, dtype=np.float32)
    if addend is not module.NULL:
        acc += flat(addend)[: T * D].reshape(T, D).astype(np.float32)
    flat(y)[: T * D] = acc.ravel()


@pytest.fixture
def launches(monkeypatch):
    return record_launches(monkeypatch, (quant, moe, module))


def _device_stack(w):
    """A host stack as the kernels get it: INT4 scales in bf16 (their reference values too), FP8 as they are."""
    if isinstance(w, Int4Weight):
        w = w.tiles()
        return Int4Weight(fake(w.packed), fake(w.scale, BF16), True)
    return Fp8Weight(fake(w.data), fake(w.scale, np.float32))


def _host_stack(w):
    return type(w)(*(np.asarray(a) if hasattr(a, "shape") else a for a in vars(w).values()))


# T tokens, top-k, local experts, offset, expected row tile: 32-row tiles (>= 16 pairs an expert on average) with
# one expert taking most pairs (several tiles, a ragged last one); 128-row tiles (>= 64) across an expert-parallel
# shard, pairs on other ranks left out. D 256 (four k tiles: the pipeline's refills; FP8's 128-blocks over two) and
# I 128 (two).
CASES = {"m2_uneven": (24, 3, 3, 0, 32), "m8_shard": (72, 2, 2, 1, 128)}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("case", list(CASES))
def test_quant_gemm_emulation(fmt, case, launches):
    T, k, E, offset, tile_rows = CASES[case]
    D, I = 256, 128
    rng = np.random.default_rng(len(case) + len(fmt))
    gate_up = _device_stack(_random_stack(rng, fmt, E, 2 * I, D))
    down = _device_stack(_random_stack(rng, fmt, E, D, I))
    host = {"gate_up": _host_stack(gate_up), "down": _host_stack(down)}
    x = fake(rng.standard_normal((T, D)), BF16)
    ids = np.argsort(rng.random((T, E + 2)), axis=-1)[:, :k].astype(np.int32)   # experts 0 .. E + 1: some elsewhere
    if case == "m2_uneven":
        ids[:, 0] = ids[: T // 2, 1] = offset + 1   # one expert's pairs over two tiles, the second ragged
    weights = rng.random((T, k)).astype(np.float32)
    addend = fake(rng.standard_normal((T, D)), BF16)
    assert quant.expert_tile_rows(BF16, T, k, E, D, I) == tile_rows
    y = quant.moe_experts_quant(x, gate_up, down, fake(ids), fake(weights), offset, addend)
    mt = tile_rows // 16
    assert [c.name for c in launches] == ["moe_align", f"moe_gate_up_{fmt}_m{mt}", f"moe_down_{fmt}_m{mt}",
                                          "moe_combine_bf16"]
    run(launches, {"moe_align": lambda c: emulate_align(c, rng), "moe_gate_up": lambda c: emulate_qgemm(c, host),
                   "moe_down": lambda c: emulate_qgemm(c, host), "moe_combine": emulate_qcombine})
    xf = np.asarray(x, np.float32)
    want = numpy_quant.moe_experts_quant(xf, host["gate_up"], host["down"], ids, weights, offset,
                                         np.asarray(addend, np.float32))
    # h is rounded to bf16 for the down GEMM's mma (the numpy reference keeps float32)
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=2e-2, atol=2e-2)


def _kimi_stacks(fmt, E):
    D, I = 7168, 2048
    if fmt == "int4":
        return (_device_stack(Int4Weight(np.zeros((E, 2 * I, D // 8), np.int32), np.zeros((E, 2 * I, D // 32)))),
                _device_stack(Int4Weight(np.zeros((E, D, I // 8), np.int32), np.zeros((E, D, I // 32)))))
    return (Fp8Weight(fake(np.zeros((E, 2 * I, D), np.uint8)), fake(np.zeros((E, 2 * I, D // 128), np.float32))),
            Fp8Weight(fake(np.zeros((E, D, I), np.uint8)), fake(np.zeros((E, D, I // 128), np.float32))))


def test_kimi_path_choice():
    """Kimi-K2's 384 experts, top-8, hidden 7168, width 2048: a decode batch of 128 (~3 pairs an expert) stays on the
    GEMV kernels, a 1k-token prefill chunk (~21) takes 32-row tiles, 4096 tokens (~85) 128-row tiles."""
    assert [quant.expert_tile_rows(BF16, T, 8, 384, 7168, 2048) for T in (1, 128, 767, 768, 1024, 3071, 4096)] == \
        [0, 0, 0, 32, 32, 32, 128]


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_kimi_width_launches(launches, fmt):
    """The GEMM launches at Kimi-K2's expert width (three experts: the grids' x depends only on the shape): 16 and
    64 pairs an expert take the 32- and 128-row tiles, grids sized for the most tiles any routing gives
    (moe.row_tiles), shared memory within sm_90's opt-in limit."""
    E, k, D, I = 3, 8, 7168, 2048
    gu, dn = _kimi_stacks(fmt, E)
    for T, mt in ((6, 2), (24, 8)):
        launches.clear()
        quant.moe_experts_quant(fake(np.zeros((T, D)), BF16), gu, dn, fake(np.zeros((T, k), np.int32)),
                                fake(np.ones((T, k), np.float32)), 0)
        assert [c.name for c in launches] == ["moe_align", f"moe_gate_up_{fmt}_m{mt}", f"moe_down_{fmt}_m{mt}",
                                              "moe_combine_bf16"]
        align, gate, down, combine = launches
        tiles = moe.row_tiles(T * k, E, mt)
        assert int(align.args[4]) == 16 * mt
        assert (gate.grid, down.grid, combine.grid[0]) == ((I // 32, tiles), (D // 64, tiles), T)
        assert gate.smem == down.smem == gemm_smem(mt, quant.mma_stage_bytes(fmt), BF16_TILE_BYTES) <= 227 * 1024


def test_passes_choose_their_path(launches, monkeypatch):
    """Tokens beyond MMA_CHUNK run in passes, each on the path its own token count picks: two full passes on the
    GEMM, a short last one on the decode kernels (INT4 on bf16: quant_mma.cu's)."""
    monkeypatch.setattr(quant, "MMA_CHUNK", 16)
    gu, dn = (_device_stack(_random_stack(np.random.default_rng(0), "int4", 2, r, c)) for r, c in ((256, 256),
                                                                                                  (256, 128)))
    quant.moe_experts_quant(fake(np.zeros((40, 256)), BF16), gu, dn, fake(np.zeros((40, 2), np.int32)),
                            fake(np.ones((40, 2), np.float32)), 0)
    mma = ["moe_align", "moe_gate_up_int4_m2", "moe_down_int4_m2", "moe_combine_bf16"]
    gemv = ["moe_plan", "moe_q_mma_gate_up_int4", "moe_q_mma_down_int4", "moe_combine_bf16"]
    assert [c.name for c in launches] == mma * 2 + gemv
    assert [c.grid[0] for c in launches if c.name == "moe_combine_bf16"] == [16, 16, 8]


def test_gemv_where_the_gemm_does_not_apply():
    """float32 activations, widths off the 64-column k tiles and more experts than moe_align takes stay on the GEMV
    kernels, whatever the batch."""
    assert quant.expert_tile_rows(np.float32, 4096, 8, 16, 256, 128) == 0
    assert quant.expert_tile_rows(BF16, 4096, 8, 16, 256, 96) == 0
    assert quant.expert_tile_rows(BF16, 4096, 8, 16, 288, 128) == 0
    assert quant.expert_tile_rows(BF16, 1 << 20, 8, moe.ALIGN_MAX_EXPERTS + 1, 256, 128) == 0
    assert quant.expert_tile_rows(BF16, 4096, 8, 16, 256, 128) == 128
