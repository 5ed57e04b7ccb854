#!/usr/bin/env bash
# Call 5 (final): GPU tests of the final code, then the issue-6 figures (decode, prefill 1k/16k, start-up, prefix hits).
set -uo pipefail
R=$OUT; L=/tmp/L; mkdir -p $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
left() { echo $(( 335 - SECONDS )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
OI="python3 -m openinfer"
# first-ever start: empty kernel cache (every .cu compiled by NVRTC during start-up), tokenizer cache empty too
OPENINFER_CACHE_DIR=/tmp/oc_cold timeout 60 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 --server-log $L/startup_cold_server.log --output-json $L/startup_cold.json -- $OI serve --model qwen3-4b --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/startup_cold.log 2>&1
say "startup first-ever: $(grep ready $L/startup_cold.log)"
cp -r /tmp/oc_cold /tmp/oc
T="python3 -m pytest -q -p no:cacheprovider -rfE"
timeout 130 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_kv_offload_cuda.py > $L/t_core.log 2>&1 &
timeout 130 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
timeout 130 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
wait
for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-200 | head -16 | tee -a $S
for i in 1 2; do
timeout 25 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 --server-log $L/startup_server$i.log --output-json $L/startup$i.json -- $OI serve --model qwen3-4b --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/startup$i.log 2>&1
say "startup warm $i: $(grep ready $L/startup$i.log)"
done
LAT="python3 -m openinfer bench latency --load-format dummy --device cuda --max-model-len 20480"
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
lat q3 60 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192
lat q3_16k 35 --model qwen3-4b --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2
if (( $(left) > 40 )); then
  timeout $(( $(left) - 5 )) python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 10 --gc-freeze > $L/prefix_hit.log 2>&1
  say "prefix hit:"; tail -6 $L/prefix_hit.log | tee -a $S
else say "prefix hit skipped"; fi
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
