#!/usr/bin/env bash
# Stop 23's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh;
# pass carry [".whl"]).   bash scripts/gpu_stop23_calls.sh callN
# call1 (~3 min): does a persistent GEMV chain whose weights stream through shared memory ahead of the math
#   (gemv_stream: a producer warp a SM copying with cp.async.bulk across op boundaries) read a Qwen3-4B step's 145
#   GEMVs faster than a kernel per GEMV? scripts/gemv_chain_bench.py at four ring shapes, beside stop 14's chain
#   and the engine's GEMV; then the engine's batch 1 for this machine's baseline.
# call2 (~2 min): Nsight Compute on gemv_stream (ring 8 x 24 KB) and the first GEMV kernels of a 8-layer chain:
#   speed of light, warp stall reasons, occupancy. Call 1 had gemv_stream at 1.6-1.8 TB/s against 2.6 for the units.
# call3 (~4 min): where Qwen3.5's 1k prefill spends its GDN time: Nsight Compute (full set) on the first layer's
#   gdn_chunk_prep and gdn_chunk_state (stop 17: 3.87 and 5.52 ms of a 23.4 ms prefill over 24 layers, 2-5x their
#   estimates in delta_rule.cu), and every kernel's time of one 1k prefill.
# call4 (~8 min): gdn_chunk_state with 16 warps a block (the new default) against 8: Qwen3.5's GPU kernel tests (the
#   two builds bit for bit among them) and engine tests, each prefill kernel's time under Nsight Compute for both,
#   and Qwen3.5-4B's 1k prefill in the engine, alternating, two rounds.
# call5 (~4 min): the final tree (gdn_chunk_state of 16 warps the only build): Qwen3.5's GPU kernel, engine and
#   fidelity tests, and its 1k prefill and decode once more.
# call6 (~5 min; ran at 473377b, whose switch and scripts/gdn_state_bits.py were taken out after it): gdn_chunk_state
#   with 32 warps a block against 16 (OPENINFER_GDN_STATE_WARPS, an experiment's switch): Qwen3.5's delta-rule GPU tests with 32, the two builds' outputs and states compared bit for bit, each
#   build's prefill kernels under Nsight Compute, and the 1k prefill in the engine once each.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) timeout 240 python3 scripts/gemv_chain_bench.py --repeats 10 --output-json $L/gemv_chain.json \
           > $L/gemv_chain.log 2>&1
       say "gemv chain:"; tail -12 $L/gemv_chain.log | tee -a $S
       lat base_q3 50 $Q3B1 ;;
call2) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       cat > /tmp/drv.py <<'PY'
import sys; sys.path.insert(0, "scripts")
import cupy as cp
import gemv_chain_bench as b
c = b.Chain(b.chain_shapes(8), chained=False)
c.stream(8, 24); c.units(); cp.cuda.Device().synchronize()
PY
       timeout 200 $NCU --clock-control none -k regex:"gemv_stream|gemv_units" --launch-count 3 --section SpeedOfLight \
           --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
           --section SourceCounters python3 /tmp/drv.py > $L/ncu_stream.txt 2>&1
       grep -E "gemv_|Duration|DRAM Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Registers Per" \
           $L/ncu_stream.txt | head -60 | tee -a $S ;;
call3) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       precompile
       timeout 200 $NCU --clock-control none -k regex:"gdn_chunk" --launch-count 2 --set full \
           python3 scripts/gpu_kernel_times.py qwen3.5-4b prefill 1024 > $L/ncu_gdn.txt 2>&1
       grep -E "gdn_chunk|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per|Local Memory Spill|Achieved Occupancy|Warp Cycles Per Issued|Dynamic Shared" \
           $L/ncu_gdn.txt | head -40 | tee -a $S
       OUT=$L NCU_S=120 TOP=16 timeout 130 bash scripts/gpu_ncu.sh "qwen3.5-4b prefill 1024" > /dev/null 2>&1
       cat $L/ncu_qwen3.5-4b_prefill_1024.txt | tee -a $S ;;
call4) precompile
       timeout 230 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py plugins/qwen35/tests/test_qwen35_cuda_engine.py \
           > $L/t_q35.log 2>&1
       say "tests q35: $(tail -1 $L/t_q35.log)"; grep -h "^FAILED\|^ERROR" $L/t_q35.log | cut -c1-220 | head -8 | tee -a $S
       for w in 8 16; do
           OPENINFER_GDN_STATE_WARPS=$w OUT=$L NCU_S=100 TOP=6 timeout 110 bash scripts/gpu_ncu.sh \
               "qwen3.5-4b prefill 1024" > /dev/null 2>&1
           say "kernels, state w$w:"; cat $L/ncu_qwen3.5-4b_prefill_1024.txt | tee -a $S
           mv $L/ncu_qwen3.5-4b_prefill_1024.txt $L/ncu_q35_prefill_w$w.txt; rm -f $L/ncu_*.csv
       done
       P35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 8 --num-iters 5"
       for r in 1 2; do for w in 8 16; do OPENINFER_GDN_STATE_WARPS=$w lat q35_w${w}_$r 45 $P35; done; done ;;
call5) precompile
       timeout 250 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1
       say "tests q35: $(tail -1 $L/t_q35.log)"; grep -h "^FAILED\|^ERROR" $L/t_q35.log | cut -c1-220 | head -8 | tee -a $S
       lat q35_final 45 --model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 8 --num-iters 5 ;;
call6) precompile
       OPENINFER_GDN_STATE_WARPS=32 timeout 120 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py -k "delta or checkpoint" \
           > $L/t_w32.log 2>&1; say "tests with 32 warps: $(tail -1 $L/t_w32.log)"
       timeout 100 python3 scripts/gdn_state_bits.py 2>&1 | tail -3 | tee -a $S   # at 473377b (removed since)
       for w in 16 32; do
           OPENINFER_GDN_STATE_WARPS=$w OUT=$L NCU_S=100 TOP=4 timeout 110 bash scripts/gpu_ncu.sh \
               "qwen3.5-4b prefill 1024" > /dev/null 2>&1
           say "kernels, state w$w:"; cat $L/ncu_qwen3.5-4b_prefill_1024.txt | tee -a $S
           mv $L/ncu_qwen3.5-4b_prefill_1024.txt $L/ncu_q35_prefill_w$w.txt; rm -f $L/ncu_*.csv $L/ncu_*.log
       done
       P35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 8 --num-iters 5"
       for w in 16 32; do OPENINFER_GDN_STATE_WARPS=$w lat q35_w$w 45 $P35; done
       rm -f $L/*.json ;;
*) echo "usage: $0 call1|call2|call3|call4|call5|call6"; exit 2 ;;
esac
