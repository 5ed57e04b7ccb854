"""CPU check of every qwen35_* CUDA launch (no GPU). The launchers run on host stand-ins for CuPy
arrays with `launch` recorded by openinfer.testing.launch_check, which checks each launch against
the kernel's compiled PTX parameters (count, sizes, floats, grid/block/shared-memory limits). On
top, each argument tuple is matched against the kernel's C signature parsed from the .cu source:
a pointer gets an array of the pointee's dtype, `long long` np.int64, `int` np.int32, `float`
np.float32 (CuPy passes numpy scalars by their dtype, so a wrong width shifts every later
argument). A pointer with a row stride argument after it must have a unit last stride and that
row stride; any other pointer must be packed, or null (NULL: the checkpoint arrays of a batch
without checkpoints). Decode launches must pass the batch's own index
arrays (a CUDA graph reads the static buffers) and a grid of the batch size alone."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer.plugin_api import ForwardBatch  # noqa: E402
from openinfer.plugin_api.cuda import NULL, blas, pdl, suffix  # noqa: E402
from openinfer.testing.launch_check import Launch, fake, record_launches  # noqa: E402
from openinfer_qwen35 import layers  # noqa: E402
from openinfer_qwen35.cuda import delta_rule, ops  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
CUDA_DIR = Path(ops.__file__).parent
SCALARS = {"long long": np.int64, "int": np.int32, "float": np.float32}
POINTEES = {"int": np.dtype(np.int32), "float": np.dtype(np.float32), "long long": np.dtype(np.int64)}


def signatures() -> dict[str, list[tuple[str, bool]]]:
    """kernel name (with {sfx} for the dtype suffix) -> [(base type, is pointer)] per parameter."""
    sigs = {}
    for path in CUDA_DIR.glob("*.cu"):
        text = path.read_text().replace("\\\n", " ")
        for name, params in re.findall(r'extern "C" __global__ void\s+(?:__launch_bounds__\([\w, *]+\)\s*)?([\w#]+)\s*'
                                       r'\(([^)]*)\)', text):
            parsed = []
            for p in params.split(","):
                p = " ".join(p.replace("const ", "").split()[:-1])
                parsed.append((p.rstrip("*").strip(), p.endswith("*")))
            sigs[name.replace("##suffix", "{sfx}")] = parsed
    return sigs


SIGS = signatures()


@pytest.fixture
def launches(monkeypatch):
    """Launchers on host stand-ins; returns the list of launches, each checked against its PTX parameters."""
    return record_launches(monkeypatch, (ops, delta_rule))


def zeros(shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zeroed host stand-in for a cupy array (FakeArray, 256-byte aligned)."""
    return fake(np.zeros(shape, dtype))


def check(call: Launch, dtype) -> None:
    """The C-signature checks: pointee dtypes, exact scalar types, strides and packing."""
    name, args = call.name, call.args
    sfx = suffix(dtype)
    key = name.replace(sfx, "{sfx}") if name.endswith(sfx) else name
    sig = SIGS[key]
    assert len(args) == len(sig), f"{name}: {len(args)} arguments for {len(sig)} parameters"
    for i, ((base, ptr), a) in enumerate(zip(sig, args)):
        where = f"{name} argument {i} ({base}{'*' if ptr else ''})"
        if not ptr:
            assert type(a) is SCALARS[base], f"{where}: got {type(a).__name__}"
            continue
        if a is NULL:
            continue
        assert isinstance(a, np.ndarray), f"{where}: got {type(a).__name__}"
        want = dtype if base in ("T", "bf16") else POINTEES[base]
        assert a.dtype == want, f"{where}: array of {a.dtype}"
        strided = i + 1 < len(sig) and sig[i + 1] == ("long long", False)
        if strided:
            assert a.strides[-1] == a.itemsize and a.strides[0] == int(args[i + 1]) * a.itemsize, where
            assert a[:1].flags.c_contiguous, f"{where}: rows must be packed inside"
        else:
            assert a.flags.c_contiguous, f"{where}: not packed"


