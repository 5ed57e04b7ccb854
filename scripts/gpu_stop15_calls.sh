#!/usr/bin/env bash
# The H200 calls of stop 15, as run (results: docs/benchmarks/h200-2026-12-04-stop15/).
#   bash scripts/gpu_stop15_calls.sh call1   (server-stack wheels in .whl/)
# call1: decode attention with a fewest-keys-a-split (OPENINFER_DECODE_SPLIT_KEYS; the splits a short context does
#   not use leave at once): its GPU tests, attn_bench over the keys, bench latency batch 1 per keys (Qwen3 and
#   Qwen3.5); the 16k cold prefill per step token budget (1024, the old default, against 8192 and 16384).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) precompile
       tests 150 tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_launch_args.py
       timeout 120 python3 scripts/attn_bench.py --batches 1,32,128 --contexts 1024,16384 --variants new \
           --split-keys 64,128,256,512 > $L/attn.log 2>&1
       say "attn keys:"; grep -A24 "^batch" $L/attn.log | tee -a $S
       for k in 64 128 256 512; do OPENINFER_DECODE_SPLIT_KEYS=$k lat q3_b1_k$k 60 $Q3B1; done
       for k in 64 256; do OPENINFER_DECODE_SPLIT_KEYS=$k lat q35_b1_k$k 60 $Q35; done
       for n in 1024 8192 16384; do
           timeout 90 python3 scripts/gpu_prefix_hit.py --lengths 16384 --repeats 5 --gc-freeze \
               --max-num-batched-tokens $n > $L/prefill16k_$n.log 2>&1
           say "16k, budget $n:"; grep "cold\|hit " $L/prefill16k_$n.log | tee -a $S
       done ;;
*) echo "usage: $0 call1" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
