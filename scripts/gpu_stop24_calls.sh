#!/usr/bin/env bash
# Stop 24's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh;
# pass carry [".whl"]).   bash scripts/gpu_stop24_calls.sh callN
# call1 (~5 min): where batch 32 / 128 go on this card, and does decode attention read faster from a head-major KV
#   layout? attn_bench.py --layout token-major,head-major (emulated: see its docstring) at batch 1 / 32 / 128, 1k and
#   16k; every kernel's time of one decode step at batch 32 and 128 (Nsight Compute); the ablation of the non-GEMM
#   families at batch 32 and 128; the engine's batch 1 / 32 / 128 for this machine's baseline.
# call2 (~6 min): call 1's engine figures were taken while an Nsight Compute child that its timeout had orphaned still
#   ran (batch 1 at 5.21 ms): the engine's batch 1 / 32 / 128 again alone; then cuBLASLt beyond its heuristic's top
#   16 (gemm_algos_bench.py --wide: every algorithm id's best configurations and their split-K variants) for the
#   Qwen3-4B decode GEMMs at M = 32 and 128.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) precompile
       timeout 150 python3 scripts/attn_bench.py --layout token-major,head-major --batches 1,32,128 \
           --contexts 1024,16384 --variants new > $L/attn_layout.log 2>&1
       say "attention, token-major vs head-major:"; tail -13 $L/attn_layout.log | tee -a $S
       OUT=$L NCU_S=100 TOP=14 timeout 200 bash scripts/gpu_ncu.sh "qwen3-4b decode 32" "qwen3-4b decode 128" \
           > /dev/null 2>&1; cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv $L/ncu_*.log
       for b in 32 128; do
           timeout 90 python3 scripts/gpu_ablation.py qwen3-4b --batch $b \
               --families paged_decode,rope,add_rms_norm,rms_norm,silu,gather_rows,argmax > $L/abl_$b.log 2>&1
           say "ablation batch $b:"; tail -9 $L/abl_$b.log | tee -a $S
       done
       lat q3 120 $Q3; rm -f $L/*.json ;;
call2) lat q3 120 $Q3
       timeout 330 python3 scripts/gemm_algos_bench.py --wide --m 32 128 --reps 10 --output-json $L/algos_wide.json \
           > $L/algos_wide.log 2>&1
       say "gemm algos, wide:"; grep -v "^$" $L/algos_wide.log | tail -16 | tee -a $S
       rm -f $L/q3*.json ;;
*) echo "usage: $0 call1|call2"; exit 2 ;;
esac
