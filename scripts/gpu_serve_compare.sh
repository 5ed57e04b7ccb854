#!/usr/bin/env bash
# The serve sweep for openinfer and for Hugging Face `transformers serve` (continuous batching) on the
# same random-weight Qwen3-4B checkpoint, one after the other on one GPU, in one run (< TOTAL_S = 570 s).
# Run from the repo root on the GPU machine, after `bash scripts/gpu_wheels.sh` here has filled .whl/:
#   bash scripts/gpu_serve_compare.sh
# Results in $OUT: summary.md (table with ratios), compare.png, one sweep PNG per server, results.tar.gz
# (every JSON, log and plot). Knobs (env): NUM_PROMPTS (40 per rate), RATES (1,2,4,8,16,32,inf),
# INPUT_LEN (1024), OUTPUT_LEN (128), PRESET (qwen3-4b), DEVICE (cuda), MODEL_DIR (synthesized once),
# SWEEP_S (200: openinfer's sweep budget; transformers gets the rest of TOTAL_S, which its sweep needs: ~300 s on the
# H200; points done by then are kept),
# SKIP_INSTALL=1 (use the current environment), SYNTH_ONLY=1 (install and synthesize, then stop: synthesizing
# the 8 GB checkpoint takes minutes, so a first run can do it and a second, on the same machine, the sweeps).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-compare}
PY=${PYTHON:-python3}
NUM_PROMPTS=${NUM_PROMPTS:-40}
RATES=${RATES:-1,2,4,8,16,32,inf}
INPUT_LEN=${INPUT_LEN:-1024}
OUTPUT_LEN=${OUTPUT_LEN:-128}
PRESET=${PRESET:-qwen3-4b}
DEVICE=${DEVICE:-cuda}
SWEEP_S=${SWEEP_S:-200}
TOTAL_S=${TOTAL_S:-570}
WORK=$(mktemp -d /tmp/serve-compare.XXXX)
MODEL_DIR=${MODEL_DIR:-/tmp/openinfer-synth-$PRESET}   # outside $WORK: a second run on a warm machine reuses it
LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
# transformers serve: no hub traffic (no network there); 5.17's /v1/models scans $HF_HOME/hub, which must exist
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HOME=$WORK/hf TOKENIZERS_PARALLELISM=false
mkdir -p "$HF_HOME/hub"
OI=("$PY" -m openinfer.cli)
log() { echo "[$(date +%T)] $*"; }

if [ -z "${SKIP_INSTALL:-}" ]; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            >"$LOGS/install.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    $PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 >>"$LOGS/install.log" 2>&1 \
        || { log "editable install failed (see install.log): using PYTHONPATH"; export PYTHONPATH=core:plugins/qwen3:${PYTHONPATH:-}; }
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
  echo "openinfer commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } | tee "$LOGS/env.txt"

if [ ! -f "$MODEL_DIR/config.json" ]; then
    log "synthesizing $PRESET into $MODEL_DIR"
    "${OI[@]}" synth --preset "$PRESET" --out "$MODEL_DIR" --device "$DEVICE" >"$LOGS/synth.log" 2>&1 || { cat "$LOGS/synth.log"; exit 1; }
fi
# transformers reads tokenizer.json, not the gzip openinfer vendors
[ -f "$MODEL_DIR/tokenizer.json" ] || gzip -dkc "$MODEL_DIR/tokenizer.json.gz" >"$MODEL_DIR/tokenizer.json"
if [ -n "${SYNTH_ONLY:-}" ]; then
    log "synthesized $MODEL_DIR in ${SECONDS}s: $(du -sh "$MODEL_DIR" | cut -f1)"
    rm -rf "$WORK"
    exit 0
fi

wait_ready() {  # url pid seconds: poll GET url until 200, the server dies, or time runs out
    $PY - "$@" <<'EOF'
import os, sys, time, httpx
url, pid, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server exited")
    try:
        if httpx.get(url, timeout=5).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(f"not ready after {limit:g}s")
EOF
}

stop() {  # pid: SIGTERM, then SIGKILL after 20 s
    kill "$1" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done
    kill -9 "$1" 2>/dev/null
}

left() { echo $(( TOTAL_S - SECONDS )); }  # seconds left of the whole run

