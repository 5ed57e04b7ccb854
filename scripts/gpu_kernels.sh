#!/usr/bin/env bash
# On a GPU machine: install openinfer (plus any carried wheels in .whl/),
# run the CUDA kernel tests, print a result table and a few kernel timings. Logs go to $OUT.
#   bash scripts/gpu_kernels.sh            (exit status: pytest's)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see install.log); using PYTHONPATH=core"; export PYTHONPATH=core:${PYTHONPATH:-}; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

$PY -m pytest tests/kernels -q -p no:cacheprovider --junitxml "$OUT/kernels.xml" 2>&1 | tee "$OUT/kernels.log"
rc=${PIPESTATUS[0]}

$PY - "$OUT/kernels.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
rows = []
for case in ET.parse(sys.argv[1]).iter("testcase"):
    status = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
    rows.append((case.get("classname").rsplit(".", 1)[-1], case.get("name"), status, float(case.get("time", 0))))
print(f"\n{'module':<20} {'test':<58} {'result':<8} {'s':>6}")
for mod, name, status, t in rows:
    print(f"{mod:<20} {name[:58]:<58} {status:<8} {t:6.2f}")
counts = {s: sum(r[2] == s for r in rows) for s in ("passed", "failure", "error", "skipped")}
print(" ".join(f"{k}={v}" for k, v in counts.items()))
EOF

$PY - <<'EOF' 2>&1 | tee "$OUT/timings.log"
# Kernel timings on Qwen3-4B shapes (bf16): mean of 50 calls between CUDA events, eager and graph-replayed.
import math
import cupy as cp, ml_dtypes, numpy as np
from openinfer.batch import ForwardBatch
from openinfer.kernels.cuda import ops
bf = np.dtype(ml_dtypes.bfloat16)

stream = cp.cuda.Stream(non_blocking=True)

def bench(fn, n=50):
    """(eager us per call incl. Python launch cost, GPU us per call replayed from a CUDA graph)."""
    times = []
    with stream:
        fn(); stream.synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        for _ in range(n):
            fn()
        e.record(stream); e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / n * 1e3)
        stream.begin_capture()
        for _ in range(n):
            fn()
        graph = stream.end_capture()
        graph.launch(stream); stream.synchronize()
        s.record(stream); graph.launch(stream); e.record(stream); e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / n * 1e3)
    return times

def rand(*shape):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(bf)

def batch(ctx, nq, bs=16):
    B = len(ctx)
    nblk = [math.ceil(c / bs) for c in ctx]
    tables = np.zeros((B, max(nblk)), np.int32)
    at = 0
    for i, n in enumerate(nblk):
        tables[i, :n] = np.arange(at, at + n); at += n
    qs = np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)
    lens = np.asarray(ctx, np.int32)
    z = cp.zeros(int(qs[-1]), cp.int32)
    return ForwardBatch(z, z, z.astype(cp.int64), cp.asarray(tables), cp.asarray(qs), cp.asarray(lens), z,
                        qs, lens, bs, int(max(nq)), int(max(ctx))), at

nh, nkv, d, H, I = 32, 8, 128, 2560, 9728
print(f"\n{'op':<36} {'eager us':>9} {'graph us':>9} {'GB/s':>7} {'TFLOP/s':>8}   (rates from graph time)")
def row(name, us, nbytes=0, flops=0):
    print(f"{name:<36} {us[0]:9.1f} {us[1]:9.1f} {nbytes / us[1] / 1e3:7.0f} {flops / us[1] / 1e6:8.1f}")

for m, k, n in ((1, H, 2 * I), (1, I, H), (1, H, (nh + 2 * nkv) * d), (32, H, 2 * I), (1024, H, 2 * I)):
    x, w = rand(m, k), rand(n, k)
    row(f"linear M={m} {k}->{n}", bench(lambda: ops.linear(x, w)), 2 * (n * k + m * (k + n)), 2 * m * n * k)
for B, ctx in ((1, 1024), (1, 8192), (1, 32768), (32, 1024), (64, 4096)):
    b, blocks = batch([ctx] * B, [1] * B)
    kc, vc, q = rand(blocks, 16, nkv, d), rand(blocks, 16, nkv, d), rand(B, nh, d)
    row(f"decode attention B={B} ctx={ctx}", bench(lambda: ops.paged_attention(q, kc, vc, b, d ** -0.5)),
        2 * B * ctx * nkv * d * 2)
