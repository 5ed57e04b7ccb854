#!/usr/bin/env bash
# Call 4: add_rms_norm_linear (fused GEMV) and the wgmma prefill attention, tests + first figures.
set -uo pipefail
R=$OUT; L=/tmp/L; mkdir -p $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1
T="python3 -m pytest -q -p no:cacheprovider -rfE"
timeout 150 $T tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_kv_offload_cuda.py > $L/t_core.log 2>&1 &
timeout 150 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
timeout 150 $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
wait
for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-200 | head -16 | tee -a $S
timeout 45 python3 scripts/prefill_attn_bench.py --lens 16384 --repeats 5 > $L/pab.log 2>&1; tail -9 $L/pab.log | tee -a $S
LAT="python3 -m openinfer bench latency --load-format dummy --device cuda --max-model-len 20480"
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
lat q3 60 --model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192
OPENINFER_ADDNORM_GEMV=0 lat q3_noaddnorm 25 --model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 2
OPENINFER_PREFILL_WGMMA=1 lat q3_16k_wgmma 35 --model qwen3-4b --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
