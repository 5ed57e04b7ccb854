#!/usr/bin/env bash
# Stop 25's device calls (run from the repo root with `carry: [".whl"]`); logs under $OUT/logs, packed into
# $OUT/logs.tgz at the end so that few files come back.
# call1 (~6 min): the two opt-in Qwen3.5 kernels measured in the engine and tested on the GPU:
#   - the GDN state walk on the tensor cores (OPENINFER_GDN_STATE_TC=1): gdn_prep_bench's timing and comparison
#     with the fp32 walk, the delta-rule GPU tests with it on;
#   - the gated RMSNorm folded into the GDN decode step (OPENINFER_GDN_NORM_FOLD=1): its GPU tests (bit for bit
#     against the two kernels, graph replay, greedy through the engine);
#   then the engine's Qwen3.5-4B TTFT and TPOT with both off and both on (the walk runs in prefill only, the fold
#   in decode only), twice each, and an ablation with both on.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
pack() { tar czf $R/logs.tgz -C $L . && rm -rf $L; }
case ${1:-} in
call1) precompile
       timeout 60 python3 scripts/gdn_prep_bench.py --no-ablations > $L/state_tc.log 2>&1
       say "state walks:"; tail -5 $L/state_tc.log | tee -a $S
       OPENINFER_GDN_STATE_TC=1 timeout 90 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py \
           -k "delta or chunk or checkpoint" > $L/t_tc.log 2>&1
       say "tests with tc: $(tail -1 $L/t_tc.log)"; grep -h "^FAILED\|^ERROR" $L/t_tc.log | cut -c1-220 | head -8 | tee -a $S
       timeout 150 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py plugins/qwen35/tests/test_qwen35_graphs.py \
           plugins/qwen35/tests/test_qwen35_cuda.py -k "norm or fold" > $L/t_fold.log 2>&1
       say "tests fold: $(tail -1 $L/t_fold.log)"; grep -h "^FAILED\|^ERROR" $L/t_fold.log | cut -c1-220 | head -8 | tee -a $S
       for r in 1 2; do
           lat q35_off_$r 60 $Q35
           OPENINFER_GDN_STATE_TC=1 OPENINFER_GDN_NORM_FOLD=1 lat q35_on_$r 60 $Q35
       done
       OPENINFER_GDN_STATE_TC=1 OPENINFER_GDN_NORM_FOLD=1 timeout 90 python3 scripts/gpu_ablation.py qwen3.5-4b \
           > $L/abl_on.log 2>&1
       say "ablation, both on:"; tail -12 $L/abl_on.log | tee -a $S
       rm -f $L/*.json; pack ;;
*) echo "usage: $0 call1"; exit 2 ;;
esac
