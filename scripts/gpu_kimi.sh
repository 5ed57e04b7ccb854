#!/usr/bin/env bash
# On one GPU (H100 80 GB or H200), from the repository root, in about 7 minutes: the quantized-weight kernels' and the
# kimi_k2 line's GPU tests, then Kimi-K2 at the real width: the INT4 / FP8 routed-expert path and FP8 linears against
# their bytes-moved floor (scripts/kimi_moe_bench.py ops), and Kimi-K2-Thinking (INT4 experts) on dummy weights at
# reduced depth, decode steps at batch 1 and 32 of 1k context (openinfer bench latency --num-layers). Every step runs
# under a timeout; eight files go to $OUT (steps.log with the GPU and commit, install.log, tests.log, the two
# measurements' logs and JSON, and the benchmark page's rows, page.md); the summary is printed last.
#   bash scripts/gpu_kimi.sh
# KIMI_LAYERS (default 7: one dense layer and six INT4 MoE layers, ~60 GiB of weights) sets the depth.
# An offline machine first installs the wheels of scripts/gpu_wheels.sh from .whl/ (into /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-kimi}
PY=${PYTHON:-python3}
LAYERS=${KIMI_LAYERS:-7}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
log() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }
rc=0

log "install"
. scripts/gpu_install.sh
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
log "GPU: $GPU; commit $COMMIT"
TMP=$(mktemp -d)

log "GPU tests: quant kernels and the kimi_k2 line (side by side)"
timeout -k 10 300 $PY -m pytest -q -p no:cacheprovider -rfE -m cuda tests/kernels/test_cuda_quant.py \
    >"$TMP/quant" 2>&1 &
quant_pid=$!
timeout -k 10 200 $PY -m pytest -q -p no:cacheprovider -rfE -m cuda plugins/kimi_k2/tests >"$TMP/kimi" 2>&1 &
kimi_pid=$!
$PY scripts/kimi_tokenizer.py /tmp/kimi-tokenizer >"$TMP/tokenizer" 2>&1 || rc=1
wait $quant_pid || rc=1
wait $kimi_pid || rc=1
for t in tokenizer quant kimi; do echo "== $t"; cat "$TMP/$t"; done >"$OUT/tests.log"
for t in quant kimi; do
    echo "$t tests: $(tail -1 "$TMP/$t")"
    grep -h "^FAILED\|^ERROR" "$TMP/$t" | cut -c1-200
done

log "routed experts (decode; prefill of 1k and 8k tokens, each expert path) and FP8 linears at the real width"
timeout -k 10 200 $PY scripts/kimi_moe_bench.py ops --json "$OUT/kimi_ops.json" >"$OUT/kimi_ops.log" 2>&1 || rc=1
cat "$OUT/kimi_ops.log"

log "Kimi-K2-Thinking, $LAYERS layers, dummy weights: decode steps at batch 1 and 32, 1k context"
timeout -k 10 240 $PY -m openinfer bench latency --model kimi-k2-thinking --load-format dummy --device cuda \
    --num-layers "$LAYERS" --tokenizer /tmp/kimi-tokenizer --batch-sizes 1,32 --input-lens 1024 --output-lens 32 \
    --max-num-batched-tokens 8192 --max-model-len 2048 --kv-cache-memory-gib 2 --num-iters-warmup 1 --num-iters 2 \
    --output-json "$OUT/kimi_latency.json" >"$OUT/kimi_latency.log" 2>&1 || rc=1
grep -E "loaded|^batch|^-----|^ +[0-9]+ +[0-9]+ +[0-9]+ " "$OUT/kimi_latency.log" || tail -20 "$OUT/kimi_latency.log"

log "benchmark page rows"
if [ -s "$OUT/kimi_ops.json" ] && [ -s "$OUT/kimi_latency.json" ]; then
    $PY scripts/kimi_moe_bench.py page --ops "$OUT/kimi_ops.json" --latency "$OUT/kimi_latency.json" \
        --num-layers "$LAYERS" >"$OUT/page.md" 2>&1 || rc=1
    echo "GPU: $GPU; commit $COMMIT"
    cat "$OUT/page.md"
else
    echo "no page: a measurement step failed (see $OUT/kimi_ops.log, $OUT/kimi_latency.log)"
fi
log "done (exit $rc)"
exit $rc
