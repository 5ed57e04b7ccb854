#!/usr/bin/env bash
# Stop 18's H200 runs. Trees are carried in .whl/NAME (git archive REV core plugins tests scripts pyproject.toml |
# tar -x -C .whl/NAME): cur = the commit under test (the working tree may hold a helper's unfinished edits).
#   bash scripts/gpu_stop18_calls.sh callN   (server-stack wheels in .whl/, scripts/gpu_wheels.sh)
# call1: decode attention with its splits in thread-block clusters (OPENINFER_DECODE_CLUSTER, default 8; 1 = the
#   stop-17 kernel): GPU tests of decode attention (clusters on and off) and of both engines; attn_bench.py at batch
#   1 / 32 / 128, 1k and 16k contexts, 64 and 128 keys a split; the Qwen3 decode-graph ablation; batch-1 decode of
#   Qwen3-4B (clusters with 64 / 128 keys a split, no clusters) and Qwen3.5-4B (on / off) alternating, twice; batch
#   32 / 128 on and off.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
tree() { local d=$PWD/.whl/$1; shift; PYTHONPATH=$d/core:$d/plugins/qwen3:$d/plugins/qwen35:/tmp/site "$@"; }
case ${1:-} in
call1) tree cur precompile
       ( cd .whl/cur && tree cur tests 220 tests/kernels/test_cuda_ops.py -k "decode or paged_attention" )
       tree cur timeout 120 python3 .whl/cur/scripts/attn_bench.py --variants nocl,new --split-keys 64,128 \
           > $L/attn_bench.log 2>&1; say "attn_bench (ms a call):"; tail -9 $L/attn_bench.log | tee -a $S
       tree cur timeout 90 python3 .whl/cur/scripts/gpu_ablation.py qwen3-4b > $L/ablation_q3.log 2>&1
       say "ablation qwen3-4b (clusters):"; tail -15 $L/ablation_q3.log | tee -a $S
       for r in 1 2; do
           tree cur lat cl8_q3_r$r 40 $Q3B1; OPENINFER_DECODE_SPLIT_KEYS=128 tree cur lat cl8k128_q3_r$r 40 $Q3B1
           OPENINFER_DECODE_CLUSTER=1 tree cur lat nocl_q3_r$r 40 $Q3B1
           tree cur lat cl8_q35_r$r 45 $Q35; OPENINFER_DECODE_CLUSTER=1 tree cur lat nocl_q35_r$r 45 $Q35
       done
       tree cur lat cl8_q3_b32 60 $Q3; OPENINFER_DECODE_CLUSTER=1 tree cur lat nocl_q3_b32 60 $Q3 ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
