#!/usr/bin/env bash
# On a GPU machine, from anywhere: the Qwen3.5 line on CUDA in about 5 minutes. Logs and JSON under $OUT.
#   1. the GPU tests: the kernels Qwen3.5 adds (norms with f32 weights, partial rotary at head 256, the
#      qwen35_* ops) and the engine against transformers, eager against graphs (plugins/qwen35/tests -m cuda)
#   2. bench latency on the Qwen3.5-4B preset with dummy weights: decode TPOT at batch 1 and the TTFT
#      of a 1024-token prompt, with CUDA graphs and eager
#   3. a short serve sweep (1024 in / 256 out) against `openinfer serve --model qwen3.5-4b`
#   bash scripts/gpu_qwen35.sh [tests|latency|serve ...]   (default: all)
# Carried wheels in .whl/ (starlette, uvicorn for the server) are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
STEPS=${*:-tests latency serve}
PRESET=qwen3.5-4b
PORT=8013
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
log() { echo "== $(date +%T) $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see install.log); using PYTHONPATH"; export PYTHONPATH=core:plugins/qwen35:${PYTHONPATH:-}; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git log -1 --format='commit %H %s' 2>/dev/null || true
$PY -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
OI="$PY -m openinfer"
rc=0

if has tests; then
    log "GPU tests (kernels Qwen3.5 uses, then the qwen35 line)"
    T="timeout 240 $PY -m pytest -q -p no:cacheprovider"
    $T tests/kernels/test_cuda_elementwise.py tests/kernels/test_cuda_attention.py -k "norm or rope or d256" 2>&1 | tail -4 | tee "$OUT/tests_kernels.log"
    $T plugins/qwen35/tests -m cuda 2>&1 | tail -25 | tee "$OUT/tests_qwen35.log"
    grep -qE "[0-9]+ (failed|error)" "$OUT/tests_kernels.log" "$OUT/tests_qwen35.log" && rc=1
fi

if has latency; then
    # max-model-len 4096: the graphs' block tables are sized by it; the figures do not depend on it
    L="timeout 120 $OI bench latency --model $PRESET --load-format dummy --device cuda --max-model-len 4096"
    for mode in graph eager; do
        log "bench latency $PRESET ($mode): batch 1, 1024-token prompt, 128 decode steps"
        flag=$([ $mode = eager ] && echo --enforce-eager)
        $L --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3 $flag \
            --output-json "$OUT/latency_$mode.json" >"$OUT/latency_$mode.log" 2>&1 || rc=1
        grep -A2 "^batch" "$OUT/latency_$mode.log" | tail -2
        grep -E "captured|activations|Error|error" "$OUT/latency_$mode.log" | head -4
    done
fi

if has serve; then
    log "serve sweep: $PRESET (dummy weights), 1024 in / 256 out, ${PROMPTS:-32} prompts at rates ${RATES:-4,inf}"
    $OI serve --model $PRESET --load-format dummy --device cuda --port $PORT --max-model-len 4096 \
        >"$OUT/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 180); do curl -sf localhost:$PORT/v1/models >/dev/null && break; sleep 0.5; done
    timeout ${SWEEP_S:-120} $OI bench serve --base-url http://127.0.0.1:$PORT --model $PRESET --input-len 1024 --output-len 256 \
        --num-prompts ${PROMPTS:-32} --sweep ${RATES:-4,inf} --num-warmups 2 --metric-percentiles 50,99 --disable-tqdm \
        --ready-check-timeout-sec 30 --save-result --result-dir "$OUT/sweep" >"$OUT/sweep.log" 2>&1 || rc=1
    tail -30 "$OUT/sweep.log"
    kill $pid; wait $pid 2>/dev/null
    grep -E "captured|activations|loaded|bounded state|Error" "$OUT/serve.log" | tail -6
fi
log "done (rc=$rc)"
exit $rc
