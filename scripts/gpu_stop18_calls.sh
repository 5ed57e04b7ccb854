#!/usr/bin/env bash
# Stop 18's H200 runs. Trees are carried in .whl/NAME (git archive REV core plugins tests scripts pyproject.toml |
# tar -x -C .whl/NAME): cur = the commit under test (the working tree may hold a helper's unfinished edits),
# att = f730b7f (decode attention in clusters, the GEMV as in stop 17), base = 5aaebe6 (stop 17's last commit).
#   bash scripts/gpu_stop18_calls.sh callN   (server-stack wheels in .whl/, scripts/gpu_wheels.sh)
# call1 (cur = 4417f28): GPU tests of decode attention (clusters on and off), the GEMVs (wide ones too) and both
#   engines; attn_bench.py at batch 1 / 32 / 128, 1k and 16k contexts, 64 and 128 keys a split, with and without
#   clusters; gemv_bench.py --wide (the GEMV at 8 < M <= 64 against cuBLASLt).
# call2: batch-1 decode of Qwen3-4B and Qwen3.5-4B, base / att / cur alternating, twice; cur without clusters and
#   with 128 keys a split; the Qwen3 decode-graph ablation of cur; batch 32 / 128 of base and cur.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
tree() { local d=$PWD/.whl/$1; shift; PYTHONPATH=$d/core:$d/plugins/qwen3:$d/plugins/qwen35:/tmp/site "$@"; }
case ${1:-} in
call1) tree cur precompile
       ( cd .whl/cur && tree cur tests 240 tests/kernels/test_cuda_ops.py -k "decode or paged_attention or gemv or silu or wide or linear" )
       tree cur timeout 120 python3 .whl/cur/scripts/attn_bench.py --variants nocl,new --split-keys 64,128 \
           > $L/attn_bench.log 2>&1; say "attn_bench (ms a call):"; tail -9 $L/attn_bench.log | tee -a $S
       tree cur timeout 200 python3 .whl/cur/scripts/gemv_bench.py --wide --output-json $R/gemv_wide.json \
           > $L/gemv_wide.log 2>&1; say "gemv wide:"; tail -60 $L/gemv_wide.log | tee -a $S ;;
call2) tree cur precompile & tree att precompile & tree base precompile & wait
       for r in 1 2; do
           tree base lat base_q3_r$r 40 $Q3B1; tree att lat att_q3_r$r 40 $Q3B1; tree cur lat cur_q3_r$r 40 $Q3B1
           tree base lat base_q35_r$r 45 $Q35; tree att lat att_q35_r$r 45 $Q35; tree cur lat cur_q35_r$r 45 $Q35
       done
       OPENINFER_DECODE_CLUSTER=1 tree cur lat cur_nocl_q3 40 $Q3B1; OPENINFER_DECODE_SPLIT_KEYS=128 tree cur lat cur_k128_q3 40 $Q3B1
       tree cur timeout 90 python3 .whl/cur/scripts/gpu_ablation.py qwen3-4b > $L/ablation_q3.log 2>&1
       say "ablation qwen3-4b (cur):"; tail -15 $L/ablation_q3.log | tee -a $S
       tree base lat base_q3_b32 60 $Q3; tree cur lat cur_q3_b32 60 $Q3 ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