def batch(runs: list[tuple[int, int]], checkpoints: list[int] | None = None) -> ForwardBatch:
    """`checkpoints`: per run, the tokens after which it saves its state part-way (0: none), to rows 4, 5, ..."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], np.int32)
    z = zeros(1, np.int32)
    b = ForwardBatch(z, z, z, z, fake(qs), fake(lens), z, qs, lens, 16, int(np.diff(qs).max()), int(lens.max()),
                     state_slots=fake(np.arange(1, len(runs) + 1, dtype=np.int32)))
    if checkpoints is not None:
        b.checkpoint_lens = fake(np.asarray(checkpoints, np.int32))
        b.checkpoint_rows = fake(np.arange(4, 4 + len(runs), dtype=np.int32))
    return b


def layer_forward(dtype, b: ForwardBatch, decode: bool, nk=16, nv=32, dk=128, dv=128, layers=3, fold=False) -> None:
    """The GDN mixer's op sequence on the views the model passes (layers.py): slices of the fused
    in_proj output, a layer's slice of the state pools; then the attention output gate. `fold`: the
    decode step with the output norm folded in (the layer's path); else the two ops it stands for."""
    T, C, K = int(b.query_start_host[-1]), 2 * nk * dk + nv * dv, 4
    proj = zeros((T, C + nv * dv + 2 * nv), dtype)
    conv_pool = zeros((5, layers, K - 1, C), np.float32)
    ssm_pool = zeros((5, layers, nv, dk, dv), np.float32)
    z = proj[:, C:C + nv * dv].reshape(T, nv, dv)
    bb, a = proj[:, C + nv * dv:C + nv * dv + nv], proj[:, C + nv * dv + nv:]
    conv_op = ops.qwen35_causal_conv1d_update if decode else ops.qwen35_causal_conv1d
    conv = conv_op(proj[:, :C], zeros((C, K), dtype), conv_pool[:, 1], b)
    q, k = conv[:, :nk * dk].reshape(T, nk, dk), conv[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
    v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
    if decode and fold:
        ops.qwen35_gdn_decode_norm(q, k, v, a, bb, zeros(nv, np.float32), zeros(nv, np.float32), ssm_pool[:, 1], b,
                                   z, fake(np.ones(dv, dtype)), 1e-6)
    else:
        if decode:   # the decode step computes its own gating
            o = ops.qwen35_gdn_decode(q, k, v, a, bb, zeros(nv, np.float32), zeros(nv, np.float32), ssm_pool[:, 1],
                                      b)
        else:
            g, beta = ops.qwen35_gdn_gating(a, bb, zeros(nv, np.float32), zeros(nv, np.float32))
            o = ops.qwen35_gated_delta_rule(q, k, v, g, beta, ssm_pool[:, 1], b)
        ops.qwen35_gated_rms_norm(o, z, fake(np.ones(dv, dtype)), 1e-6)
    qkvg = zeros((T, 4 * 256 * 3), dtype)
    ops.qwen35_sigmoid_gate(qkvg[:, :1024], qkvg[:, 2048:])


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=["bf16", "f32"])
@pytest.mark.parametrize("kind", ["prefill", "decode", "prefill_with_checkpoints", "decode_norm_fold"])
def test_launch_arguments_match_the_kernel_signatures(launches, monkeypatch, dtype, kind):
    decode, saves, fold = kind.startswith("decode"), kind == "prefill_with_checkpoints", kind == "decode_norm_fold"
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)   # it asks the (absent) GPU
    b = batch([(0, 1), (7, 1), (3, 1)] if decode else [(0, 70), (5, 1), (64, 130)], [48, 0, 16] if saves else None)
    layer_forward(dtype, b, decode, fold=fold)
    names = [c.name for c in launches]
    assert len(names) == (3 if fold else 4 if decode else 8 if saves else 7), names
    if saves:   # the chunk grid has room for the extra chunk a split adds
        prep = next(c for c in launches if c.name.startswith("gdn_chunk_prep"))
        assert prep.grid[0] == -(-130 // delta_rule.CHUNK) + 1
    for call in launches:
        check(call, dtype)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=["bf16", "f32"])
