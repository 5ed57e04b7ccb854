#!/usr/bin/env bash
# On a GPU machine, from the repository root: reproduces the headline figures of docs/benchmarks/README.md and prints
# them as one table (GPU, commit, each figure). Logs and JSON go to $OUT (default /tmp/openinfer-bench).
#   bash scripts/gpu_bench.sh                         every step but serve-compare
#   bash scripts/gpu_bench.sh qwen3 prefix ...        the steps named: qwen3 prefix startup peer qwen35 qwen35-sweep
#                                                     dsv2 offload serve-compare
# An offline machine first installs the wheels of scripts/gpu_wheels.sh from .whl/ (into /tmp/site). The GPU tests
# are scripts/gpu_test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-bench}
PY=${PYTHON:-python3}
STEPS=" ${*:-qwen3 prefix startup peer qwen35 qwen35-sweep dsv2 offload} "
MODEL_DIR=${MODEL_DIR:-/tmp/qwen3-4b}   # the synthesized checkpoint the transformers peer reads
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
log() { echo "== $(date +%T) $*"; }
has() { [[ "$STEPS" == *" $1 "* ]]; }

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/install.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 -e plugins/deepseek_v2_lite >>"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see $OUT/install.log)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt"
git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null || echo unknown >"$OUT/commit.txt"
OI="$PY -m openinfer"
LAT="$OI bench latency --load-format dummy --device cuda --max-model-len 20480"

# a server on PORT for the HTTP steps; stop_server when done
serve() {
    local log=$1; shift
    $OI serve "$@" --port 8011 >"$log" 2>&1 &
    SERVER=$!
    for _ in $(seq 300); do
        curl -sf localhost:8011/v1/models >/dev/null && return 0
        kill -0 $SERVER 2>/dev/null || { echo "server exited (see $log)"; return 1; }
        sleep 1
    done
    return 1
}
stop_server() { kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; }

if has qwen3; then
    log "Qwen3-4B decode steps"
    $LAT --model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 \
        --max-num-batched-tokens 8192 --output-json "$OUT/qwen3_latency.json" >"$OUT/qwen3_latency.log" 2>&1
    grep -A4 "^batch" "$OUT/qwen3_latency.log"
fi
if has prefix; then
    log "Qwen3-4B cold prefill and prefix hits (in-process)"
    $PY scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 40 --gc-freeze >"$OUT/prefix_hit.log" 2>&1
    tail -12 "$OUT/prefix_hit.log"
fi
if has startup; then
    log "Qwen3-4B start-up: first-ever (empty caches), then warm"
    rm -rf /tmp/openinfer-cache-empty
    for run in first_ever warm; do
        OPENINFER_CACHE_DIR=/tmp/openinfer-cache-empty $OI bench startup --base-url http://127.0.0.1:8021 \
            --vocab-size 151000 --burst 0 --server-log "$OUT/startup_${run}_server.log" \
            --output-json "$OUT/startup_$run.json" -- $OI serve --model qwen3-4b --load-format dummy --device cuda \
            --port 8021 --max-model-len 20480 >"$OUT/startup_$run.log" 2>&1
        tail -1 "$OUT/startup_$run.log"
    done
fi
if has peer; then
    log "transformers peer on a synthesized Qwen3-4B checkpoint"
    [ -f "$MODEL_DIR/model.safetensors" ] \
        || $OI synth --preset qwen3-4b --out "$MODEL_DIR" --device cuda >"$OUT/synth.log" 2>&1
    $PY scripts/hf_peer.py "$MODEL_DIR" --agreement >"$OUT/peer.json" 2>"$OUT/peer.log"
    $LAT --model "$MODEL_DIR" --batch-sizes 1,32 --input-lens 1024 --output-lens 64 --num-iters 2 \
        --max-num-batched-tokens 8192 --output-json "$OUT/peer_ours.json" >"$OUT/peer_ours.log" 2>&1
    cat "$OUT/peer.json"
fi
if has qwen35; then
    log "Qwen3.5-4B TTFT and TPOT"
    $LAT --model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3 \
        --output-json "$OUT/qwen35_latency.json" >"$OUT/qwen35_latency.log" 2>&1
    grep -A2 "^batch" "$OUT/qwen35_latency.log"
fi
if has qwen35-sweep; then
    log "Qwen3.5-4B request-rate sweep"
    mkdir -p "$OUT/qwen35_sweep"
    if serve "$OUT/qwen35_sweep/server.log" --model qwen3.5-4b --load-format dummy --device cuda \
            --max-model-len 4096; then
        $OI bench serve --base-url http://127.0.0.1:8011 --model qwen3.5-4b --input-len 1024 --output-len 256 \
            --num-prompts 32 --sweep 1,4,16,inf --num-warmups 2 --disable-tqdm --save-result \
            --result-dir "$OUT/qwen35_sweep" >"$OUT/qwen35_sweep/sweep.log" 2>&1
        tail -6 "$OUT/qwen35_sweep/sweep.log"
    fi
    stop_server
