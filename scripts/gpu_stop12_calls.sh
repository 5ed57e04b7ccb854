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
R=${OUT:-/tmp/openinfer-gpu}; L=/tmp/L; mkdir -p "$R" $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(git rev-parse --short HEAD 2>/dev/null)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
OI="python3 -m openinfer"
LAT="$OI bench latency --load-format dummy --device cuda --max-model-len 20480"
T="python3 -m pytest -q -p no:cacheprovider -rfE"
BASE=$PWD/.whl/base
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
base_lat() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site lat "$@"; }
tests() {  # seconds, then the core test files
    local t=$1; shift
    timeout $t $T "$@" > $L/t_core.log 2>&1 &
    timeout $t $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
    timeout $t $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
    wait
    for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
    grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
}
prof() { local name=$1; shift; timeout 60 python3 scripts/gpu_profile.py "$@" > $L/prof_$name.log 2>&1; say "profile $name:"; tail -4 $L/prof_$name.log | tee -a $S; }
startup() {  # name, then env assignments for the server
    local name=$1; shift
    env "$@" timeout 60 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 \
        --server-log $L/${name}_server.log --output-json $L/$name.json -- $OI serve --model qwen3-4b \
        --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/$name.log 2>&1
    say "$name: $(grep -h 'ready\|frameworks' $L/$name.log | tr '\n' ' ')"
}
ncu() { OUT=$L NCU_S=65 TOP=18 timeout 70 bash scripts/gpu_ncu.sh "$@" > /dev/null 2>&1; cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv; }
attn() { local name=$1 t=$2; timeout $t python3 scripts/attn_bench.py --batches 1,32 --contexts 1024 > $L/$name.log 2>&1; say "$name:"; tail -4 $L/$name.log | tee -a $S; }
precompile() { python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1; }
Q3="--model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
Q3B1="--model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 3"
Q35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3"
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
