#!/usr/bin/env bash
# On a GPU machine: the host KV offload tier. Runs the offload tests (the cuda-marked ones included),
# then the TTFT ladder (`openinfer bench prefix`: cold prefill, device hit, host restore) against
# `openinfer serve --kv-offload` on a random-weight Qwen3-4B (`openinfer synth --preset qwen3-4b`,
# served with --load-format dummy). Logs, JSON and a markdown table for docs/benchmarks/ go to $OUT.
#   bash scripts/gpu_offload.sh          (exit status: pytest's, else the benchmark's)
# Knobs (environment): LENGTHS=1024,4096,16384 REPEATS=5 KV_GIB=4 HOST_GIB=16 PORT=8011 SERVE_ARGS=
# PRESET=qwen3-4b DEVICE=cuda (DEVICE=cpu PRESET=qwen3-tiny: a dry run of the flow on a CPU).
# KV_GIB keeps the device pool small so the fillers that push a prompt out of HBM stay few.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
LENGTHS=${LENGTHS:-1024,4096,16384} REPEATS=${REPEATS:-5} KV_GIB=${KV_GIB:-4} HOST_GIB=${HOST_GIB:-16}
PORT=${PORT:-8011} PRESET=${PRESET:-qwen3-4b} DEVICE=${DEVICE:-cuda}
MODEL_DIR=${MODEL_DIR:-/tmp/${PRESET}}   # /tmp/qwen3-4b: the checkpoint gpu_bench.sh synthesizes too
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}

if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see install.log); using PYTHONPATH"; export PYTHONPATH=core:plugins/qwen3:${PYTHONPATH:-}; }
OPENINFER=("$PY" -m openinfer)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

$PY -m pytest tests/test_kv_offload_cuda.py tests/test_kv_offload.py tests/test_cuda_block_copy_emulation.py -q -p no:cacheprovider \
    --junitxml "$OUT/offload_tests.xml" 2>&1 | tee "$OUT/offload_tests.log"
rc=${PIPESTATUS[0]}

[ -f "$MODEL_DIR/model.safetensors" ] || "${OPENINFER[@]}" synth --preset "$PRESET" --out "$MODEL_DIR" --device "$DEVICE" \
    >"$OUT/synth.log" 2>&1 \
    || { echo "synth failed (see synth.log)"; exit 1; }
"${OPENINFER[@]}" serve --model "$MODEL_DIR" --device "$DEVICE" --load-format dummy --port "$PORT" \
    --kv-offload --kv-offload-host-gib "$HOST_GIB" --kv-cache-memory-gib "$KV_GIB" ${SERVE_ARGS:-} \
    >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
get() { $PY -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
for _ in $(seq 600); do
    get "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { echo "server exited (see server.log)"; tail -20 "$OUT/server.log"; exit 1; }
    sleep 1
done

"${OPENINFER[@]}" bench prefix --base-url "http://127.0.0.1:$PORT" --lengths "$LENGTHS" --repeats "$REPEATS" \
    --vocab-size 151000 --host-restore --output-json "$OUT/prefix.json" 2>&1 | tee "$OUT/prefix.log"
brc=${PIPESTATUS[0]}
get "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt"
grep -E '^(openinfer:kv_offload|vllm:cache_config_info)' "$OUT/metrics.txt"
# the server's per-restore report: copy time on the copy stream vs queueing, landing and the first step
grep -o 'KV restore .*' "$OUT/server.log" | tee "$OUT/restore_report.txt"

$PY - "$OUT" "$KV_GIB" "$HOST_GIB" "${SERVE_ARGS:-}" "$PRESET" "$DEVICE" <<'EOF'
import json, subprocess, sys
from pathlib import Path
out, kv, host, extra, preset, device = Path(sys.argv[1]), *sys.argv[2:]
if not (out / "prefix.json").exists():
    sys.exit("no prefix.json: the benchmark failed (see prefix.log)")
res = json.loads((out / "prefix.json").read_text())
names = {"cold": "cold prefill", "warm": "device hit", "host": "host restore"}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
gpu = (out / "gpu.txt").read_text().strip() or "none"
lines = [f"# KV offload: TTFT ladder, {preset} shape (random weights)", "",
         f"GPU: {gpu}; commit {commit or 'unknown'}; `openinfer serve --device {device} --load-format dummy --kv-offload "
         f"--kv-offload-host-gib {host} --kv-cache-memory-gib {kv} {extra}`; `openinfer bench prefix --host-restore "
         f"--repeats {res['repeats']} --output-len {res['output_len']}` (fillers: device pool + one prompt). "
         "TTFT seen by a streaming client on loopback; one request at a time. Not a claim about real checkpoints, "
         "other GPUs or concurrent load.", "",
         "| tokens | rung | n | p50 ms | p99 ms | cached tokens | blocks restored |", "|---:|---|---:|---:|---:|---:|---:|"]
for r in res["results"]:
    restored = "-" if r["median_restored_blocks"] is None else f"{r['median_restored_blocks']:.0f}"
    cached = "-" if r["median_cached_tokens"] is None else f"{r['median_cached_tokens']:.0f}"
    lines.append(f"| {r['length']} | {names[r['tier']]} | {r['n']} | {r['p50_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} "
                 f"| {cached} | {restored} |")
report = out / "restore_report.txt"
if report.exists() and report.read_text().strip():
    lines += ["", "Server's per-restore report (one line per host-rung sample, in order):", "", "```",
              *report.read_text().strip().splitlines(), "```"]
(out / "kv-offload.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
[ "$rc" -ne 0 ] && exit "$rc"
exit "$brc"
