#!/usr/bin/env bash
# Serving throughput at saturation on one GPU, the figures of docs/benchmarks/serving-throughput.md (~5 min on an
# H100): `openinfer bench serve` with 600 prompts of 1024 random token ids, 128 tokens out (ignore_eos), unbounded
# rate, at each concurrency, against `openinfer serve` of dummy-weight Qwen3-4B and Qwen3.5-4B with default flags,
# and Qwen3-4B again with --max-num-seqs 64 (the seat count before it came from the KV pool); then batch-1 TPOT
# (bench latency, Qwen3-4B, 1024-token prompt), and a mixed step's cost: 248 decode rows on their graph, eagerly, and
# beside 1 and 7 prompts of 1k tokens, against those prefills alone. Prints one table; logs and result JSON go to
# $OUT/logs.tgz.
#   bash scripts/gpu_wheels.sh        (here, once: the server's wheels into .whl/)
#   bash scripts/gpu_throughput.sh    (on the GPU machine, from the repo root, carrying .whl)
# (The user-facing form of one server's sweep: openinfer bench serve --num-prompts 600 --sweep-concurrency 64,128,256.)
# Knobs (env): PROMPTS (600), CONC ("64 256"), SEATS (64: the --max-num-seqs of the Qwen3-4B comparison run; empty
# skips it), MODELS ("qwen3-4b qwen3.5-4b"), MIXED (1; 0 skips the mixed-step probe), ENGINE_FLAGS (added to every
# server and latency run, e.g. "--kv-cache-dtype fp8"; their rows are labelled with TAG, e.g. "-fp8").
# The transformers peer at an unbounded rate: NUM_PROMPTS=200 RATES=inf
# bash scripts/gpu_serve_compare.sh, a call of its own.
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/openinfer-throughput}; L=$R/logs; S=$R/summary.txt
mkdir -p "$R" $L
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
say() { echo "$*" | tee -a $S; }
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >$L/install.log 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >>$L/install.log 2>&1 \
    || { echo "editable install failed (see $L/install.log)"; exit 1; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(git rev-parse --short HEAD 2>/dev/null)"
OI="python3 -m openinfer"
lat() {  # name seconds flags...: one bench latency run, its table into the summary
    local name=$1 t=$2; shift 2
    timeout $t $OI bench latency --load-format dummy --device cuda --max-model-len 20480 "$@" ${ENGINE_FLAGS:-} \
        --output-json $L/$name.json > $L/$name.log 2>&1
    say "$name${TAG:-}:"; grep -A4 "^batch" $L/$name.log | tee -a $S || tail -2 $L/$name.log | tee -a $S
}
Q3B1="--model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 3"
PROMPTS=${PROMPTS:-600}
CONC=${CONC:-64 256}
SEATS=${SEATS-64}
MODELS=${MODELS:-qwen3-4b qwen3.5-4b}
PORT=8031
J=$R/json
mkdir -p $J
python3 -c "import starlette, uvicorn" 2>/dev/null || { say "no starlette/uvicorn: run scripts/gpu_wheels.sh here and carry .whl"; exit 1; }

serve_points() {  # label model [serve flags...]: start the server, bench each concurrency, stop it
    local label=$1${TAG:-} model=$2 t0=$SECONDS
    shift 2
    $OI serve --model $model --load-format dummy --device ${DEVICE:-cuda} --port $PORT "$@" ${ENGINE_FLAGS:-} \
        > $L/${label}_server.log 2>&1 &
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

mixed_probe() {  # model device seats context: the cost of a mixed step's decode rows, synchronous steps, in process
    python3 - "$@" <<'EOF2'
import sys, time
import numpy as np
from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.sampling.sampler import SamplingParams
model, device, seats, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
eng = build_engine(model, EngineArgs(device=device, load_format="dummy", max_num_seqs=seats + 8, pipelined_decode=False,
                                     max_model_len=None if device == "cuda" else 2 * ctx + 128))
rng, budget = np.random.default_rng(0), eng.args.max_num_batched_tokens
params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
submit = lambda: eng.submit(rng.integers(0, eng.vocab_size - 1000, ctx).tolist(), params, request_id=f"p{next(ids)}")
ids = iter(range(10**6))
def ms(n):   # median wall ms of n steps (each synchronous: launch, then wait for its tokens)
    t = []
    for _ in range(n):
        t0 = time.perf_counter(); eng.step(); t.append(1e3 * (time.perf_counter() - t0))
    return float(np.median(t))
def with_new(k, runs=3):   # median ms of the step that admits and prefills k new prompts, then drops them
    t = []
    for _ in range(runs):
        new = [submit() for _ in range(k)]
        eng._drain()
        t0 = time.perf_counter(); eng.step(); t.append(1e3 * (time.perf_counter() - t0))
        for s in new: eng.abort(s.request_id)
        eng.step()
    return float(np.median(t))
ks = (1, (budget - seats) // ctx)   # whole prompts that fit the step's budget beside the decode rows
for k in ks:   # a prefill alone, on the idle engine (warm first)
    with_new(k, 1)
alone = {k: with_new(k) for k in ks}
running = [submit() for _ in range(seats)]
eng._drain()   # submitted requests reach the scheduler here
while eng.scheduler.waiting or any(not r.output_ids for r in eng.scheduler.running):
    eng.step()
ms(1)   # warm
graph = ms(5)
graphs, eng.runner.graphs = eng.runner.graphs, None
eager = ms(3)
eng.runner.graphs = graphs
print(f"{model}, {seats} decode rows of ~{ctx} context: decode step {graph:.2f} ms on its graph, {eager:.2f} ms eager")
for k, t in alone.items():
    mixed = with_new(k)
    print(f"  + {k} x {ctx}-token prefill: mixed step {mixed:.2f} ms; the prefill alone {t:.2f} ms, so the decode rows "
          f"add {mixed - t:.2f} ms (their own graph step: {graph:.2f})")
EOF2
}

for m in $MODELS; do serve_points $m $m; done
[ -n "$SEATS" ] && serve_points qwen3-4b-seats$SEATS qwen3-4b --max-num-seqs $SEATS
lat q3_b1 120 $Q3B1
if [ "${MIXED:-1}" = 1 ]; then
    timeout 150 bash -c "$(declare -f mixed_probe); mixed_probe qwen3-4b cuda 248 1024" > $L/mixed.log 2>&1
    say "mixed steps:"; tail -3 $L/mixed.log | tee -a $S
fi

python3 - $J <<'EOF' | tee -a $S
import json, pathlib, sys
point = lambda p: (p.stem.rsplit("_c", 1)[0], int(p.stem.rsplit("_c", 1)[1]))   # (label, concurrency)
rows = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=point)
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
