#!/usr/bin/env bash
# Call 2: merged helpers (silu_mul_linear, word rope, random_fill, tokenizer cache, capture, q35 checkpoint).
set -uo pipefail
R=$OUT; L=/tmp/L; mkdir -p $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
left() { echo $(( 560 - SECONDS )); }
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
lat q3_pdl0 60 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192
OPENINFER_PDL=1 OPENINFER_GEMV_PREFETCH=0 lat q3_pdl1_pf0 25 --model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 2
OPENINFER_PDL=1 lat q3_pdl1_pf8 25 --model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 2
lat q3_ctx64 30 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 64 --output-lens 32 --num-iters 2 --max-num-batched-tokens 8192
lat q35 40 --model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3
lat q3_16k 35 --model qwen3-4b --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2
OI="python3 -m openinfer"
for i in 1 2; do
timeout 30 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 --server-log $L/startup_server$i.log --output-json $L/startup$i.json -- $OI serve --model qwen3-4b --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/startup$i.log 2>&1
say "startup $i: $(grep ready $L/startup$i.log)"
done
grep -E "start-up:|captured" $L/startup_server2.log | cut -c60-200 >> $S
for sc in "qwen3.5-4b decode 1" "qwen3-4b decode 1"; do
  (( $(left) > 70 )) || { say "ncu $sc skipped"; continue; }
  OUT=$L NCU_S=65 TOP=16 timeout 70 bash scripts/gpu_ncu.sh "$sc" > /dev/null 2>&1
done
cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
