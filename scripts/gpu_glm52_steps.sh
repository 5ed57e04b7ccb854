#!/usr/bin/env bash
# On one GPU (H100 80 GB or H200), from the repository root, in about 2.5 minutes (under 4: the runs' timeouts):
# GLM-5.2 at the real width and reduced depth through `openinfer bench latency`, on dummy weights drawn on the device.
# GLM_LAYERS=5 (the default) keeps layers 0-2 (dense MLP, each with its own indexer: "full") and 3-4 (MoE, "shared":
# they reuse layer 2's selection), 45.7 GB of bf16 weights. Measured: decode steps at 8k / 16k / 32k / 64k / 128k
# contexts at batch 1 and 8k at batch 32, and the cold prefill of each prompt (16k and 64k among them), twice over the
# same points: sparse (DeepSeek sparse attention, as the model runs) and dense (--hf-overrides sets index_topk past
# the model's length: every key is selected, so every layer runs dense MLA over the same cache). Each run has its own
# timeout and writes its JSON after every point, so a run stopped part way keeps what it finished (the points go
# cheapest first). scripts/glm52_steps.py then prints the table against each step's floor (its docstring has the
# arithmetic). Logs, JSON and summary.md go to $OUT.
#   bash scripts/gpu_glm52_steps.sh
# Settings (environment): GLM_POINTS (batch x prompt pairs, in order: 32x32768 adds batch 32 at 32k, ~2 minutes more
# dense, so raise the timeouts with it), GLM_LAYERS, GLM_OUTPUT_LEN (decode steps a point + 1), GLM_CHUNK (prefill
# tokens a step), GLM_SPARSE_TIMEOUT and GLM_DENSE_TIMEOUT (seconds a run), GLM_DEVICE, GLM_PRESET and GLM_TOKENIZER
# (the CPU analogue: GLM_DEVICE=cpu GLM_PRESET=glm-5.2-tiny GLM_POINTS=1x128,1x256,4x128 GLM_CHUNK=128),
# GLM_NO_INSTALL=1 (run the installed tree as it is). An offline machine first installs the wheels of
# scripts/gpu_wheels.sh from .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-glm52-steps}
PY=${PYTHON:-python3}
DEVICE=${GLM_DEVICE:-cuda}
PRESET=${GLM_PRESET:-glm-5.2}
LAYERS=${GLM_LAYERS:-5}
POINTS=${GLM_POINTS:-1x8192,1x16384,1x32768,1x65536,32x8192,1x131072}
OUT_LEN=${GLM_OUTPUT_LEN:-16}
CHUNK=${GLM_CHUNK:-8192}
TOKENIZER=${GLM_TOKENIZER:-plugins/qwen3/openinfer_qwen3/demo_tokenizer}   # token ids are random either way
DENSE_TOPK=1048576   # GLM-5.2's max_position_embeddings: no context has more keys, so the indexer keeps them all
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
log() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }
rc=0

if [ "${GLM_NO_INSTALL:-0}" != 1 ]; then
    log "install"
    . scripts/gpu_install.sh
fi
if [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null || echo unknown >"$OUT/commit.txt"

itemsize=2   # bf16 weights and KV on CUDA; float32 on the CPU
[ "$DEVICE" = cpu ] && itemsize=4
shape=(--preset "$PRESET" --num-layers "$LAYERS" --points "$POINTS" --output-len "$OUT_LEN" --itemsize "$itemsize")
kv_gib=$($PY scripts/glm52_steps.py kv-gib "${shape[@]}") || { echo "bad settings (see above)"; exit 1; }
max_len=0
for p in ${POINTS//,/ }; do (( ${p#*x} > max_len )) && max_len=${p#*x}; done
max_len=$((max_len + OUT_LEN))

for mode in sparse dense; do
    overrides=()
    limit=${GLM_SPARSE_TIMEOUT:-90}
    if [ "$mode" = dense ]; then
        overrides=(--hf-overrides "{\"index_topk\": $DENSE_TOPK}")
        limit=${GLM_DENSE_TIMEOUT:-140}
    fi
    log "$mode: $PRESET, $LAYERS layers, points $POINTS, $OUT_LEN tokens out, KV pool $kv_gib GiB (timeout ${limit}s)"
    rm -f "$OUT/$mode.json"
    timeout -k 10 "$limit" $PY -m openinfer bench latency --model "$PRESET" --load-format dummy --device "$DEVICE" \
        --num-layers "$LAYERS" --tokenizer "$TOKENIZER" --points "$POINTS" --output-lens "$OUT_LEN" \
        --max-num-batched-tokens "$CHUNK" --max-model-len "$max_len" --kv-cache-memory-gib "$kv_gib" \
        --num-iters-warmup 0 --num-iters 1 "${overrides[@]}" --output-json "$OUT/$mode.json" >"$OUT/$mode.log" 2>&1
    status=$?
    [ "$status" -ne 0 ] && { echo "$mode run exited $status (124: timed out; see $OUT/$mode.log)"; rc=1; }
    grep -E "loaded|^batch|^-----|^ +[0-9]+ +[0-9]+ +[0-9]+ " "$OUT/$mode.log" || tail -20 "$OUT/$mode.log"
done

rate=()
if [ "$DEVICE" != cpu ]; then
    log "device copy rate (the floors' bytes per second)"
    gbs=$(timeout -k 10 60 $PY -c "from openinfer.testing.cuda import copy_bandwidth; print(copy_bandwidth() / 1e9)") \
        && rate=(--copy-rate-gbs "$gbs") || { echo "copy rate not measured"; rc=1; }
fi

log "summary"
$PY scripts/glm52_steps.py summary "${shape[@]}" --dir "$OUT" --chunk "$CHUNK" "${rate[@]}" >"$OUT/summary.md" || rc=1
echo "device: $(cat "$OUT/gpu.txt" 2>/dev/null || echo "$DEVICE"); commit $(cat "$OUT/commit.txt")"
cat "$OUT/summary.md"
log "done (exit $rc)"
exit $rc
