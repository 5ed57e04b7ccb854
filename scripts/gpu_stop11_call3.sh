#!/usr/bin/env bash
# Call 3: combine/rope fixes, silu fusion removed; qwen3.5 prefill profile; GEMV knob sweep.
set -uo pipefail
R=$OUT; L=/tmp/L; mkdir -p $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1
T="python3 -m pytest -q -p no:cacheprovider -rfE"
timeout 150 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_cuda_sampling_engine.py tests/test_weights_upload_cuda.py tests/test_kv_offload_cuda.py > $L/t_core.log 2>&1 &
timeout 150 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
timeout 150 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
wait
for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -14 | tee -a $S
LAT="python3 -m openinfer bench latency --load-format dummy --device cuda --max-model-len 20480"
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
lat q3 60 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192
lat q35 40 --model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3
timeout 70 python3 scripts/gemv_bench.py --sweep > $L/gemv_sweep.log 2>&1; grep -E "chain|M " $L/gemv_sweep.log | sort -k5 -n | head -40 >> $S; head -14 $L/gemv_sweep.log >> $S
OUT=$L NCU_S=65 TOP=18 timeout 70 bash scripts/gpu_ncu.sh "qwen3.5-4b prefill 1024" > /dev/null 2>&1
cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
