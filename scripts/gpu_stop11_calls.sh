#!/usr/bin/env bash
# The five H200 calls of stop 11, as run (results: docs/benchmarks/h200-2026-12-03-stop11/callN_*).
#   bash scripts/gpu_stop11_calls.sh call1|call2|call3|call4|call5      (wheels for the server stack in .whl/)
# call1: PDL for every kernel (GPU tests, PDL on/off, qwen3.5, 16k, start-up); call2: the merged helpers (SiLU-fused
# GEMV, word rope, dummy-weight kernel, tokenizer cache, capture, qwen3.5 checkpoint), PDL variants, 64-token
# contexts, ncu decode profiles; call3: paged_combine/rope fixes, GEMV sweep, qwen3.5 prefill profile; call4: the
# add+RMSNorm GEMV and the wgmma prefill attention; call5: final code, first-ever and warm start-up, prefix hits.
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/openinfer-gpu}; L=/tmp/L; mkdir -p "$R" $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
OI="python3 -m openinfer"
LAT="$OI bench latency --load-format dummy --device cuda --max-model-len 20480"
T="python3 -m pytest -q -p no:cacheprovider -rfE"
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
tests() {  # seconds, then the core test files
    local t=$1; shift
    timeout $t $T "$@" > $L/t_core.log 2>&1 &
    timeout $t $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
    timeout $t $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
    wait
    for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
    grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
}
startup() {  # name, then env assignments for the server
    local name=$1; shift
    env "$@" timeout 60 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 \
        --server-log $L/${name}_server.log --output-json $L/$name.json -- $OI serve --model qwen3-4b \
        --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/$name.log 2>&1
    say "$name: $(grep ready $L/$name.log)"
}
ncu() { OUT=$L NCU_S=65 TOP=18 timeout 70 bash scripts/gpu_ncu.sh "$@" > /dev/null 2>&1; cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv; }
precompile() { python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1; }
Q3="--model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
Q3B1="--model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 2"
Q35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3"
K16="--model qwen3-4b --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2"
CORE="tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_kv_offload_cuda.py"
case ${1:-} in
call1) precompile; tests 160 $CORE tests/test_cuda_sampling_engine.py
       OPENINFER_PDL=1 lat q3_pdl1 75 $Q3; OPENINFER_PDL=0 lat q3_pdl0 75 $Q3; lat q35 50 $Q35; lat q3_16k 40 $K16
       startup startup ;;
call2) precompile; tests 150 $CORE tests/test_cuda_sampling_engine.py tests/test_weights_upload_cuda.py
       lat q3 60 $Q3; OPENINFER_PDL=1 OPENINFER_GEMV_PREFETCH=0 lat q3_pdl1_pf0 25 $Q3B1; OPENINFER_PDL=1 lat q3_pdl1_pf8 25 $Q3B1
       lat q3_ctx64 30 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 64 --output-lens 32 --num-iters 2 --max-num-batched-tokens 8192
       lat q35 40 $Q35; lat q3_16k 35 $K16; startup startup1; startup startup2
       ncu "qwen3.5-4b decode 1"; ncu "qwen3-4b decode 1" ;;
call3) precompile; tests 150 $CORE tests/test_cuda_sampling_engine.py tests/test_weights_upload_cuda.py
       lat q3 60 $Q3; lat q35 40 $Q35
       timeout 70 python3 scripts/gemv_bench.py --sweep > $L/gemv_sweep.log 2>&1; grep chain $L/gemv_sweep.log >> $S
       ncu "qwen3.5-4b prefill 1024" ;;
call4) precompile; tests 150 $CORE
       timeout 45 python3 scripts/prefill_attn_bench.py --lens 16384 --repeats 5 > $L/pab.log 2>&1; tail -9 $L/pab.log | tee -a $S
       lat q3 60 $Q3; OPENINFER_ADDNORM_GEMV=0 lat q3_noaddnorm 25 $Q3B1; OPENINFER_PREFILL_WGMMA=1 lat q3_16k_wgmma 35 $K16 ;;
call5) startup startup_cold OPENINFER_CACHE_DIR=/tmp/oc_cold; cp -r /tmp/oc_cold /tmp/oc
       tests 130 $CORE; startup startup1; startup startup2; lat q3 60 $Q3; lat q3_16k 35 $K16
       timeout 120 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
       tail -10 $L/prefix_hit.log | tee -a $S ;;
*) echo "usage: $0 call1|call2|call3|call4|call5" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
