#!/usr/bin/env bash
# Stop 25's device calls (run from the repo root with `carry: [".whl"]`); logs under $OUT/logs, packed into
# $OUT/logs.tgz at the end so that few files come back.
# call1 (~7 min): the two opt-in Qwen3.5 kernels, tested on the GPU and measured in the engine:
#   - the GDN state walk on the tensor cores (OPENINFER_GDN_STATE_TC=1; prefill only): gdn_prep_bench's timing and
#     comparison with the fp32 walk;
#   - the gated RMSNorm folded into the GDN decode step (OPENINFER_GDN_NORM_FOLD=1; decode only);
#   every Qwen3.5 GPU test with both on (the fold's own tests: bit for bit against the two kernels, graph replay,
#   greedy through the engine), then the engine's Qwen3.5-4B TTFT and TPOT with both off and both on, twice each.
# call2 (~3 min): every Qwen3.5 GPU test on the tree with both made the defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
pack() { tar czf $R/logs.tgz -C $L . && rm -rf $L; }
case ${1:-} in
call1) precompile
       timeout 60 python3 scripts/gdn_prep_bench.py --no-ablations > $L/state_tc.log 2>&1
       say "state walks:"; tail -5 $L/state_tc.log | tee -a $S
       # every Qwen3.5 GPU test with both switches on (what making them the defaults would run)
       OPENINFER_GDN_STATE_TC=1 OPENINFER_GDN_NORM_FOLD=1 timeout 220 $T plugins/qwen35/tests -m cuda \
           > $L/t_on.log 2>&1
       say "qwen35 GPU tests, both on: $(tail -1 $L/t_on.log)"
       grep -h "^FAILED\|^ERROR" $L/t_on.log | cut -c1-220 | head -10 | tee -a $S
       for r in 1 2; do
           lat q35_off_$r 60 $Q35
           OPENINFER_GDN_STATE_TC=1 OPENINFER_GDN_NORM_FOLD=1 lat q35_on_$r 60 $Q35
       done
       rm -f $L/*.json; pack ;;
call2) precompile   # the tree with both as the defaults (the fp32 walk deleted, the fold the only decode path)
       timeout 170 $T plugins/qwen35/tests -m cuda > $L/t_q35.log 2>&1
       say "qwen35 GPU tests: $(tail -1 $L/t_q35.log)"
       grep -h "^FAILED\|^ERROR" $L/t_q35.log | cut -c1-220 | head -10 | tee -a $S
       pack ;;
*) echo "usage: $0 call1|call2"; exit 2 ;;
esac
