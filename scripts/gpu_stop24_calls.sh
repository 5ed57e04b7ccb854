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
# call3 (~5 min): gdn_chunk_prep with a row's exp(gamma) and beta exp(gamma) computed once (not per element): its
#   time against the stop-23 kernel (.whl/base24 = git archive of af80286, the commit before) and four ablations
#   (gdn_prep_bench.py), the delta-rule GPU tests, and Qwen3.5-4B's 1k prefill in the engine, both trees alternating.
# call4 (~5 min): the final tree's engine GPU tests (the scheduler's admission changed: priority scheduling):
#   the Qwen3 and Qwen3.5 CUDA engines (eager = graph, batched, prefix hits, against transformers), sampling,
#   structured outputs, prompt logprobs, graph capture and KV offload on the GPU.
# call5 (~3 min, branch next/gdn-state-tc): the GDN state walk on the tensor cores (gdn_chunk_state_tc, 3xTF32):
#   its time and output against gdn_chunk_state (gdn_prep_bench.py), Qwen3.5's delta-rule GPU tests with it
#   (OPENINFER_GDN_STATE_TC=1), and the 1k prefill in the engine without and with it.
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
call3) precompile
       timeout 120 python3 scripts/gdn_prep_bench.py \
           --source base=.whl/base24/plugins/qwen35/openinfer_qwen35/cuda/delta_rule.cu > $L/prep.log 2>&1
       say "gdn_chunk_prep:"; tail -9 $L/prep.log | tee -a $S
       timeout 150 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py -k "delta or chunk or prefill or checkpoint" \
           > $L/t_q35.log 2>&1
       say "tests q35: $(tail -1 $L/t_q35.log)"; grep -h "^FAILED\|^ERROR" $L/t_q35.log | cut -c1-220 | head -8 | tee -a $S
       P35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 8 --num-iters 5"
       for r in 1 2; do
           OPENINFER_CACHE_DIR=/tmp/oc_base tree base24 timeout 60 $LAT $P35 > $L/q35_base_$r.log 2>&1
           say "q35_base_$r:"; grep -A3 "^batch" $L/q35_base_$r.log | tail -1 | tee -a $S
           lat q35_cur_$r 60 $P35
       done
       rm -f $L/*.json ;;
call4) precompile
       timeout 280 $T plugins/qwen3/tests/test_cuda_engine.py tests/test_cuda_graphs_capture.py \
           tests/test_kv_offload_cuda.py > $L/t_q3.log 2>&1 &
       timeout 280 $T tests/test_cuda_sampling_engine.py tests/test_cuda_structured_engine.py \
           tests/test_cuda_prompt_logprobs.py > $L/t_core.log 2>&1 &
       timeout 280 $T plugins/qwen35/tests/test_qwen35_cuda_engine.py plugins/qwen35/tests/test_qwen35_graphs.py \
           > $L/t_q35.log 2>&1 &
       wait; for f in q3 core q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S ;;
call5) timeout 60 python3 scripts/gdn_prep_bench.py --no-ablations > $L/state_tc.log 2>&1
       say "state walks:"; tail -5 $L/state_tc.log | tee -a $S
       OPENINFER_GDN_STATE_TC=1 timeout 60 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py \
           -k "delta or chunk or checkpoint" > $L/t_tc.log 2>&1
       say "tests with tc: $(tail -1 $L/t_tc.log)"; grep -h "^FAILED\|^ERROR" $L/t_tc.log | cut -c1-220 | head -8 | tee -a $S
       P35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 8 --num-iters 5"
       for tc in 0 1; do OPENINFER_GDN_STATE_TC=$tc lat q35_tc$tc 40 $P35; done
       rm -f $L/*.json ;;
*) echo "usage: $0 call1|call2|call3|call4|call5"; exit 2 ;;
esac