def test_gdn_decode_with_given_gates_launches(launches, dtype):
    """The decode update from gdn_gating's g and beta (the op qwen35_gdn_decode is checked against)."""
    nk, nv, dk, dv = 16, 32, 128, 128
    b = batch([(0, 1), (7, 1), (3, 1)])
    q, k, v = zeros((3, nk, dk), dtype), zeros((3, nk, dk), dtype), zeros((3, nv, dv), dtype)
    g, beta = ops.qwen35_gdn_gating(zeros((3, nv), dtype), zeros((3, nv), dtype), zeros(nv, np.float32),
                                    zeros(nv, np.float32))
    ops.qwen35_gated_delta_rule_update(q, k, v, g, beta, zeros((5, 3, nv, dk, dv), np.float32)[:, 1], b)
    assert [c.name.rsplit("_", 1)[0] for c in launches] == ["gdn_gating", "gdn_decode"]
    for call in launches:
        check(call, dtype)


@pytest.mark.parametrize("fold", [False, True], ids=["two_launches", "norm_fold"])
def test_decode_launches_are_graph_safe(launches, monkeypatch, fold):
    """The decode launches read the batch's own device index arrays, and their grids (and clusters)
    depend on the batch size alone (a replay runs the captured grid with whatever the buffers hold)."""
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)
    grids = []
    for runs in ([(0, 1), (7, 1), (3, 1)], [(500, 1), (1, 1), (90, 1)]):
        launches.clear()
        b = batch(runs)
        layer_forward(BF16, b, decode=True, fold=fold)
        for c in launches:
            if c.name.startswith(("conv_", "gdn_decode")):
                ids = {id(a) for a in c.args if isinstance(a, np.ndarray)}
                assert {id(b.state_slots), id(b.query_start), id(b.context_lens)} <= ids, c.name
        grids.append([(c.name, c.grid, c.cluster) for c in launches])
    assert grids[0] == grids[1]


