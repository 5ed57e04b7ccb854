#!/usr/bin/env bash
# Call 1: PDL for every kernel. GPU tests, then PDL on/off figures, ncu at b128, start-up.
set -uo pipefail
R=$OUT; L=/tmp/L; mkdir -p $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(git log -1 --format=%h)"
T="python3 -m pytest -q -p no:cacheprovider -rfE -x"
python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1
timeout 160 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_cuda_sampling_engine.py > $L/t_core.log 2>&1 &
timeout 160 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
timeout 160 $T plugins/qwen35/tests -k "cuda or gpu" > $L/t_q35.log 2>&1 &
wait
for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
grep -h "^FAILED\|^ERROR\|Error" $L/t_*.log | cut -c1-200 | head -12 | tee -a $S
LAT="python3 -m openinfer bench latency --load-format dummy --device cuda"
for p in 1 0; do
  OPENINFER_PDL=$p timeout 75 $LAT --model qwen3-4b --max-model-len 20480 --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192 --output-json $L/lat_q3_pdl$p.json > $L/lat_q3_pdl$p.log 2>&1
  say "qwen3-4b PDL=$p:"; grep -A4 "^batch" $L/lat_q3_pdl$p.log | tee -a $S || tail -3 $L/lat_q3_pdl$p.log | tee -a $S
done
timeout 50 $LAT --model qwen3.5-4b --max-model-len 4096 --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 2 --output-json $L/lat_q35.json > $L/lat_q35.log 2>&1
say "qwen3.5 PDL=1:"; grep -A2 "^batch" $L/lat_q35.log | tee -a $S || tail -3 $L/lat_q35.log | tee -a $S
timeout 40 $LAT --model qwen3-4b --max-model-len 20480 --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2 --output-json $L/lat_16k.json > $L/lat_16k.log 2>&1
say "16k:"; grep -A2 "^batch" $L/lat_16k.log | tee -a $S
OI="python3 -m openinfer"
timeout 30 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 --server-log $L/startup_server.log --output-json $L/startup.json -- $OI serve --model qwen3-4b --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/startup.log 2>&1
say "startup:"; tail -4 $L/startup.log | tee -a $S; grep -E "start-up:" $L/startup_server.log | cut -c60-230 >> $S
OUT=$L NCU_S=75 TOP=14 timeout 85 bash scripts/gpu_ncu.sh "qwen3-4b decode 128" > /dev/null 2>&1
cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
