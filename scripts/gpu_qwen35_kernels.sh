#!/usr/bin/env bash
# On a GPU machine: run the Qwen3.5 plugin's CUDA kernel tests, then time its Gated DeltaNet ops
# at Qwen3.5-4B shapes (bf16). Logs go to $OUT.   bash scripts/gpu_qwen35_kernels.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
export PYTHONPATH=core:plugins/qwen35${PYTHONPATH:+:$PYTHONPATH}

$PY -m pytest -q -p no:cacheprovider plugins/qwen35/tests/test_qwen35_cuda_ops.py plugins/qwen35/tests/test_qwen35_cuda_engine.py \
    plugins/qwen35/tests/test_qwen35_cuda_compile.py plugins/qwen35/tests/test_qwen35_cuda_emulation.py \
    plugins/qwen35/tests/test_qwen35_cuda_launch_args.py \
    2>&1 | tee "$OUT/qwen35_kernels.log"
rc=${PIPESTATUS[0]}

$PY - <<'EOF' 2>&1 | tee "$OUT/qwen35_timings.log"
# mean GPU time per call between CUDA events (prefill: eager; decode: replayed from a CUDA graph)
import cupy as cp, ml_dtypes, numpy as np
from openinfer.batch import ForwardBatch
from openinfer_qwen35.cuda import ops
bf = np.dtype(ml_dtypes.bfloat16)
nk, nv, dk, dv, C, R = 16, 32, 128, 128, 8192, 256
stream = cp.cuda.Stream(non_blocking=True)

def bench(fn, n=20, graph=False):
    with stream:
        fn(); stream.synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        if graph:
            stream.begin_capture()
            for _ in range(n):
                fn()
            g = stream.end_capture(); g.launch(stream); stream.synchronize()
        s.record(stream)
        if graph:
            g.launch(stream)
        else:
            for _ in range(n):
                fn()
        e.record(stream); e.synchronize()
        return cp.cuda.get_elapsed_time(s, e) / n * 1e3

def batch(runs):
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], np.int32)
    z = cp.zeros(1, cp.int32)
    return ForwardBatch(z, z, z, z, cp.asarray(qs), cp.asarray(lens), z, qs, lens, 16, int(np.diff(qs).max()),
                        int(lens.max()), state_slots=cp.arange(len(runs), dtype=cp.int32))

conv_state, ssm = cp.zeros((R, 3, C), cp.float32), cp.zeros((R, nv, dk, dv), cp.float32)
w = (0.3 * cp.random.standard_normal((C, 4), dtype=cp.float32)).astype(bf)
print(f"{'op (Qwen3.5-4B shapes, bf16)':<48} {'us':>9}")
for name, runs, graph in (("prefill 1 x 4096", [(0, 4096)], False), ("prefill 8 x 512", [(0, 512)] * 8, False),
                          ("decode B=1", [(100, 1)], True), ("decode B=64", [(100, 1)] * 64, True)):
    b = batch(runs)
    T = int(b.query_start_host[-1])
    x = cp.random.standard_normal((T, C), dtype=cp.float32).astype(bf)
    q, k, v = x[:, :2048].reshape(T, nk, dk), x[:, 2048:4096].reshape(T, nk, dk), x[:, 4096:].reshape(T, nv, dv)
    g = -cp.random.uniform(0.01, 0.2, (T, nv), dtype=cp.float32)
    beta = cp.random.uniform(0, 1, (T, nv), dtype=cp.float32)
    conv = ops.qwen35_causal_conv1d_update if graph else ops.qwen35_causal_conv1d
    rule = ops.qwen35_gated_delta_rule_update if graph else ops.qwen35_gated_delta_rule
    print(f"{'causal conv1d ' + name:<48} {bench(lambda: conv(x, w, conv_state, b), graph=graph):9.1f}")
    print(f"{'gated delta rule ' + name:<48} {bench(lambda: rule(q, k, v, g, beta, ssm, b), graph=graph):9.1f}")
EOF
exit "$rc"
