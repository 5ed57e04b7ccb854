#!/usr/bin/env bash
# Stop 23's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh;
# pass carry [".whl"]).   bash scripts/gpu_stop23_calls.sh callN
# call1 (~3 min): does a persistent GEMV chain whose weights stream through shared memory ahead of the math
#   (gemv_stream: a producer warp a SM copying with cp.async.bulk across op boundaries) read a Qwen3-4B step's 145
#   GEMVs faster than a kernel per GEMV? scripts/gemv_chain_bench.py at four ring shapes, beside stop 14's chain
#   and the engine's GEMV; then the engine's batch 1 for this machine's baseline.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) timeout 240 python3 scripts/gemv_chain_bench.py --repeats 10 --output-json $L/gemv_chain.json \
           > $L/gemv_chain.log 2>&1
       say "gemv chain:"; tail -12 $L/gemv_chain.log | tee -a $S
       lat base_q3 50 $Q3B1 ;;
*) echo "usage: $0 call1"; exit 2 ;;
esac
