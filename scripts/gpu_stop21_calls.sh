#!/usr/bin/env bash
# Stop 21's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh).
#   bash scripts/gpu_stop21_calls.sh callN
# call1 (~7 min): main on the GPU after stop 20 (the split kernel tests, both engines, structured outputs), the
#   first-ever and warm `serve` start-up with idle RSS, where a batch-1 decode step goes on this card (gpu_ablation,
#   both lines) and each decode weight's GEMV against a plain read of it (hbm_read_bench).
# call1b (~5 min): call 1's tests and start-up again (call 1 ran without the wheels carried: run with carry .whl).
# call2 (~9 min): the rest of the core GPU tests (call 1's core run stopped at its time limit), both engines' GPU
#   tests, with the GDN decode step, its output norm and decode attention taking fewer round trips after their wait; then
#   Qwen3-4B and Qwen3.5-4B batch 1 against main before them (.whl/base = 4feabc9), alternating, two rounds.
# call3 and call4 were written here and ran as stop 22's call1 and call2 (scripts/gpu_stop22_calls.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
K=tests/kernels
main_checks() {   # call 1's GPU tests of main (the split kernel modules, both engines) and its start-ups
    precompile
    tests 240 $K/test_cuda_ops.py $K/test_cuda_elementwise.py $K/test_cuda_gemv.py $K/test_cuda_attention.py \
        $K/test_cuda_lt.py $K/test_cuda_launch_args.py $K/test_cuda_sampling.py $K/test_cuda_compile.py \
        tests/test_cuda_structured_engine.py tests/test_cuda_sampling_engine.py tests/test_cuda_graphs_capture.py \
        tests/test_weights_upload_cuda.py tests/test_kv_offload_cuda.py
    tar -C $L -czf $R/logs_early.tgz .
    startup first_start OPENINFER_CACHE_DIR=/tmp/oc_empty; startup warm_start OPENINFER_CACHE_DIR=/tmp/oc_empty
}
case ${1:-} in
call1) main_checks
       for m in qwen3-4b qwen3.5-4b; do
           timeout 150 python3 scripts/gpu_ablation.py $m > $L/ablation_$m.log 2>&1; say "ablation $m:"; tail -14 $L/ablation_$m.log | tee -a $S
       done
       ( cd scripts && timeout 90 python3 hbm_read_bench.py --output-json $L/hbm_read.json > $L/hbm_read.log 2>&1 )
       say "hbm_read_bench:"; tail -7 $L/hbm_read.log | tee -a $S ;;
call1b) main_checks; startup warm_start2 OPENINFER_CACHE_DIR=/tmp/oc_empty ;;
call2) tree base precompile & precompile & wait
       timeout 200 $T --durations=8 $K/test_cuda_attention.py $K/test_cuda_lt.py $K/test_cuda_sampling.py \
           tests/test_cuda_structured_engine.py tests/test_cuda_sampling_engine.py tests/test_cuda_graphs_capture.py \
           tests/test_weights_upload_cuda.py tests/test_kv_offload_cuda.py > $L/t_core.log 2>&1 &
       timeout 200 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
       timeout 200 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       wait; for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S
       tar -C $L -czf $R/logs_early.tgz .
       for r in 1 2; do
           tree base lat base_q3_$r 30 $Q3B1; lat cur_q3_$r 30 $Q3B1; tree base lat base_q35_$r 35 $Q35; lat cur_q35_$r 35 $Q35
       done ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
