#!/usr/bin/env bash
# Stop 22's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh;
# pass carry [".whl"]).   bash scripts/gpu_stop22_calls.sh callN
# call1 (~9 min): stop 21's call3. The GPU tests stop 21 left unfinished at their time limits (the core files from the
#   attention tests on; Qwen3.5's kernel tests and fidelity) with the stop-21 kernels; then each decode weight's GEMV
#   at M = 1 under every split and the kernel variants u4 (the default), u8 and u4_o8. With them, the prompt-logprobs
#   tests on the GPU (score_rows against numpy; the engine's prompt logprobs against its full forward).
# call2 (~6 min): stop 21's call4, issue 6's side by side in one run on one random-weight checkpoint (`openinfer
#   synth`): the transformers peer (scripts/hf_peer.py: 1k / 16k prefill, decode at batch 1 and 32, top-1
#   agreement), then openinfer's decode at batch 1 and 32 on that checkpoint and its cold prefill and prefix hits.
# call3 (~8 min): the capture tests with their inputs awaited (cuda_cases.after_inputs) and the prompt-logprobs
#   tests; then Qwen3-4B and Qwen3.5-4B batch 1 with the GEMV kernel variant u4_o8 (u4 capped at 64 registers for 8
#   CTAs an SM, each weight's split tuned for it) against u4 (the default), alternating, two rounds. Call 1's
#   gemv_bench put u4_o8 ahead on the wide weights (gate_up 41.9 against 44.5 us, lm_head 283.7 against 290.4).
# call4 (~4 min): the engine GPU tests of both lines, the sampling / structured / prompt-logprobs engine tests and
#   Qwen3.5's prompt logprobs against transformers on the GPU, with prompt scoring in the step path; then Qwen3-4B
#   and Qwen3.5-4B batch 1 once each (call 3's u4 rounds are the baseline: 3.52-3.53 and 3.58 ms).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
K=tests/kernels
case ${1:-} in
call1) precompile
       timeout 280 $T --durations=10 $K/test_cuda_attention.py $K/test_cuda_lt.py $K/test_cuda_sampling.py \
           tests/test_cuda_structured_engine.py tests/test_cuda_sampling_engine.py tests/test_cuda_graphs_capture.py \
           tests/test_weights_upload_cuda.py tests/test_kv_offload_cuda.py tests/test_cuda_prompt_logprobs.py \
           $K/test_cuda_ops.py > $L/t_core.log 2>&1 &
       timeout 280 $T -k "cuda or gpu or checkpoint" plugins/qwen35/tests/test_qwen35_cuda_ops.py \
           plugins/qwen35/tests/test_qwen35_fidelity.py > $L/t_q35.log 2>&1 &
       wait; for f in core q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S
       for v in u4 u8 u4_o8; do   # does a weight stream faster with more loads in flight a thread (u8) or more CTAs?
           OPENINFER_GEMV_VARIANT=$v timeout 70 python3 scripts/gemv_bench.py --splits > $L/splits_$v.log 2>&1
           say "gemv splits, $v:"; tail -11 $L/splits_$v.log | tee -a $S
       done ;;
call2) precompile
       timeout 120 $OI synth --preset qwen3-4b --out /tmp/q3 --device cuda > $L/synth.log 2>&1; say "synth: $(tail -1 $L/synth.log)"
       timeout 240 python3 scripts/hf_peer.py /tmp/q3 --agreement > $L/peer.json 2> $L/peer.err
       say "transformers peer: $(cat $L/peer.json)"; tail -3 $L/peer.err | tee -a $S
       lat ours_q3 60 --model /tmp/q3 --batch-sizes 1,32 --input-lens 1024 --output-lens 64 --num-iters 2 \
           --max-num-batched-tokens 8192
       timeout 90 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 6 --gc-freeze > $L/prefix.log 2>&1
       say "prefix hits and cold prefill:"; tail -6 $L/prefix.log | tee -a $S ;;
call3) precompile
       timeout 200 $T $K/test_cuda_attention.py $K/test_cuda_ops.py > $L/t_core.log 2>&1 &
       timeout 200 $T -v $K/test_cuda_gemv.py $K/test_cuda_lt.py tests/test_cuda_prompt_logprobs.py > $L/t_q3.log 2>&1 &
       wait; for f in core q3; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S
       grep -h "prompt_logprobs.py.*PASSED" $L/t_q3.log | wc -l | xargs -I{} echo "prompt-logprobs engine tests passed: {}" | tee -a $S
       for r in 1 2; do
           lat u4_q3_$r 40 $Q3B1; OPENINFER_GEMV_VARIANT=u4_o8 lat o8_q3_$r 40 $Q3B1
           lat u4_q35_$r 45 $Q35; OPENINFER_GEMV_VARIANT=u4_o8 lat o8_q35_$r 45 $Q35
       done ;;
call4) precompile
       timeout 200 $T plugins/qwen3/tests/test_cuda_engine.py tests/test_cuda_sampling_engine.py \
           tests/test_cuda_structured_engine.py tests/test_cuda_prompt_logprobs.py > $L/t_core.log 2>&1 &
       timeout 200 $T plugins/qwen35/tests/test_qwen35_cuda_engine.py plugins/qwen35/tests/test_qwen35_cuda.py \
           > $L/t_q35.log 2>&1 &
       wait; for f in core q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S
       lat q3 40 $Q3B1; lat q35 45 $Q35 ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