def test_gated_rms_norm_rejects_a_head_past_the_register_rows(launches):
    """The kernel holds a row in registers (8 entries a lane): a wider head is refused before any launch."""
    x = zeros((1, 2, 288), BF16)
    with pytest.raises(ValueError, match="head dim 288"):
        ops.qwen35_gated_rms_norm(x, x, zeros(288, BF16), 1e-6)
    assert not launches
    ops.qwen35_gated_rms_norm(x[:, :, :256], x[:, :, :256], zeros(256, BF16), 1e-6)
    assert [c.name for c in launches] == ["gated_rms_norm_bf16"]


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=["bf16", "f32"])
@pytest.mark.parametrize("dv, cluster", [(16, None), (80, (3, 1, 1)), (128, (4, 1, 1)), (256, (8, 1, 1))])
def test_gdn_decode_norm_runs_a_head_as_one_cluster(launches, monkeypatch, dtype, dv, cluster):
    """The fold launches gdn_decode_gated's grid (ceil(dv / 32) column tiles, nv heads, B sequences) with a head's
    tiles as one cluster (none for a single tile), z's token stride and w after the state arguments, eps last."""
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)
    nk, nv, dk, B = 2, 6, 64, 3
    b = batch([(0, 1), (7, 1), (3, 1)])
    q, k, v = zeros((B, nk, dk), dtype), zeros((B, nk, dk), dtype), zeros((B, nv, dv), dtype)
    zw = zeros((B, nv * dv + 40), dtype)
    z = zw[:, 8:8 + nv * dv].reshape(B, nv, dv)   # a slice of the fused projection
    ab = zeros((B, 2 * nv + 3), dtype)
    o = ops.qwen35_gdn_decode_norm(q, k, v, ab[:, nv + 3:], ab[:, :nv], zeros(nv, np.float32), zeros(nv, np.float32),
                                   zeros((5, 3, nv, dk, dv), np.float32)[:, 1], b, z, zeros(dv, dtype), 1e-6)
    [call] = launches
    assert call.name == f"gdn_decode_gated_norm_{suffix(dtype)}"
    assert call.grid == (-(-dv // 32), nv, B) and call.block == delta_rule.DECODE_THREADS
    assert call.cluster == cluster
    assert call.name.startswith(pdl.KERNELS)   # on PDL by default ("gdn_decode")
    assert o.shape == (B, nv, dv) and o.dtype == dtype
    zarg = call.args[17]
    assert zarg.strides[0] == int(call.args[18]) * zarg.itemsize == zw.strides[0]
    assert call.args[-1] == np.float32(1e-6)
    check(call, dtype)


def test_gdn_decode_norm_falls_back_to_two_launches(launches, monkeypatch):
    """Without thread-block clusters (before sm_90) the op runs gdn_decode_gated then gated_rms_norm."""
    monkeypatch.setattr(blas, "clusters_supported", lambda: False)
    nk, nv, dk, dv, B = 2, 4, 64, 128, 2
    b = batch([(0, 1), (7, 1)])
    ab = zeros((B, 2 * nv), BF16)
    ops.qwen35_gdn_decode_norm(zeros((B, nk, dk), BF16), zeros((B, nk, dk), BF16), zeros((B, nv, dv), BF16),
                               ab[:, nv:], ab[:, :nv], zeros(nv, np.float32), zeros(nv, np.float32),
                               zeros((5, 3, nv, dk, dv), np.float32)[:, 1], b, zeros((B, nv, dv), BF16),
                               zeros(dv, BF16), 1e-6)
    assert [c.name for c in launches] == ["gdn_decode_gated_bf16", "gated_rms_norm_bf16"]
    assert all(c.cluster is None for c in launches)
    for call in launches:
        check(call, BF16)


def test_gdn_decode_norm_refuses_a_head_past_eight_tiles(launches, monkeypatch):
    """A head wider than a portable cluster's 8 column tiles is past gated_rms_norm's register rows too: refused
    before any launch, with or without clusters."""
    nk, nv, dk, dv, B = 2, 4, 64, 288, 2
    b = batch([(0, 1), (7, 1)])
    ab = zeros((B, 2 * nv), BF16)
    for clusters in (True, False):
        monkeypatch.setattr(blas, "clusters_supported", lambda: clusters)
        with pytest.raises(ValueError, match="head dim 288"):
            ops.qwen35_gdn_decode_norm(zeros((B, nk, dk), BF16), zeros((B, nk, dk), BF16), zeros((B, nv, dv), BF16),
                                       ab[:, nv:], ab[:, :nv], zeros(nv, np.float32), zeros(nv, np.float32),
                                       zeros((5, 3, nv, dk, dv), np.float32)[:, 1], b, zeros((B, nv, dv), BF16),
                                       zeros(dv, BF16), 1e-6)
    assert not launches


class _Pools:
    """StatePools.layer over two host pools (the GDN group's conv and ssm parts)."""

    def __init__(self, conv, ssm) -> None:
        self.parts = {"conv": conv, "ssm": ssm}

    def layer(self, group: str, part: str, index: int):
        assert group == layers.GDN_GROUP
        return self.parts[part][:, index]


def gdn_layer(nk: int, nv: int, dk: int, dv: int, H: int, K: int) -> tuple:
    """(layers.GatedDeltaNet on the CUDA ops with zero bf16 weights of these sizes and a stand-in linear, its
    weights, the weight shapes the linear was called with)."""
    C = 2 * nk * dk + nv * dv
    cfg = SimpleNamespace(linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk,
                          linear_value_head_dim=dv, conv_dim=C, rms_norm_eps=1e-6)
    w = layers.GDNWeights(in_proj=zeros((C + nv * dv + 2 * nv, H), BF16), conv=zeros((C, K), BF16),
                          A_log=zeros(nv, np.float32), dt_bias=zeros(nv, np.float32), norm=zeros(dv, BF16),
                          out_proj=zeros((H, nv * dv), BF16))
    linears = []

    def linear(x, weight):
        linears.append(weight.shape)
        return zeros((x.shape[0], weight.shape[0]), x.dtype)

    gdn_ops = SimpleNamespace(linear=linear, **{name: getattr(ops, name) for name in ops.__all__})
    return layers.GatedDeltaNet(gdn_ops, cfg, 1, w, lambda shape: zeros(shape, BF16)), w, linears


@pytest.mark.parametrize("clusters", [True, False], ids=["fold", "without_clusters"])
def test_gdn_layer_decode_launches(launches, monkeypatch, clusters):
    """layers.GatedDeltaNet's decode step: conv_update and the one gdn_decode_gated_norm in clusters of a head's 4
    column tiles; where the device has no clusters, conv_update, gdn_decode_gated and gated_rms_norm."""
    monkeypatch.setattr(blas, "clusters_supported", lambda: clusters)
    nk, nv, dk, dv, H, K = 16, 32, 128, 128, 64, 4
    mixer, w, linears = gdn_layer(nk, nv, dk, dv, H, K)
    C = 2 * nk * dk + nv * dv
    b = batch([(0, 1), (7, 1), (3, 1)])
    out = mixer(zeros((3, H), BF16), b, _Pools(zeros((5, 3, K - 1, C), np.float32),
                                               zeros((5, 3, nv, dk, dv), np.float32)))
    assert out.shape == (3, H) and linears == [w.in_proj.shape, w.out_proj.shape]
    names = [c.name for c in launches]
    if clusters:
        assert names == ["conv_update_bf16", "gdn_decode_gated_norm_bf16"]
        assert launches[1].cluster == (4, 1, 1) and launches[1].grid == (4, nv, 3)
    else:
        assert names == ["conv_update_bf16", "gdn_decode_gated_bf16", "gated_rms_norm_bf16"]
    for call in launches:
        check(call, BF16)


def test_gdn_layer_mixed_step_launches(launches, monkeypatch):
    """A mixed step (two decoding rows, then a 40-token prompt chunk and a 1-token prompt): the decoding rows take the
    decode step's launches over their own rows, sequences and state rows (conv_update, gdn_decode_gated_norm on 2
    sequences), the prompts the chunked ones over theirs (query starts from their first token)."""
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)
    nk, nv, dk, dv, H, K = 2, 4, 32, 32, 16, 4
    mixer, _, _ = gdn_layer(nk, nv, dk, dv, H, K)
    C = 2 * nk * dk + nv * dv
    b = batch([(9, 1), (4, 1), (0, 40), (0, 1)])
    out = mixer(zeros((43, H), BF16), b, _Pools(zeros((6, 3, K - 1, C), np.float32),
                                                zeros((6, 3, nv, dk, dv), np.float32)))
    assert out.shape == (43, H)
    names = [c.name for c in launches]
    assert names[:2] == ["conv_update_bf16", "gdn_decode_gated_norm_bf16"] and launches[1].grid[2] == 2
    assert names[2] == "conv_prefill_bf16" and launches[2].grid[2] == 2 and "gdn_decode" not in " ".join(names[2:])
    slots, qs, ctx = (np.asarray(a) for a in launches[2].args[5:8])
    assert slots.tolist() == [3, 4] and qs.tolist() == [0, 40, 41] and ctx.tolist() == [40, 1]
    assert np.asarray(launches[0].args[5]).tolist() == [1, 2]   # the decoding rows' state rows
    for call in launches:
        check(call, BF16)

