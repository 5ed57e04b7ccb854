#!/usr/bin/env bash
# Branch next/gemv-cluster-reduce, for the next session's H200 run (not run yet: stop 16 had no device time left).
#   bash scripts/gpu_stop17_calls.sh call1   (server-stack wheels in .whl/, main's tree in .whl/base:
#                                             mkdir -p .whl/base && git archive main core plugins | tar -x -C .whl/base)
# call1: the GEMV's split-K reduced in a thread-block cluster over distributed shared memory instead of a global
#   workspace and an arrival counter: GPU tests (GEMV, linear, tuned splits, graphs; Qwen3 and Qwen3.5 engines), each
#   decode weight under every split factor (gemv_bench.py --splits, against stop 15's table), and batch-1 decode
#   against main, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
case ${1:-} in
call1) precompile; base precompile &
       timeout 200 $T tests/kernels/test_cuda_ops.py -k "gemv or linear or tuned or graph" > $L/t_core.log 2>&1 &
       timeout 200 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       timeout 200 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       wait
       for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
       timeout 90 python3 scripts/gemv_bench.py --splits > $L/gemv_splits.log 2>&1; say "gemv splits:"; tail -11 $L/gemv_splits.log | tee -a $S
       for r in 1 2; do
           lat q3_b1_r$r 40 $Q3B1; base lat base_q3_b1_r$r 40 $Q3B1; lat q35_b1_r$r 45 $Q35; base lat base_q35_b1_r$r 45 $Q35
       done
       grep -h "GEMM tuning" $L/q3_b1_r1.log $L/q35_b1_r1.log | sed 's/.*RSS[^:]*: //' | tee -a $S ;;
*) echo "usage: $0 call1" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