from openinfer.kernels.cuda import attention as attn
# the tensor-core kernel (default tiling, then one m-tile per warp), then the fp32-core one it replaced
for n, kernels in ((1024, ("mma", "mma_m1", "fp32")), (4096, ("mma", "mma_m1", "fp32")), (16384, ("mma", "mma_m1"))):
    b, blocks = batch([n], [n])
    kc, vc, q = rand(blocks, 16, nkv, d), rand(blocks, 16, nkv, d), rand(n, nh, d)
    for kern in kernels:
        attn.PREFILL_MMA, attn.MMA_VARIANT = kern != "fp32", "_m1" if kern == "mma_m1" else ""
        row(f"prefill attention {n} tok {kern}",
            bench(lambda: ops.paged_attention(q, kc, vc, b, d ** -0.5), 5), flops=4 * nh * d * n * n / 2)
    attn.PREFILL_MMA, attn.MMA_VARIANT = True, ""
x, r, w = rand(1, H), rand(1, H), rand(H)
row("add_rms_norm T=1 H=2560", bench(lambda: ops.add_rms_norm(x, r, w, 1e-6)))
logits = rand(1, 151936)
row("argmax 1x151936", bench(lambda: ops.argmax(logits)), logits.nbytes)
row("top_logprobs k=20 1x151936", bench(lambda: ops.top_logprobs(logits, 20)), logits.nbytes)
# the device sampler (sample_rows.cu) on S rows of 4 * N(0, 1) bf16 logits, and the host path it replaced
import time
from openinfer.kernels.cuda import sampler
from openinfer.sampling import SamplingParams, sample_row
from openinfer.sampling_batch import ROW, SampleRow, build_batch
V = 151936
for S, kw in ((1, dict(top_p=0.9, top_k=50)), (64, dict(top_p=0.9, top_k=50)), (256, dict(top_p=0.9, top_k=50)),
              (64, dict()), (64, dict(temperature=0.2, top_p=0.95)), (64, dict(min_p=0.05))):
    sp = SamplingParams(**{"temperature": 1.0, **kw})
    b = build_batch([SampleRow(sp, [], [], frozenset(), (1, 2), (i, 0)) for i in range(S)], V)
    b.params[:, ROW] = np.arange(S)
    lg = (4 * cp.random.standard_normal((S, V), dtype=cp.float32)).astype(bf)
    params, edits, none = cp.asarray(b.params), cp.zeros((1, 4), cp.int32), np.zeros(0, np.int64)
    desc = " ".join(f"{k}={v}" for k, v in kw.items()) or "T=1 only"
    row(f"sample S={S} {desc}"[:36], bench(lambda: sampler.sample(lg, params, edits, 0, none), 20), lg.nbytes)
    if S == 64 and kw.get("top_k"):
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        for r in cp.asnumpy(lg).astype(np.float32):
            sample_row(r, sp, rng, [], [])
        print(f"{'host path S=64 (copy + numpy)':<36} {1e6 * (time.perf_counter() - t0):9.1f}")
EOF
# decode attention, old (fp32 cores) against new (tensor cores), as the engine's graphs size it
$PY scripts/attn_bench.py 2>&1 | tee "$OUT/attn_bench.log"
# GEMV vs cuBLAS per Qwen3-4B shape at M=1 and M=8, and the
# 145-GEMM decode chain against the 1.87 ms floor
$PY scripts/gemv_bench.py 2>&1 | tee "$OUT/gemv.log"
# rope_write_kv in 16-byte words vs warp-per-head, decode to 16k prefill
$PY scripts/rope_bench.py 2>&1 | tee "$OUT/rope_bench.log"
# prefill attention, mma.sync against the wgmma variants, one Qwen3-4B layer, fresh prompts and a prefix hit
$PY scripts/prefill_attn_bench.py --lens 4096,16384 2>&1 | tee "$OUT/prefill_attn_bench.log"
$PY scripts/prefill_attn_bench.py --lens 8192 --prefix 8192 2>&1 | tee -a "$OUT/prefill_attn_bench.log"
exit "$rc"
