#!/usr/bin/env bash
# The H200 calls of stop 12, as run (results: docs/benchmarks/h200-2026-12-03-stop12/).
#   bash scripts/gpu_stop12_calls.sh call1|diag|call3|call4|call5   (server-stack wheels in .whl/, baseline tree in .whl/base)
# The baseline is `git archive d5061fa core plugins` unpacked into .whl/base (the end of stop 11): `base_lat` runs
# bench latency on it in the same call, so before/after share a host.
# call1 (at d0f9cab, with the add+RMSNorm GEMV epilogue): GPU tests of the fused decode kernels, bench latency
#   before/after for Qwen3-4B (batch 1/32/128) and Qwen3.5-4B (batch 1), scripts/gpu_profile.py before/after.
# diag (at 220e60f): test_cuda_ops alone, with every test checking it leaves the arrival counters zero; the kernels
#   a decode graph captures (diag_graph_kernels.py); gemv_bench --fused.
# call3 (at 821eb1d, the add+RMSNorm epilogue out): tests, bench latency before/after, profile, Qwen3.5, attention
#   microbenchmark before/after, prefix hits. call4: the GPU kernel tests call3's timeout cut, attn_bench at batch
#   32, start-up (at 2f17a77). call5: torch in the process? (torchcheck.py, at 2f17a77), then at 3aa1731 start-up
#   twice and PDL on/off at batch 1.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base
base_lat() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site lat "$@"; }
attn() { local name=$1 t=$2; timeout $t python3 scripts/attn_bench.py --batches 1,32 --contexts 1024 > $L/$name.log 2>&1; say "$name:"; tail -4 $L/$name.log | tee -a $S; }
CORE="tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_cuda_graphs_capture.py"
case ${1:-} in
call1) python3 -c "import openinfer; print(openinfer.__file__)" | tee -a $S
       PYTHONPATH=$BASE/core python3 -c "import openinfer; print('base:', openinfer.__file__)" | tee -a $S
       precompile; PYTHONPATH=$BASE/core precompile; tests 170 $CORE
       lat q3 60 $Q3; base_lat base_q3 60 $Q3; lat q35 40 $Q35; base_lat base_q35 45 $Q35
       prof q3 qwen3-4b; PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:/tmp/site prof base_q3 qwen3-4b ;;
diag) precompile; timeout 200 $T tests/kernels/test_cuda_ops.py > $L/t_ops.log 2>&1; tail -1 $L/t_ops.log | tee -a $S
       grep -h "^FAILED\|^ERROR" $L/t_ops.log | cut -c1-300 | head -30 | tee -a $S
       for m in qwen3-4b qwen3.5-4b; do timeout 60 python3 docs/benchmarks/h200-2026-12-03-stop12/diag_graph_kernels.py $m > $L/diag_$m.log 2>&1; tail -22 $L/diag_$m.log | tee -a $S; done
       timeout 90 python3 scripts/gemv_bench.py --fused > $L/gemv_fused.log 2>&1; tail -30 $L/gemv_fused.log | tee -a $S ;;
call3) precompile; PYTHONPATH=$BASE/core precompile; tests 170 $CORE
       lat q3 60 $Q3; base_lat base_q3 60 $Q3; prof q3 qwen3-4b; lat q35 40 $Q35
       attn attn 15; PYTHONPATH=$BASE/core attn base_attn 15
       timeout 100 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 6 --gc-freeze > $L/prefix_hit.log 2>&1
       tail -10 $L/prefix_hit.log | tee -a $S ;;
call4) precompile
       timeout 220 $T tests/kernels/test_cuda_ops.py -k "decode or attention or prefill" > $L/t_ops1.log 2>&1 &
       timeout 220 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_cuda_graphs_capture.py \
           -k "not (decode or attention or prefill)" > $L/t_ops2.log 2>&1 &
       wait; for f in ops1 ops2; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_ops*.log | cut -c1-220 | head -16 | tee -a $S
       CUDA_LAUNCH_BLOCKING=1 timeout 40 python3 scripts/attn_bench.py --batches 32 --contexts 1024 > $L/attn32.log 2>&1
       grep -v "^  File\|^    " $L/attn32.log | head -12 | tee -a $S
       startup startup ;;
call5) precompile; python3 docs/benchmarks/h200-2026-12-03-stop12/torchcheck.py 2>&1 | grep -v "^20[0-9][0-9]-" | tee -a $S
       startup startup1; startup startup2
       for p in 0 1 0 1; do OPENINFER_PDL=$p lat q3_b1_pdl$p 40 $Q3B1; done ;;
*) echo "usage: $0 call1|diag|call3|call4|call5" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
