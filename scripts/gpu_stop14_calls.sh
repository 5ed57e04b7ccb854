#!/usr/bin/env bash
# The H200 calls of stop 14, as run (results: docs/benchmarks/h200-2026-12-04-stop14/).
#   bash scripts/gpu_stop14_calls.sh call1   (server-stack wheels in .whl/)
# call1: the experiments left ready at stop 13: the persistent GEMV chain against a kernel per GEMV (decides whether
#   a persistent decode kernel is the way to batch 1's target); attn_bench batch 1, 32, 128 in one process (stop 13's
#   batch-1 fault); prefix hits with sha256 block keys; bench latency Qwen3-4B batch 1/32/128 at the start commit.
# call2: the read ceiling of each decode weight shape (hbm_read_bench: 16-byte loads and TMA bulk copies) beside the
#   engine's GEMV; gemv_bench's per-shape table; ncu kernel tables of decode at batch 1 and 32 and a 16k prefill.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) precompile
       timeout 300 python3 scripts/gemv_chain_bench.py --output-json $R/gemv_chain.json > $L/gemv_chain.log 2>&1
       say "gemv chain:"; tail -8 $L/gemv_chain.log | tee -a $S
       timeout 60 python3 scripts/attn_bench.py --batches 1,32,128 --contexts 1024 > $L/attn.log 2>&1
       say "attn b1,32,128:"; tail -4 $L/attn.log | tee -a $S
       timeout 120 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze \
           --prefix-cache-hash sha256 > $L/prefix_hit_sha256.log 2>&1
       say "prefix hit sha256:"; tail -10 $L/prefix_hit_sha256.log | tee -a $S
       lat q3 60 $Q3 ;;
call2) precompile
       timeout 120 python3 scripts/hbm_read_bench.py --output-json $R/hbm_read.json > $L/hbm_read.log 2>&1
       say "hbm read:"; tail -7 $L/hbm_read.log | tee -a $S
       timeout 120 python3 scripts/gemv_bench.py > $L/gemv_bench.log 2>&1; say "gemv bench:"; tail -16 $L/gemv_bench.log | tee -a $S
       ncu "qwen3-4b decode 1"; ncu "qwen3-4b decode 32"; ncu "qwen3-4b prefill 16384" ;;
*) echo "usage: $0 call1|call2" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
