#!/usr/bin/env bash
# Serving throughput at saturation on one GPU, the figures of docs/benchmarks/serving-throughput.md (~5 min on an
# H100): `openinfer bench serve` with 600 prompts of 1024 random token ids, 128 tokens out (ignore_eos), unbounded
# rate, at each concurrency, against `openinfer serve` of dummy-weight Qwen3-4B and Qwen3.5-4B with default flags,
# and Qwen3-4B again with --max-num-seqs 64 (the seat count before it came from the KV pool); then batch-1 TPOT
# (bench latency, Qwen3-4B, 1024-token prompt). Prints one table; logs and result JSON go to $OUT/logs.tgz.
#   bash scripts/gpu_wheels.sh        (here, once: the server's wheels into .whl/)
#   bash scripts/gpu_throughput.sh    (on the GPU machine, from the repo root, carrying .whl)
# Knobs (env): PROMPTS (600), CONC ("64 256"), SEATS (64: the --max-num-seqs of the Qwen3-4B comparison run; empty
# skips it), MODELS ("qwen3-4b qwen3.5-4b"). The transformers peer on the same workload: scripts/gpu_serve_compare.sh
# (NUM_PROMPTS=600 RATES=inf; ~10 min, a call of its own).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
PROMPTS=${PROMPTS:-600}
CONC=${CONC:-64 256}
SEATS=${SEATS-64}
MODELS=${MODELS:-qwen3-4b qwen3.5-4b}
PORT=8031
J=$R/json
mkdir -p $J
python3 -c "import starlette, uvicorn" 2>/dev/null || { say "no starlette/uvicorn: run scripts/gpu_wheels.sh here and carry .whl"; exit 1; }

serve_points() {  # label model [serve flags...]: start the server, bench each concurrency, stop it
    local label=$1 model=$2 t0=$SECONDS
    shift 2
    $OI serve --model $model --load-format dummy --device cuda --port $PORT "$@" > $L/${label}_server.log 2>&1 &
    local pid=$!
    for _ in $(seq 240); do
        curl -sf localhost:$PORT/v1/models > /dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.5
    done
    say "$label: ready in $((SECONDS - t0)) s; $(grep -ho 'max_num_seqs [0-9]* (from[^)]*)\|captured [0-9]* decode CUDA graphs (batch [0-9,]*) in [0-9.]* s, [0-9.]* MiB\|GEMM tuning [0-9.]* s' \
        $L/${label}_server.log | sed 's/(batch [0-9,]*) //' | tr '\n' ';')"
    for c in $CONC; do
        timeout 170 $OI bench serve --base-url http://127.0.0.1:$PORT --model $model --num-prompts $PROMPTS \
            --input-len 1024 --output-len 128 --max-concurrency $c --vocab-size 151000 --num-warmups 8 --seed $c \
            --metric-percentiles 50,99 --disable-tqdm --save-result --result-dir $J --result-filename ${label}_c$c.json \
            --ready-check-timeout-sec 60 > $L/${label}_c$c.log 2>&1 || say "$label c$c: bench failed, rc $? (logs)"
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    grep -h "Traceback\|Error" $L/${label}_server.log | head -5 | tee -a $S
}

for m in $MODELS; do serve_points $m $m; done
[ -n "$SEATS" ] && serve_points qwen3-4b-seats$SEATS qwen3-4b --max-num-seqs $SEATS
lat q3_b1 120 $Q3B1

python3 - $J <<'EOF' | tee -a $S
import json, pathlib, sys
rows = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: (p.stem.rsplit("_c", 1)[0], int(p.stem.rsplit("_c", 1)[1])))
print(f"{'server':<22} {'conc':>5} {'ok':>4} {'fail':>4} {'out tok/s':>9} {'total tok/s':>11} {'TTFT p50 ms':>11} "
      f"{'TTFT p99':>9} {'TPOT p50 ms':>11} {'TPOT p99':>9}")
for p in rows:
    r = json.loads(p.read_text())
    label, c = p.stem.rsplit("_c", 1)
    print(f"{label:<22} {c:>5} {r['completed']:>4} {r['failed']:>4} {r['output_throughput']:>9.0f} "
          f"{r['total_token_throughput']:>11.0f} {r['median_ttft_ms']:>11.1f} {r['p99_ttft_ms']:>9.1f} "
          f"{r['median_tpot_ms']:>11.2f} {r['p99_tpot_ms']:>9.2f}")
EOF
tar czf $R/logs.tgz -C $R logs json && rm -rf $L $J
