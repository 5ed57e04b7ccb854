#!/usr/bin/env bash
# Branch next/gdn-gating-fold, for the next session's H200 run (not run yet: stop 16 had no device time left).
#   bash scripts/gpu_stop17_gdn_calls.sh call1   (server-stack wheels in .whl/, main's tree in .whl/base:
#                                                 mkdir -p .whl/base && git archive main core plugins | tar -x -C .whl/base)
# call1: Qwen3.5's decode step computing its own GDN gating (qwen35_gdn_decode: 24 launches fewer a step): the
#   Qwen3.5 GPU tests (the fold bit for bit against gdn_gating + the update kernel; engine against transformers and
#   eager), then batch-1 TPOT against main, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
case ${1:-} in
call1) precompile; base precompile &
       timeout 200 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1
       wait
       say "tests q35: $(tail -1 $L/t_q35.log)"; grep -h "^FAILED\|^ERROR" $L/t_q35.log | cut -c1-220 | head -16 | tee -a $S
       for r in 1 2; do lat q35_b1_r$r 45 $Q35; base lat base_q35_b1_r$r 45 $Q35; done ;;
*) echo "usage: $0 call1" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
