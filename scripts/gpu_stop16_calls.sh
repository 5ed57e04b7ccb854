#!/usr/bin/env bash
# The H200 calls of stop 16 (results: docs/benchmarks/h200-2026-12-04-stop16/).
#   bash scripts/gpu_stop16_calls.sh callN   (server-stack wheels in .whl/, the stop-15 tree e9fd452 in .whl/base)
# call1: decode kernels that read before griddepcontrol.wait what no kernel of the step writes (decode attention:
#   its first K/V tiles, key L - 1 copied again after the wait; the Qwen3.5 conv and delta-rule updates: their
#   state), and the GEMV loading 2 or 3 iterations' weights before the wait (OPENINFER_GEMV_VARIANT=u4_p2/u4_p3).
#   GPU tests (core kernels and graphs, Qwen3 engine; Qwen3.5 with its GDN kernels on PDL too), then Qwen3-4B
#   batch-1 decode per variant against the stop-15 tree, twice.
# call2: Qwen3.5-4B batch 1 with the GDN kernels on PDL against the default and the stop-15 tree, twice; the eager
#   cold-1k question of stop 15 (PDL for the GEMVs or not, twice); Qwen3-4B batch 32 / 128 against the stop-15 tree.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
GDN=gemv,paged_decode,rope,add_rms_norm,rms_norm,conv_update,gdn_gating,gdn_decode,gated_rms_norm,sigmoid_gate
case ${1:-} in
call1) precompile; base precompile
       timeout 240 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_lt.py \
           -k "decode or gemv or linear or graph or tuned or attention or lt" > $L/t_core.log 2>&1 &
       timeout 240 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       OPENINFER_PDL=$GDN timeout 240 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       wait
       for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
       for r in 1 2; do
           lat q3_b1_r$r 60 $Q3B1; base lat base_q3_b1_r$r 60 $Q3B1
           for v in u4_p2 u4_p3; do OPENINFER_GEMV_VARIANT=$v lat q3_b1_${v}_r$r 60 $Q3B1; done
       done ;;
call2) precompile; base precompile
       for r in 1 2; do
           lat q35_b1_r$r 60 $Q35; OPENINFER_PDL=$GDN lat q35_b1_pdlgdn_r$r 60 $Q35; base lat base_q35_b1_r$r 60 $Q35
       done
       for r in 1 2; do for pdl in default paged_decode,rope,add_rms_norm,rms_norm; do
           env $([ $pdl = default ] || echo OPENINFER_PDL=$pdl) timeout 60 python3 scripts/gpu_prefix_hit.py --lengths 1024 \
               --repeats 10 --gc-freeze > $L/hit_${r}_${pdl%%,*}.log 2>&1
           say "PDL $pdl, round $r:"; grep "cold\|hit" $L/hit_${r}_${pdl%%,*}.log | grep -v pauses | tee -a $S
       done; done
       lat q3 90 $Q3; base lat base_q3 90 $Q3 ;;
*) echo "usage: $0 call1|call2" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
