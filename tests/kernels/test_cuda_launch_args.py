"""CPU check of every core kernel launch's arguments against the kernel's compiled parameter list
(no GPU), through openinfer.testing.launch_check: the launchers run on host stand-ins for cupy
arrays with `launch` recording, and each launch is checked against the kernel's PTX parameters."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.engine.batch import ForwardBatch  # noqa: E402
from openinfer.kernels.cuda import (attention, attention_decode, blas, module, ops, pdl,  # noqa: E402
                                    random_fill, sampler)
from openinfer.sampling.sampler import SamplingParams  # noqa: E402
from openinfer.sampling.batch import NUM_FIELDS, ROW, SampleRow, build_batch  # noqa: E402
from openinfer.testing.launch_check import aligned_empty, fake, record_launches  # noqa: E402

BF16 = module.BF16


@pytest.fixture
def launches(monkeypatch):
    """Launchers on host stand-ins; returns the list of checked launches."""
    recorded = record_launches(monkeypatch, (attention, attention_decode, blas, module, ops, random_fill,
                                             sampler))
    monkeypatch.setattr(attention_decode, "sm_count", lambda: 132)
    monkeypatch.setattr(attention_decode, "blocks_per_sm", lambda *a: 4)
    monkeypatch.setattr(blas, "gemv_resident", lambda name: 4 * 132)
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)
    monkeypatch.setattr(attention, "hopper", lambda: False)   # it asks the (absent) GPU; tests that want sm_90 say so
    counters = {}   # raw device memory in real life: one region per purpose

    def arrival_counters(purpose):
        return counters.setdefault(purpose, aligned_empty((module.COUNTER_SLOTS,), np.int32))
    monkeypatch.setattr(attention_decode, "arrival_counters", arrival_counters)
    return recorded


def test_split_decode_launches_without_clusters(launches):
    """Split decode launches no thread-block cluster: every split stores a part, merged through the counters.
    Qwen3-4B at batch 1 under a 20480-key graph width: 16 splits a KV head (DECODE_CAP, 1280 keys each), one block
    each."""
    pool = aligned_empty((2, 1 + 64, 1, 16, 8, 128), BF16)
    q = aligned_empty((1, 32, 128), BF16)
    attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], _batch([1], [20480], 16, 64), 0.125)
    (call,) = launches
    assert call.grid == (16, 8, 1) and call.cluster is None and call.args[-8] is not module.NULL
    assert [int(a) for a in call.args[-4:]] == [64, attention_decode.DECODE_NEAR, attention_decode.DECODE_CAP, 16]


def _batch(q_lens, ctx, bs, width) -> ForwardBatch:
    qstart = np.concatenate(([0], np.cumsum(q_lens))).astype(np.int32)
    T = int(qstart[-1])
    tables = np.arange(len(ctx) * width, dtype=np.int32).reshape(len(ctx), width) + 1
    return ForwardBatch(fake(np.zeros(T, np.int32)), fake(np.arange(T, dtype=np.int32)),
                        fake(np.arange(T, dtype=np.int64)), fake(tables), fake(qstart),
                        fake(np.asarray(ctx, np.int32)), fake(qstart[1:] - 1), qstart, np.asarray(ctx, np.int32),
                        bs, int(max(q_lens)), int(max(ctx)))


@pytest.mark.parametrize("dtype", [BF16, np.float32])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("q_lens,ctx", [([1, 1, 1], [5000, 17, 900]), ([1] * 64, [30] * 64),   # decode, split / not
                                         ([7, 1, 33], [7, 40, 300])])                          # prefill
def test_paged_attention_launch_args(launches, dtype, d, q_lens, ctx):
    nh, nkv, bs, layers = 24, 4, 16, 3
    width = -(-max(ctx) // bs)
    pool = aligned_empty((2, 1 + len(ctx) * width, layers, bs, nkv, d), dtype)   # [k/v, blocks, layer, ...]
    T = sum(q_lens)
    qkv = aligned_empty((T, (nh + 2 * nkv) * d), dtype)     # q: a slice of the fused projection
    q = qkv[:, : nh * d].reshape(T, nh, d)
    attention.paged_attention(q, pool[0, :, 1], pool[1, :, 1], _batch(q_lens, ctx, bs, width), 0.125)
    (call,) = launches   # decode merges its splits in the kernel: no combine launch
    assert str(d) in call.name
    if max(q_lens) == 1:
        assert call.name.startswith("paged_decode_mma" if dtype == BF16 else "paged_decode_"), call.name
        kernel = attention_decode.decode_kernel(module.suffix(dtype), d, np.dtype(dtype).itemsize, dtype == BF16)
        groups, counters = call.grid[0], call.args[-8]
        split_keys, near, cap, slots = (int(a) for a in call.args[-4:])
        assert slots == attention_decode.decode_split(max(ctx), kernel)[0] and 1 <= groups <= slots
        assert (slots > 1) == (max(ctx) == 5000), call.args[-4:]   # only the long context splits
        assert call.cluster is None and (counters is not module.NULL) == (slots > 1)
        assert split_keys == attention_decode.split_keys(kernel) and split_keys % kernel.pass_len == 0
        assert (near, cap) == (attention_decode.DECODE_NEAR, attention_decode.DECODE_CAP)
        assert slots <= attention_decode.merge_max_splits(kernel)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("q_lens,ctx", [([1, 1, 1], [5000, 17, 900]), ([7, 1, 33], [7, 40, 300])])
@pytest.mark.parametrize("impl", ["wgmma", "mma", "cuda_cores"])
@pytest.mark.parametrize("hopper", [True, False])
def test_fp8_cache_attention_launch_args(launches, monkeypatch, d, q_lens, ctx, impl, hopper):
    """fp8 caches (e4m3 bytes) take the tensor-core kernels' kv8 forms in every implementation, their shared
    memory sized for their fp8 stages (and the prefill kernels' converted f16 tiles): d128 prefill on warpgroup MMA
    on sm_90, mma.sync elsewhere."""
    monkeypatch.setattr(attention, "hopper", lambda: hopper)
    nh, nkv, bs, layers = 16, 4, 16, 3
    width = -(-max(ctx) // bs)
    pool = aligned_empty((2, 1 + len(ctx) * width, layers, bs, nkv, d), np.uint8)
    T = sum(q_lens)
    q = aligned_empty((T, (nh + 2 * nkv) * d), BF16)[:, : nh * d].reshape(T, nh, d)
    fn = {"wgmma": attention.paged_attention, "mma": attention.paged_attention_mma,
          "cuda_cores": attention.paged_attention_cuda_cores}[impl]
    fn(q, pool[0, :, 1], pool[1, :, 1], _batch(q_lens, ctx, bs, width), 0.125)
    (call,) = launches
    decode, wgmma = max(q_lens) == 1, max(q_lens) > 1 and d == 128 and hopper
    if wgmma:
        assert call.name == "paged_prefill_wgmma_bf16_kv8_d128" and call.block == 256
        assert call.grid == (-(-33 * 4 // 128), nkv, 3) and call.smem == attention.wgmma_prefill_smem(kv8=True)
    else:
        assert call.name == f"paged_{'decode' if decode else 'prefill'}_mma_bf16_kv8_d{d}", call.name
        assert call.smem == (attention_decode.mma_decode_smem(d, kv8=True) if decode
                             else attention.mma_prefill_smem(d, kv8=True))
    assert int(call.args[4]) == pool[0, :, 1].strides[0]   # the block stride in elements: bytes
    with pytest.raises(ValueError, match="an fp8 KV cache needs bf16 activations"):
        fn(q.astype(np.float32), pool[0, :, 1], pool[1, :, 1], _batch(q_lens, ctx, bs, width), 0.125)


def test_fp8_cache_writes(launches):
    """Into fp8 caches write_kv takes its e4m3 kernel (two elements a thread), and rope_write_kv runs as the
    rope (QK-norm) kernel and that write."""
    T, nh, nkv, d, bs = 5, 8, 2, 128, 16
    qkv = aligned_empty((T, (nh + 2 * nkv) * d), BF16)
    q = qkv[:, : nh * d].reshape(T, nh, d)
    k = qkv[:, nh * d: (nh + nkv) * d].reshape(T, nkv, d)
    v = qkv[:, (nh + nkv) * d:].reshape(T, nkv, d)
    pool = aligned_empty((2, 9, 3, bs, nkv, d), np.uint8)
    cos = sin = aligned_empty((64, 32), np.float32)
    pos, slots = np.arange(T, dtype=np.int32), np.arange(T, dtype=np.int64)
    w = aligned_empty((d,), BF16)
    ops.write_kv(pool[0, :, 1], pool[1, :, 1], k, v, slots)
    ops.rope_write_kv(q, k, v, w, w, 1e-6, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.rope_write_kv(q, k, v, None, None, 0.0, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    names = [c.name for c in launches]
    assert names[::2] == ["write_kv_fp8_bf16"] * 3, names
    assert names[1].startswith("qk_norm_rope_") and names[3].startswith("qk_norm_rope_"), names   # rope: no weights
    assert launches[0].block == nkv * d // 2


@pytest.mark.parametrize("dtype,mma", [(BF16, True), (BF16, False), (np.float32, False)])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_split_rule_fits_every_merge(launches, monkeypatch, dtype, mma, d):
    """The rule's most splits (DECODE_CAP, however long the context) fit the weights the merging block keeps in
    its shared memory; a 100k context at batch 1 launches them. A rule past that is refused, naming the knobs."""
    kernel = attention_decode.decode_kernel(module.suffix(dtype), d, np.dtype(dtype).itemsize, mma)
    assert attention_decode.decode_split(10 ** 8, kernel)[0] == attention_decode.DECODE_CAP
    assert attention_decode.DECODE_CAP <= attention_decode.merge_max_splits(kernel)
    ctx = 100000
    pool = aligned_empty((2, 2, 1, 16, 1, d), dtype)
    impl = attention.paged_attention if mma else attention.paged_attention_cuda_cores
    impl(aligned_empty((1, 2, d), dtype), pool[0, :, 0], pool[1, :, 0], _batch([1], [ctx], 16, -(-ctx // 16)), 0.125)
    (call,) = launches
    assert call.grid == (attention_decode.DECODE_CAP, 1, 1) and int(call.args[-1]) == attention_decode.DECODE_CAP
    monkeypatch.setattr(attention_decode, "DECODE_CAP", attention_decode.merge_max_splits(kernel) + 1)
    with pytest.raises(ValueError, match="DECODE_NEAR / DECODE_CAP"):
        impl(aligned_empty((1, 2, d), dtype), pool[0, :, 0], pool[1, :, 0], _batch([1], [10 ** 8], 16, 1), 0.125)


@pytest.mark.parametrize("keys,want,slots", [(1, 64, (4, 16)), (64, 64, (4, 16)), (100, 128, (4, 16)),
                                             (512, 512, (2, 10))])
@pytest.mark.parametrize("width", [1024, 20480])
def test_decode_split_keys_set_the_shortest_split(launches, monkeypatch, keys, want, slots, width):
    """DECODE_SPLIT_KEYS reaches the kernel in whole 64-key passes and, with DECODE_NEAR and DECODE_CAP, sets the
    partial slots: the splits of a max_context_len context (1024 eager, 20480 a CUDA graph's width). Batch 1
    launches a block for each slot."""
    monkeypatch.setattr(attention_decode, "DECODE_SPLIT_KEYS", keys)
    pool = aligned_empty((2, 1 + 64, 1, 16, 8, 128), BF16)
    q = aligned_empty((1, 32, 128), BF16)
    attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], _batch([1], [width], 16, 64), 0.125)
    (call,) = launches
    want_slots = slots[width == 20480]
    assert int(call.args[-4]) == want and int(call.args[-1]) == want_slots
    assert call.grid[0] == want_slots


@pytest.mark.parametrize("seqs,groups", [(1, 4), (5, 4), (32, 2), (66, 1), (128, 1)])
def test_decode_splits_fill_one_wave(launches, seqs, groups):
    """Qwen3-4B decode at 1k context (8 KV heads, 4 blocks an SM on 132 SMs: 528 places): each sequence has 4
    splits; the grid runs them on the most blocks that fit in one wave, a block taking several in turn; a batch
    whose blocks already fill the machine takes one block a (sequence, KV head)."""
    d, ctx, bs = 128, 1024, 16
    width = -(-ctx // bs)
    pool = aligned_empty((2, 1 + seqs * width, 1, bs, 8, d), BF16)
    q = aligned_empty((seqs, 32, d), BF16)
    attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], _batch([1] * seqs, [ctx] * seqs, bs, width), 0.125)
    (call,) = launches
    assert call.grid == (groups, 8, seqs) and call.cluster is None and int(call.args[-1]) == 4
    assert groups == 1 or groups * 8 * seqs <= 4 * 132


def test_decode_launches_fit_the_counters(launches):
    """A batch with more (sequence, KV head) pairs than arrival counters (600 x 8 > 4096) is launched in runs of
    512 sequences, each with its own partials and the block tables, query starts and contexts from its first
    sequence on; every launch counts from counter 0."""
    seqs, ctx, bs, d = 600, 100, 16, 64
    pool = aligned_empty((2, 2, 1, bs, 8, d), BF16)
    q = aligned_empty((seqs, 32, d), BF16)
    batch = _batch([1] * seqs, [ctx] * seqs, bs, -(-ctx // bs))
    attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], batch, 0.125)
    assert [c.grid for c in launches] == [(1, 8, 512), (1, 8, 88)]
    for call, b0 in zip(launches, (0, 512)):
        tables, qstart, ctxs, part_o = call.args[7], call.args[9], call.args[10], call.args[12]
        assert tables.data.ptr == batch.block_tables[b0:].data.ptr and int(qstart[0]) == b0
        assert ctxs.data.ptr == batch.context_lens[b0:].data.ptr
        assert part_o.shape == (call.grid[2], 32, 2, d)   # 100 keys: 2 splits


def test_decode_without_counters(launches, monkeypatch):
    """A decode captured before any ran eagerly has no arrival counters: a context that splits is refused with
    what to do (running it unsplit would round it unlike every eager step); one that does not split runs."""
    monkeypatch.setattr(attention_decode, "arrival_counters", lambda purpose: None)
    pool = aligned_empty((2, 1 + 64, 1, 16, 8, 128), BF16)
    q = aligned_empty((1, 32, 128), BF16)
    with pytest.raises(RuntimeError, match="eagerly before capturing"):
        attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], _batch([1], [1024], 16, 64), 0.125)
    attention.paged_attention(q, pool[0, :, 0], pool[1, :, 0], _batch([1], [64], 16, 64), 0.125)
    (call,) = launches
    assert call.grid == (1, 8, 1) and call.args[-8] is module.NULL


@pytest.mark.parametrize("d,dtype,hopper", [(128, BF16, True), (64, BF16, True), (128, np.float32, True),
                                            (128, BF16, False)])
def test_wgmma_prefill_launch_args(launches, monkeypatch, d, dtype, hopper):
    """The "wgmma" implementation sends d128 bf16 prefill to the wgmma kernel on sm_90 only."""
    monkeypatch.setattr(attention, "hopper", lambda: hopper)
    nh, nkv, bs, q_lens, ctx = 32, 8, 16, [7, 200, 33], [7, 260, 300]
    width = -(-max(ctx) // bs)
    pool = aligned_empty((2, 1 + len(ctx) * width, 2, bs, nkv, d), dtype)
    T = sum(q_lens)
    q = aligned_empty((T, (nh + 2 * nkv) * d), dtype)[:, : nh * d].reshape(T, nh, d)
    attention.paged_attention(q, pool[0, :, 1], pool[1, :, 1], _batch(q_lens, ctx, bs, width), 0.125)
    (call,) = launches
    if d == 128 and dtype == BF16 and hopper:
        assert call.name == "paged_prefill_wgmma_bf16_d128" and call.block == 256
        assert call.grid == (-(-200 * 4 // 128), nkv, 3) and call.smem == attention.wgmma_prefill_smem()
    else:
        assert "wgmma" not in call.name


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(128, 4096), (4096, 1024), (151936, 64)])
def test_linear_gemv_launch_args(launches, m, n, k):
    x = aligned_empty((m, k), BF16)
    w = aligned_empty((n, k), BF16)
    blas.linear(x, w)
    assert [(c.source, c.name) for c in launches] == [("gemv", "gemv_bf16")]


def test_pdl_names_kernels(monkeypatch):
    """PDL for the kernels whose names start with one of pdl.KERNELS only."""
    assert pdl.KERNELS[:2] == ("gemv", "paged_decode")
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "KERNELS", ("gemv",))
    assert not pdl.enabled("add_rms_norm_v_bf16")   # decided by name before the device is asked
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert not pdl.enabled("gemv_bf16")


def test_a_dependent_launch_takes_pdl_whatever_its_name(monkeypatch):
    """launch(..., dependent=True), a plugin's kernel outside pdl.KERNELS that waits first: through cuLaunchKernelEx
    with PDL where it is available; the same kernel launched plainly goes through CuPy."""
    seen = []

    class Kernel:
        kernel = SimpleNamespace(ptr=9)

        def __call__(self, grid, block, args, shared_mem=0):
            seen.append("cupy")

    monkeypatch.setattr(module, "_function_with_smem", lambda *_: Kernel())
    monkeypatch.setattr(pdl, "available", lambda: True)
    monkeypatch.setattr(pdl, "launch", lambda *_, pdl_on, cluster: seen.append(("pdl", pdl_on)))
    module.launch("dsa", "indexer_scores_bf16", (1,), 32, (), dependent=True)
    module.launch("dsa", "indexer_scores_bf16", (1,), 32, ())
    assert seen == [("pdl", True), "cupy"]


@pytest.mark.parametrize("static,dynamic,opted_in", [(33184, 32768, 32768), (33184, 8192, None), (0, 49152, None),
                                                     (0, 65536, 65536), (60000, 0, None)])
def test_a_kernel_opts_in_where_static_and_dynamic_shared_memory_pass_the_default(monkeypatch, static, dynamic,
                                                                                   opted_in):
    """Past 48 KB of static and dynamic shared memory together a launch fails unless the kernel opted in to its
    dynamic size (a select's 33 KB of counters and 32 KB of staged keys); under it nothing is set."""
    fn = SimpleNamespace(shared_size_bytes=static)
    monkeypatch.setattr(module, "_function", lambda *_: fn)
    monkeypatch.setattr(module, "_smem_optin", {})
    monkeypatch.setattr(module.cp.cuda, "Device", lambda: SimpleNamespace(id=0))
    assert module._function_with_smem("dsa", "indexer_topk_select", dynamic) is fn
    assert getattr(fn, "max_dynamic_shared_size_bytes", None) == opted_in


@pytest.mark.parametrize("pdl_on,cluster", [(True, None), (False, (1, 4, 1)), (True, (1, 8, 1))])
def test_launch_ex_attributes(monkeypatch, pdl_on, cluster):
    """pdl.launch hands cuLaunchKernelEx one attribute per feature asked for: programmatic stream serialization
    (id 6, value 1) and the cluster dimension (id 4, x y z), and nothing left over from an earlier launch."""
    seen = []

    def launch_ex(cfg, fn, params, extra):
        c = cfg._obj
        seen.append((tuple(c.grid), c.num_attrs, [(c.attrs[i].id, tuple(c.attrs[i].value[:3]))
                                                  for i in range(c.num_attrs)]))
        return 0
    monkeypatch.setattr(pdl, "driver", lambda: SimpleNamespace(cuLaunchKernelEx=launch_ex))
    monkeypatch.setattr(pdl, "cp", SimpleNamespace(cuda=SimpleNamespace(
        get_current_stream=lambda: SimpleNamespace(ptr=7))))
    pdl.launch(1, (160, 4), 128, (np.int32(3),), 0, pdl_on=True, cluster=(1, 2, 1))   # an earlier launch
    pdl.launch(1, (160, 8), 128, (np.int32(3),), 0, pdl_on=pdl_on, cluster=cluster)
    grid, n, attrs = seen[-1]
    assert grid == (160, 8, 1) and n == pdl_on + bool(cluster)
    assert [i for i, _ in attrs] == [6] * pdl_on + [4] * bool(cluster)
    assert [v for i, v in attrs if i == 4] == ([cluster] if cluster else [])
    assert [v[0] for i, v in attrs if i == 6] == [1] * pdl_on


def test_pdl_suspended_on_this_thread_only(monkeypatch):
    """pdl.suspended(): no PDL inside the block (nested blocks too), decided before the device is asked;
    suspended(False) changes nothing."""
    import threading
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "KERNELS", ("rms_norm",))
    asked = []
    monkeypatch.setattr(pdl.cp.cuda, "get_current_stream", lambda: asked.append(1) or SimpleNamespace(ptr=0))
    with pdl.suspended():
        with pdl.suspended(False), pdl.suspended():
            assert not pdl.enabled("rms_norm_v_bf16")
        assert not pdl.enabled("rms_norm_v_bf16")
        assert asked == []
        other = []
        thread = threading.Thread(target=lambda: other.append(pdl.enabled("rms_norm_v_bf16")))
        thread.start()
        thread.join()
        assert other == [False] and asked == [1]   # the other thread got past the suspension to the stream check
    pdl.enabled("rms_norm_v_bf16")
    assert asked == [1, 1] and pdl._suspended.depth == 0


# (N, K) of Qwen3-4B's projections (gate_up, down, o) and small ones; gemv_splits gives the down and o
# projections split-K at 4 x 132 resident CTAs, gate_up none
FUSED_SHAPES = [(19456, 2560), (2560, 9728), (2560, 4096), (256, 4096), (64, 200)]


@pytest.fixture
def cublas(launches, monkeypatch):
    """ops.linear's cuBLAS path (M > 8), which needs a GPU: recorded as ("cublas", M) among the launches."""
    real = ops.linear

    def linear(x, w):
        if x.shape[0] <= blas.GEMV_MAX_M:
            return real(x, w)
        launches.append(SimpleNamespace(name=("cublas", x.shape[0])))
        return aligned_empty((*x.shape[:-1], w.shape[0]), x.dtype)
    monkeypatch.setattr(ops, "linear", linear)


@pytest.mark.parametrize("m", [1, 3, 8, 9])
@pytest.mark.parametrize("n,k", FUSED_SHAPES)
def test_linear_silu_mul_launches(launches, cublas, m, n, k):
    """The SiLU epilogue GEMV at M <= 8 (one launch, tiles of 8 gate + 8 up rows, split as the plain GEMV of
    that weight); cuBLAS + silu_mul above."""
    out = ops.linear_silu_mul(aligned_empty((m, k), BF16), aligned_empty((n, k), BF16))
    assert out.shape == (m, n // 2)
    if m > blas.GEMV_MAX_M:
        assert [c.name for c in launches] == [("cublas", m), "silu_mul_v_bf16"]
        return
    (call,) = launches
    assert call.name == "gemv_silu_bf16"
    splits = blas.gemv_splits(n, k, 4 * 132)
    assert call.grid == (n // 16, splits) and call.cluster == ((1, splits, 1) if splits > 1 else None)
    assert call.args[-1] == n // 2 and call.args[-3] is out


def test_gemv_takes_the_tuned_split_for_its_weight(launches, monkeypatch):
    """A split-K factor chosen at start-up (gemv_tune.py) for a weight on this device is what the plain and the SiLU
    GEMV launch with; other weights, and the same weight on another device, keep the rule's."""
    from openinfer.testing.launch_check import FAKE_CP
    cuda = SimpleNamespace(Device=lambda: SimpleNamespace(id=0))
    monkeypatch.setattr(blas, "cp", SimpleNamespace(**vars(FAKE_CP), cuda=cuda))
    monkeypatch.setattr(blas, "gemv_split_choice", {(0, 19456, 2560): 5, (1, 2560, 9728): 2})
    x, x2 = aligned_empty((1, 2560), BF16), aligned_empty((1, 9728), BF16)
    ops.linear(x, aligned_empty((19456, 2560), BF16))
    ops.linear_silu_mul(x, aligned_empty((19456, 2560), BF16))
    ops.linear(x2, aligned_empty((2560, 9728), BF16))
    rule = blas.gemv_splits(2560, 9728, 4 * 132)
    assert [c.grid for c in launches] == [(1216, 5), (1216, 5), (160, rule)]
    assert [c.cluster for c in launches] == [(1, 5, 1), (1, 5, 1), (1, rule, 1)]   # a tile's splits: one cluster


def test_linear_silu_mul_needs_whole_8_row_tiles(launches):
    """I % 8 != 0 (gate and up rows of a tile would straddle the halves): the plain GEMV, then silu_mul."""
    ops.linear_silu_mul(aligned_empty((2, 256), BF16), aligned_empty((2 * 12, 256), BF16))
    assert [c.name for c in launches] == ["gemv_bf16", "silu_mul_bf16"]


def test_cublas_gemm_ex_binding():
    """cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
    Ctype, ldc, computeType, algo): 19 parameters, as bound; cublasGemmStridedBatchedEx adds strideA, strideB,
    strideC (64-bit) and batchCount: 23."""
    lib = SimpleNamespace(**{n: SimpleNamespace() for n in ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
                                                           "cublasSetWorkspace_v2", "cublasGemmEx",
                                                           "cublasGemmStridedBatchedEx")})
    blas._bind(lib)
    assert len(lib.cublasGemmEx.argtypes) == 19
    batched = lib.cublasGemmStridedBatchedEx.argtypes
    assert len(batched) == 23 and [batched[i] for i in (10, 14, 19)] == [ctypes.c_longlong] * 3


def test_launch_config_matches_cuda_h():
    """CUlaunchConfig / CUlaunchAttribute as laid out by cuda.h (x86-64)."""
    assert ctypes.sizeof(pdl._LaunchAttr) == 72 and pdl._LaunchAttr.value.offset == 8
    assert [getattr(pdl._LaunchConfig, f).offset for f in ("grid", "block", "smem", "stream", "attrs", "num_attrs")] \
        == [0, 12, 24, 32, 40, 48]


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_ops_launch_args(launches, dtype):
    T, nh, nkv, d, bs = 5, 8, 2, 128, 16
    qkv = aligned_empty((T, (nh + 2 * nkv) * d), dtype)
    q = qkv[:, : nh * d].reshape(T, nh, d)
    k = qkv[:, nh * d: (nh + nkv) * d].reshape(T, nkv, d)
    v = qkv[:, (nh + nkv) * d:].reshape(T, nkv, d)
    pool = aligned_empty((2, 9, 3, bs, nkv, d), dtype)
    cos = sin = aligned_empty((64, 32), np.float32)
    pos, slots = np.arange(T, dtype=np.int32), np.arange(T, dtype=np.int64)
    w = aligned_empty((d,), dtype)
    ops.rope_write_kv(q, k, v, w, w, 1e-6, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.rope_write_kv(q, k, v, None, None, 0.0, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.qk_norm_rope(q, k, w, w, 1e-6, pos, cos, sin)
    ops.rope(q, k, pos, cos, sin)
    ops.write_kv(pool[0, :, 1], pool[1, :, 1], k, v, slots)
    x = aligned_empty((T, 512), dtype)
    ops.rms_norm(x, aligned_empty((512,), dtype), 1e-6)
    ops.add_rms_norm(x, aligned_empty((T, 512), dtype), aligned_empty((512,), dtype), 1e-6)
    ops.silu_mul(aligned_empty((T, 1024), dtype))
    ops.embedding(aligned_empty((100, 512), dtype), np.arange(T))
    ops.argmax(aligned_empty((T, 1000), dtype))
    ops.top_logprobs(aligned_empty((T, 1000), dtype), 5)
    assert len(launches) == 13


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_random_fill_launch_args(launches, dtype):
    random_fill.fill_normal(aligned_empty((151936, 2560), dtype), (0xFFFFFFFF, 7), 0.0, 0.02)  # grid capped
    random_fill.fill_normal(aligned_empty((7,), dtype), (1, 2), 1.0, 0.1)
    assert [c.grid for c in launches] == [(8192,), (1,)]
    with pytest.raises(ValueError):
        random_fill.fill_normal(aligned_empty((4, 6), dtype)[:, :3], (1, 2), 0.0, 1.0)


@pytest.mark.parametrize("dtype", [BF16, np.float32])
@pytest.mark.parametrize("pad,d,half", [(0, 128, 64), (0, 256, 32), (0, 64, 16), (4, 128, 64), (0, 80, 40),
                                        (0, 128, 4)])
def test_rope_word_variant_choice(launches, monkeypatch, dtype, pad, d, half):
    """The `_v_` rope kernels (32 / word lanes per head) wherever heads, rotation halves, strides and
    pointers are whole 16-byte words and d % 32 == 0 and the launch is prefill-sized (T = 37 x 12
    heads here, so the threshold is lowered); the warp-per-head kernels otherwise."""
    monkeypatch.setattr(ops, "ROPE_WORDS_MIN_HEADS", 37 * 8)
    T, nh, nkv, bs = 37, 8, 2, 16
    width = (nh + 2 * nkv) * d
    qkv = aligned_empty((T, width + pad // np.dtype(dtype).itemsize), dtype)[:, :width]
    q, k, v = (qkv[:, a * d: b * d].reshape(T, -1, d) for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
    pool = aligned_empty((2, 9, 3, bs, nkv, d), dtype)
    cos = sin = aligned_empty((64, half), np.float32)
    pos, slots = np.arange(T, dtype=np.int32), np.arange(T, dtype=np.int64)
    w = aligned_empty((d,), dtype)
    ops.rope_write_kv(q, k, v, w, w, 1e-6, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.qk_norm_rope(q, k, w, w, 1e-6, pos, cos, sin)
    words = 16 // np.dtype(dtype).itemsize
    lanes = 32 // words if pad == 0 and d % 32 == 0 and half % words == 0 else 32
    assert [c.name.startswith(("rope_write_kv_v_", "qk_norm_rope_v_")) for c in launches] == [lanes < 32] * 2
    heads = (T * (nh + 2 * nkv), T * (nh + nkv))
    assert [c.grid for c in launches] == [(-(-h * lanes // 128),) for h in heads]
    # a decode-sized launch (a few heads) keeps a warp per head
    ops.rope_write_kv(q[:1], k[:1], v[:1], w, w, 1e-6, pos[:1], cos, sin, pool[0, :, 1], pool[1, :, 1], slots[:1])
    assert launches[-1].name.startswith("rope_write_kv_") and "_v_" not in launches[-1].name


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_device_sampler_launch_args(launches, dtype):
    vocab = 1000
    rows = [SampleRow(SamplingParams(temperature=0.7, top_p=0.9, top_k=50, logprobs=lp, repetition_penalty=1.1),
                      [1, 2, 3], [4, 4], frozenset({7}), (1, 2), (3, 4)) for lp in (None, 3, 0)]
    b = build_batch(rows, vocab)
    b.params[:, ROW] = [0, 2, 3]
    params = fake(b.params)
    edits = fake(b.edits)
    assert params.shape[1] == NUM_FIELDS
    logits = aligned_empty((4, vocab), dtype)
    sampler.sample(logits, params, edits, b.top_k, np.flatnonzero(b.params[:, 1] > 0))
    assert launches[-1].name.startswith("sample_rows_")
