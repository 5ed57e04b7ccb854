#!/usr/bin/env bash
# Stop 17's H200 runs, made from branch next/combined (main + next/gemv-cluster-reduce + next/gdn-gating-fold).
#   bash scripts/gpu_stop17_calls.sh callN   (server-stack wheels in .whl/; trees to compare, each made with
#                                             git archive REV core plugins | tar -x -C .whl/NAME:
#                                             base = main, clu = next/gemv-cluster-reduce, gdn = next/gdn-gating-fold)
# call6: batch 1 / 32 / 128 of the merged main against stop 16's tree, alternating, twice.
# call1: GPU tests of the combined tree (GEMV, linear, tuned splits, graphs; Qwen3 and Qwen3.5 engines); each decode
#   weight under every split factor (cluster reduction); the decode-graph ablation of main (Qwen3, Qwen3.5); batch-1
#   decode of main, cluster and combined trees alternating, twice.
# call2 (combined tree; base = main, pdlall = combined with pdl.MAX_DECODE_ROWS = 4096): the Qwen3 PDL test (its spy
#   now sees cluster launches), the decode-graph ablation of main (fixed: no pipelined step left in flight), batch
#   1 / 32 / 128 with PDL in every decode graph against without, and against main; prefix hits, cold prefill and
#   start-up of the combined tree.
# call3 (main = the combined tree, merged): the decode-graph ablation (Qwen3, Qwen3.5, batch 1), Nsight Compute per
#   kernel of Qwen3.5's 1024-token prefill and of Qwen3's batch-32 decode step.
# call4: why decode attention costs 12.6 us a layer at batch 1 (call 3's ablation): Nsight Compute's full section
#   set on one graph-replayed paged_decode launch, and batch-1 decode with 64 / 256 keys a split and with
#   paged_decode off the PDL list.
# call5: the o / out_proj weights pulled into L2 behind RoPE, attention and the GDN steps (prefetch_weight): GPU
#   tests (the hint changes no bit, eager and in graphs; Qwen3 and Qwen3.5 engines), batch-1 decode with it on and
#   off (OPENINFER_L2_PREFETCH=0), alternating, twice each for Qwen3-4B and Qwen3.5-4B.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) precompile & for t in base clu gdn; do tree $t precompile & done
       wait
       tests 200 tests/kernels/test_cuda_ops.py -k "gemv or linear or tuned or graph"
       timeout 90 python3 scripts/gemv_bench.py --splits > $L/gemv_splits.log 2>&1; say "gemv splits:"; tail -11 $L/gemv_splits.log | tee -a $S
       for m in qwen3-4b qwen3.5-4b; do
           tree base timeout 90 python3 scripts/gpu_ablation.py $m > $L/ablation_$m.log 2>&1; say "ablation $m (main):"; tail -15 $L/ablation_$m.log | tee -a $S
       done
       for r in 1 2; do
           tree base lat base_q3_r$r 40 $Q3B1; tree clu lat clu_q3_r$r 40 $Q3B1; lat comb_q3_r$r 40 $Q3B1
           tree base lat base_q35_r$r 45 $Q35; tree clu lat clu_q35_r$r 45 $Q35; tree gdn lat gdn_q35_r$r 45 $Q35; lat comb_q35_r$r 45 $Q35
       done ;;
call2) precompile & for t in base pdlall; do tree $t precompile & done
       wait
       timeout 150 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1; say "tests q3: $(tail -1 $L/t_q3.log)"
       for m in qwen3-4b qwen3.5-4b; do
           tree base timeout 90 python3 scripts/gpu_ablation.py $m > $L/ablation_$m.log 2>&1; say "ablation $m (main):"; tail -15 $L/ablation_$m.log | tee -a $S
       done
       lat comb_q3_r1 60 $Q3; tree pdlall lat pdlall_q3_r1 60 $Q3; tree base lat base_q3 60 $Q3
       lat comb_q3_r2 60 $Q3; tree pdlall lat pdlall_q3_r2 60 $Q3
       timeout 120 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 6 --gc-freeze > $L/prefix.log 2>&1
       say "prefix hit:"; tail -7 $L/prefix.log | tee -a $S
       startup startup ;;
call3) precompile
       for m in qwen3-4b qwen3.5-4b; do
           timeout 100 python3 scripts/gpu_ablation.py $m > $L/ablation_$m.log 2>&1; say "ablation $m:"; tail -15 $L/ablation_$m.log | tee -a $S
       done
       ncu "qwen3.5-4b prefill 1024" "qwen3-4b decode 32" ;;
call4) precompile
       NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       timeout 150 $NCU --clock-control none --graph-profiling node -k regex:paged_decode_mma -s 80 -c 1 --set full \
           python3 scripts/gpu_kernel_times.py qwen3-4b decode 1 > $L/ncu_attn_full.txt 2>&1
       say "ncu paged_decode, batch 1:"
       grep -E "^  [a-zA-Z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Theoretical Occ|Registers Per|Grid Size|Block Size|Dynamic Shared|Waves Per SM|Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued|Issued Ipc|Executed Instructions  " $L/ncu_attn_full.txt | head -40 | tee -a $S
       grep -A3 -iE "stall|latency issue" $L/ncu_attn_full.txt | cut -c1-230 | head -30 | tee -a $S
       for r in 1 2; do
           lat q3_keys64_r$r 40 $Q3B1; OPENINFER_DECODE_SPLIT_KEYS=256 lat q3_keys256_r$r 40 $Q3B1
           OPENINFER_PDL=gemv,rope,add_rms_norm,rms_norm lat q3_nopdl_attn_r$r 40 $Q3B1
       done ;;
call5) precompile
       tests 200 tests/kernels/test_cuda_ops.py -k "prefetch or gemv_graph or linear_gemv"
       for r in 1 2; do
           lat q3_on_r$r 40 $Q3B1; OPENINFER_L2_PREFETCH=0 lat q3_off_r$r 40 $Q3B1
           lat q35_on_r$r 45 $Q35; OPENINFER_L2_PREFETCH=0 lat q35_off_r$r 45 $Q35
       done ;;
call6) precompile; tree base precompile   # main (merged) against stop 16's a6d65a2 at batch 1 / 32 / 128, alternating
       for r in 1 2; do tree base lat base_q3_r$r 60 $Q3; lat main_q3_r$r 60 $Q3; done ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