fi
if has dsv2; then
    log "DeepSeek-V2-Lite decode steps and cold prefill (the demo model's tokenizer: the line ships none)"
    DS="--model deepseek-v2-lite --tokenizer plugins/qwen3/openinfer_qwen3/demo_tokenizer --max-num-batched-tokens 16384"
    $LAT $DS --max-model-len 4096 --batch-sizes 1,32,128 --input-lens 1024 --output-lens 16 --num-iters 2 \
        --output-json "$OUT/dsv2_decode.json" >"$OUT/dsv2_decode.log" 2>&1
    $LAT $DS --max-model-len 17408 --batch-sizes 1 --input-lens 1024,16384 --output-lens 2 --num-iters 3 \
        --output-json "$OUT/dsv2_prefill.json" >"$OUT/dsv2_prefill.log" 2>&1
    grep -h -A4 "^batch" "$OUT/dsv2_decode.log" "$OUT/dsv2_prefill.log"
fi
if has offload; then
    log "KV host offload ladder"
    OUT="$OUT/offload" LENGTHS=1024,4096,16384 REPEATS=3 MODEL_DIR=$MODEL_DIR bash scripts/gpu_offload.sh \
        >"$OUT/offload.log" 2>&1
    tail -12 "$OUT/offload/prefix.log"
fi
if has serve-compare; then
    log "serve sweep against transformers serve"
    OUT="$OUT/serve_compare" MODEL_DIR=$MODEL_DIR bash scripts/gpu_serve_compare.sh >"$OUT/serve_compare.log" 2>&1
    tail -12 "$OUT/serve_compare.log"
fi

log "headline figures"
$PY - "$OUT" <<'EOF'
import glob, json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
gpu, commit = (out / "gpu.txt").read_text().strip(), (out / "commit.txt").read_text().strip()


def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


def steps(doc, key):
    return {p["batch_size"]: p[key] for p in doc["points"]} if doc else {}


rows = []
q3 = steps(load("qwen3_latency.json"), "median_decode_step_ms")
if q3:
    rows.append(("Qwen3-4B", "decode step, batch 1 / 32 / 128, 1k prompts",
                 " / ".join(f"{q3[b]:.2f}" for b in (1, 32, 128) if b in q3) + " ms"))
hit = out / "prefix_hit.log"
if hit.exists():
    p50 = {(int(m[1]), m[2]): float(m[3]) for m in
           re.finditer(r"^\s*(\d+) (cold|hit)\s+\d+\s+([\d.]+)", hit.read_text(), re.M)}
    if p50:
        rows.append(("Qwen3-4B", "TTFT prefix hit, 1k / 16k, p50",
                     f"{p50.get((1024, 'hit'), 0):.2f} / {p50.get((16384, 'hit'), 0):.2f} ms"))
        rows.append(("Qwen3-4B", "TTFT cold prefill, 1k / 16k, p50",
                     f"{p50.get((1024, 'cold'), 0):.2f} / {p50.get((16384, 'cold'), 0):.2f} ms"))
first, warm = load("startup_first_ever.json"), load("startup_warm.json")
if first and warm:
    rows.append(("Qwen3-4B", "serve ready, warm caches / first-ever start",
                 f"{warm['ready_s']:.2f} s / {first['ready_s']:.2f} s"))
    rows.append(("Qwen3-4B", "idle RSS; model frameworks mapped",
                 f"{warm['idle_rss_mb']} MB; {', '.join(warm.get('frameworks_loaded') or []) or 'none'}"))
peer, ours = load("peer.json"), steps(load("peer_ours.json"), "median_decode_step_ms")
if peer and ours:
    rows.append(("Qwen3-4B", "decode step against transformers, batch 1 / 32",
                 f"{peer['decode_b1_tpot_ms'] / ours[1]:.1f}x / {peer['decode_b32_tpot_ms'] / ours[32]:.1f}x faster"))
q35 = load("qwen35_latency.json")
if q35:
    p = q35["points"][0]
    rows.append(("Qwen3.5-4B", "TPOT batch 1 / TTFT, 1k prompt",
                 f"{p['median_decode_step_ms']:.2f} ms / {p['median_prefill_ms']:.2f} ms"))
ds, dp = steps(load("dsv2_decode.json"), "median_decode_step_ms"), load("dsv2_prefill.json")
if ds and dp:
    pre = {p["input_len"]: p["median_prefill_ms"] for p in dp["points"]}
    rows.append(("DeepSeek-V2-Lite", "decode step, batch 1 / 32 / 128, 1k context; cold prefill 1k / 16k",
                 " / ".join(f"{ds[b]:.2f}" for b in (1, 32, 128) if b in ds) + " ms; "
                 + " / ".join(f"{pre[n]:.1f}" for n in (1024, 16384) if n in pre) + " ms"))
sat = sorted(glob.glob(str(out / "qwen35_sweep" / "*infqps*.json")))
if sat:
    r = json.loads(Path(sat[-1]).read_text())
    rows.append(("Qwen3.5-4B", "serving, saturated (1k in / 256 out)",
                 f"{r['output_throughput']:.0f} out tok/s, TPOT {r['mean_tpot_ms']:.2f} ms"))
ladder = load("offload/prefix.json")
if ladder:
    p50 = {(r["length"], r["tier"]): r["p50_ttft_ms"] for r in ladder["results"]}
    if (16384, "host") in p50:
        rows.append(("KV host offload", "TTFT of a 16k prompt restored from host memory, p50",
                     f"{p50[16384, 'host']:.1f} ms (cold prefill {p50.get((16384, 'cold'), 0):.1f} ms)"))
compare = out / "serve_compare" / "summary.md"
if compare.exists():
    rows.append(("Serving against transformers serve", "see", str(compare)))

print(f"GPU: {gpu}; commit {commit}")
print("| line / topic | figure | value |\n|---|---|---:|")
for row in rows:
    print("| " + " | ".join(row) + " |")
EOF
