#!/usr/bin/env bash
# On a GPU machine: run the GLM-5.x plugin's tests (its CUDA ones included), then time its DSA kernels at GLM-5.2
# decode shapes (bf16: 64 heads, kv_lora 512 + rope 64, indexer 32 x 128, top-2048). Logs go to $OUT.
#   bash scripts/gpu_glm52.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
export PYTHONPATH=core:plugins/glm52${PYTHONPATH:+:$PYTHONPATH}

$PY -m pytest -q -p no:cacheprovider plugins/glm52/tests 2>&1 | tee "$OUT/glm52_tests.log"
rc=${PIPESTATUS[0]}

$PY - <<'EOF' 2>&1 | tee "$OUT/glm52_timings.log"
# mean GPU time per call between CUDA events, eager launches, one layer's DSA ops of a decode step
import cupy as cp, ml_dtypes, numpy as np
from openinfer.batch import ForwardBatch
from openinfer_glm52.cuda import ops
bf = np.dtype(ml_dtypes.bfloat16)
H, R, P, Hi, Di, TOPK, BS = 64, 512, 64, 32, 128, 2048, 64
stream = cp.cuda.Stream(non_blocking=True)

def bench(fn, n=20):
    with stream:
        fn(); stream.synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        for _ in range(n):
            fn()
        e.record(stream); e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) / n * 1e3

for B, L in ((1, 8192), (1, 65536), (32, 8192)):
    blocks = B * (L // BS)
    tables = cp.arange(blocks, dtype=cp.int32).reshape(B, L // BS)
    qs = np.arange(B + 1, dtype=np.int32); lens = np.full(B, L, np.int32)
    z = cp.zeros(1, cp.int32)
    batch = ForwardBatch(z, cp.full(B, L - 1, cp.int32), z, tables, cp.asarray(qs), cp.asarray(lens), z, qs, lens,
                         BS, 1, L)
    index_cache = cp.random.standard_normal((blocks, BS, Di), dtype=cp.float32).astype(bf)
    latents = cp.random.standard_normal((blocks, BS, R + P), dtype=cp.float32).astype(bf)
    q = cp.random.standard_normal((B, Hi, Di), dtype=cp.float32).astype(bf)
    w = cp.random.standard_normal((B, Hi), dtype=cp.float32)
    sel = ops.glm52_indexer_topk(q, w, index_cache, batch, TOPK, Di ** -0.5)
    ql = cp.random.standard_normal((B, H, R), dtype=cp.float32).astype(bf)
    qp = cp.random.standard_normal((B, H, P), dtype=cp.float32).astype(bf)
    t_topk = bench(lambda: ops.glm52_indexer_topk(q, w, index_cache, batch, TOPK, Di ** -0.5))
    t_attn = bench(lambda: ops.glm52_sparse_mla_attention(ql, qp, latents, sel, batch, 0.0625))
    print(f"decode B={B} context={L}: indexer scores + top-{TOPK} {t_topk:.1f} us, sparse MLA attention "
          f"{t_attn:.1f} us (one layer, bf16)")
EOF
exit "$rc"
