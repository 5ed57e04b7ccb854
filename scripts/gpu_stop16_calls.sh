#!/usr/bin/env bash
# The H200 calls of stop 16 (results: docs/benchmarks/h200-2026-12-04-stop16/).
#   bash scripts/gpu_stop16_calls.sh callN   (server-stack wheels in .whl/, the stop-15 tree e9fd452 in .whl/base)
# Trees as run (the device's .git is stale and prints e9fd452): call1 14838a4, call2 14838a4 (GDN list passed by
# env), call3 b91ffa6, call5 0bd5a63 (the fold of calls 3 and 5 was then taken out, with gemv_bench.py --norm).
# call1: decode kernels that read before griddepcontrol.wait what no kernel of the step writes (decode attention:
#   its first K/V tiles, key L - 1 copied again after the wait; the Qwen3.5 conv and delta-rule updates: their
#   state), and the GEMV loading 2 or 3 iterations' weights before the wait (OPENINFER_GEMV_VARIANT=u4_p2/u4_p3).
#   GPU tests (core kernels and graphs, Qwen3 engine; Qwen3.5 with its GDN kernels on PDL too), then Qwen3-4B
#   batch-1 decode per variant against the stop-15 tree, twice.
# call2: Qwen3.5-4B batch 1 with the GDN kernels on PDL against the default and the stop-15 tree, twice; the eager
#   cold-1k question of stop 15 (PDL for the GEMVs or not, twice); Qwen3-4B batch 32 / 128 against the stop-15 tree.
# call3: the add + RMSNorm folded into the GEMV after it (add_rms_norm_linear, <= 4 rows): GPU tests (core kernels,
#   Qwen3 engine, Qwen3.5), then Qwen3-4B batch 1 with it, without it (OPENINFER_NORM_GEMV_ROWS=0) and the stop-15
#   tree, twice.
# call4: the same for Qwen3.5-4B; batches 2 and 4 with and without; batches 32 / 128, prefix hits, cold prefill,
#   start-up of the final code.
# call5 (call 3 measured batch 1 ~1 ms slower with the fold): the fold against the two ops per shape and in a
#   36-layer chain (gemv_bench.py --norm), and Nsight Compute's per-kernel times of a batch-1 decode step.
# call6 (final code): GPU tests (core decode attention, GEMV, graphs; Qwen3 engine; Qwen3.5), bench latency against
#   the stop-15 tree (Qwen3 1/32/128, Qwen3.5 batch 1), prefix hits and cold prefill, start-up.
# call7: the RMSNorm kernels keep a one-pass row in registers across the block sum and load their weights before
#   griddepcontrol.wait: GPU tests (norm kernels; Qwen3 engine; Qwen3.5), batch-1 decode against the stop-15 tree.
# call8 (warm, right after call 7): batch-1 decode against the stop-15 tree, twice more.
# call9 (warm): batch-1 decode with the norm change against the tree just before it (dfd6097 in .whl/base2), three
#   times for Qwen3-4B and twice for Qwen3.5-4B.
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
call3) precompile; base precompile
       timeout 300 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_lt.py \
           -k "norm or gemv or linear or decode or graph or tuned or lt" > $L/t_core.log 2>&1 &
       timeout 300 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       timeout 300 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       wait
       for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
       for r in 1 2; do
           lat q3_b1_r$r 60 $Q3B1; OPENINFER_NORM_GEMV_ROWS=0 lat q3_b1_nofuse_r$r 60 $Q3B1; base lat base_q3_b1_r$r 60 $Q3B1
       done ;;
call4) precompile; base precompile
       for r in 1 2; do
           lat q35_b1_r$r 60 $Q35; OPENINFER_NORM_GEMV_ROWS=0 lat q35_b1_nofuse_r$r 60 $Q35; base lat base_q35_b1_r$r 60 $Q35
       done
       B24="--model qwen3-4b --batch-sizes 2,4 --input-lens 1024 --output-lens 64 --num-iters 2"
       lat q3_b24 60 $B24; OPENINFER_NORM_GEMV_ROWS=0 lat q3_b24_nofuse 60 $B24
       lat q3 90 $Q3; base lat base_q3 90 $Q3
       timeout 150 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
       say "prefix hit:"; grep "budget\|cold\|hit \|pauses" $L/prefix_hit.log | tee -a $S
       startup startup ;;
call5) precompile
       timeout 150 python3 scripts/gemv_bench.py --norm > $L/norm_bench.log 2>&1; say "norm fold:"; tail -12 $L/norm_bench.log | tee -a $S
       ncu "qwen3-4b decode 1" ;;
call6) precompile; base precompile
       timeout 230 $T tests/kernels/test_cuda_ops.py -k "decode or attention or gemv or linear or graph or tuned" \
           > $L/t_core.log 2>&1 &
       timeout 230 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       timeout 230 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       wait
       for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
       lat q3 80 $Q3; base lat base_q3 80 $Q3
       lat q35_b1 50 $Q35; base lat base_q35_b1 50 $Q35
       timeout 100 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 6 --gc-freeze > $L/prefix_hit.log 2>&1
       say "prefix hit:"; grep "budget\|cold\|hit \|pauses" $L/prefix_hit.log | tee -a $S
       startup startup ;;
call7) precompile; base precompile &
       timeout 170 $T tests/kernels/test_cuda_ops.py -k "norm or graph" > $L/t_core.log 2>&1 &
       timeout 170 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       timeout 170 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       wait
       for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
       lat q3_b1 40 $Q3B1; base lat base_q3_b1 40 $Q3B1; lat q35_b1 40 $Q35 ;;
call8) for r in 1 2; do lat q3_b1_r$r 35 $Q3B1; base lat base_q3_b1_r$r 35 $Q3B1; done; lat q35_b1_r2 40 $Q35 ;;
call9) B2=$PWD/.whl/base2; b2() { PYTHONPATH=$B2/core:$B2/plugins/qwen3:$B2/plugins/qwen35:/tmp/site "$@"; }
       b2 precompile
       for r in 1 2 3; do lat q3_b1_r$r 35 $Q3B1; b2 lat nonorm_q3_b1_r$r 35 $Q3B1; done
       for r in 1 2; do lat q35_b1_r$r 40 $Q35; b2 lat nonorm_q35_b1_r$r 40 $Q35; done ;;
*) echo "usage: $0 call1|...|call9" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