sweep() {  # name base_url model [bench flags...]
    local name=$1 url=$2 model=$3 budget=$SWEEP_S
    shift 3
    (( budget > $(left) - 30 )) && budget=$(( $(left) - 30 ))  # keep 30 s to stop the server and report
    (( budget >= 20 )) || { log "no time left for the $name sweep"; return; }
    log "sweep $name: rates $RATES, $NUM_PROMPTS prompts each, $INPUT_LEN in / $OUTPUT_LEN out, budget ${budget}s"
    timeout "$budget" "${OI[@]}" bench serve --base-url "$url" --model "$model" --label "$name" \
        --prompt-format text --tokenizer "$MODEL_DIR" --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" \
        --output-len "$OUTPUT_LEN" --sweep "$RATES" --num-warmups 4 --metric-percentiles 50,90,99 \
        --ready-check-timeout-sec 120 --disable-tqdm --result-dir "$WORK/$name" \
        --metadata "server=$name" "device=$DEVICE" "preset=$PRESET" "$@" >"$LOGS/bench-$name.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || log "bench $name exited $rc (124: the ${budget}s budget ran out; finished points are kept)"
    tail -n $(( $(tr ',' '\n' <<<"$RATES" | wc -l) + 3 )) "$LOGS/bench-$name.log"  # the sweep table
}

# ---- openinfer ----
log "starting openinfer serve"
"${OI[@]}" serve --model "$PRESET=$MODEL_DIR" --device "$DEVICE" --port 8100 >"$LOGS/server-openinfer.log" 2>&1 &
pid=$!
if wait_ready http://127.0.0.1:8100/v1/models $pid 180; then
    log "openinfer ready"
    sweep openinfer http://127.0.0.1:8100 "$PRESET"   # ignore_eos: every output is exactly OUTPUT_LEN tokens
else
    log "openinfer did not come up"; tail -n 30 "$LOGS/server-openinfer.log"
fi
stop $pid

# ---- transformers serve (continuous batching, paged sdpa, bf16) ----
log "starting transformers serve"
$PY -m transformers.cli.transformers serve "$MODEL_DIR" --continuous-batching --attn-implementation sdpa \
    --dtype bfloat16 --device "$DEVICE" --host 127.0.0.1 --port 8200 >"$LOGS/server-transformers.log" 2>&1 &
pid=$!
if wait_ready http://127.0.0.1:8200/v1/models $pid $(( $(left) - 90 )); then
    log "transformers serve ready"
    # it rejects ignore_eos (HTTP 422) and takes only text prompts; random weights rarely hit EOS, and the
    # table's token counts come from each response's usage
    SWEEP_S=$(left) sweep transformers http://127.0.0.1:8200 "$MODEL_DIR" --no-ignore-eos  # all the time left: it is slow
else
    log "transformers serve did not come up"; tail -n 30 "$LOGS/server-transformers.log"
fi
stop $pid

# ---- report ----
for name in openinfer transformers; do
    png=$(ls "$WORK/$name"/*.png 2>/dev/null | head -n 1)
    [ -n "$png" ] && cp "$png" "$OUT/$name-sweep.png"
done
{ echo "# openinfer vs transformers serve: $PRESET, $INPUT_LEN in / $OUTPUT_LEN out, $NUM_PROMPTS prompts per rate"
  echo; sed 's/^/    /' "$LOGS/env.txt"
  echo "    openinfer serve --device $DEVICE (engine defaults); bench with ignore_eos"
  echo "    transformers serve --continuous-batching --attn-implementation sdpa --dtype bfloat16 --device $DEVICE"
  echo "    both: bench serve --prompt-format text (same prompts, same seed), temperature 0, 4 warm-ups per rate"
  echo; } >"$OUT/summary.md"
"${OI[@]}" bench compare "openinfer=$WORK/openinfer" "transformers=$WORK/transformers" --md "$WORK/table.md" \
    --png "$OUT/compare.png" --short
rc=$?
[ -f "$WORK/table.md" ] && cat "$WORK/table.md" >>"$OUT/summary.md"
"$PY" - "$WORK" <<'EOF' | tee -a "$OUT/summary.md"
# output tokens actually produced (transformers stops at EOS; openinfer ignores it)
import pathlib, sys
from openinfer.bench.compare import load_sweep
for name in ("openinfer", "transformers"):
    d = pathlib.Path(sys.argv[1]) / name
    res = load_sweep(d) if d.is_dir() else []
    print(f"\n{name}: " + ", ".join(f"rate {r['request_rate']}: {r['completed']} ok / {r['failed']} failed, "
                                    f"{r['total_output_tokens']} output tokens" for r in res))
EOF
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude ./hf .
rm -rf "$WORK"
ls -la "$OUT"
exit $rc
