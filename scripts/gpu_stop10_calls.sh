#!/usr/bin/env bash
# The device calls behind docs/benchmarks/*-h200.md "stop 10" figures, kept so they can be rerun as they ran:
#   bash scripts/gpu_stop10_calls.sh figures   # PDL latency, 16k prefill, Qwen3.5 latency + step walls + rate
#                                              # sweep, the offload ladder, two Nsight Compute step profiles
#   bash scripts/gpu_stop10_calls.sh final     # tests of the changed kernels, then Qwen3-4B / Qwen3.5-4B latency
# (the first call of the stop was `BUDGET=470 TEST_S=170 bash scripts/gpu_quick.sh`). Carried wheels in .whl/
# (starlette, uvicorn, ...) serve the sweep and the ladder. Output: $OUT/summary.txt, $OUT/r.tgz or copies.
set -u
figures() {
    export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
    R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt
    say() { echo "$*" >> $S; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
    python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >/dev/null 2>&1
    say "$(git log -1 --format=%h 2>/dev/null) tests:"
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_ops.py -k "rms_norm or silu or norms" > $R/tests.log 2>&1; tail -1 $R/tests.log >> $S
    L="python3 -m openinfer bench latency --load-format dummy --device cuda"
    pdl=1
    OPENINFER_GEMV_PDL=$pdl timeout 70 $L --model qwen3-4b --max-model-len 20480 --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192 --output-json $R/lat_qwen3_pdl$pdl.json > $R/lat_qwen3_pdl$pdl.log 2>&1; say "qwen3 PDL=$pdl"; grep -A4 "^batch" $R/lat_qwen3_pdl$pdl.log >> $S
    OPENINFER_GEMV_PDL=1 timeout 40 $L --model qwen3.5-4b --max-model-len 4096 --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 2 --output-json $R/lat_qwen35_pdl.json > $R/lat_qwen35_pdl.log 2>&1; say "qwen3.5 PDL=1"; grep -A2 "^batch" $R/lat_qwen35_pdl.log >> $S
    OPENINFER_GEMV_PDL=1 timeout 40 $L --model qwen3-4b --max-model-len 20480 --batch-sizes 1 --input-lens 16384 --output-lens 2 --num-iters 2 --output-json $R/lat_16k.json > $R/lat_16k.log 2>&1; say "16k"; grep -A2 "^batch" $R/lat_16k.log >> $S
    OPENINFER_GEMV_PDL=1 timeout 40 python3 scripts/gpu_kernel_times.py qwen3.5-4b prefill 1024 > $R/q35_steps.log 2>&1; grep -E "steps|profiled" $R/q35_steps.log >> $S
    OPENINFER_GEMV_PDL=1 OUT=$R/q35 RATES=2,8,32,inf PROMPTS=32 SWEEP_S=80 timeout 100 bash scripts/gpu_qwen35.sh serve > $R/q35_serve.txt 2>&1; grep -E "rate|Request throughput|Output token|Mean TTFT|Mean TPOT|P99 T|completed|Error" $R/q35_serve.txt | head -40 >> $S
    mkdir -p $R/off; OPENINFER_GEMV_PDL=1 timeout 100 env OUT=$R/off LENGTHS=1024,4096,16384 REPEATS=3 QUICK=1 SERVE_ARGS="" bash scripts/gpu_offload.sh > $R/off.log 2>&1; grep -E "^ +[0-9]+ (cold|warm|host)" $R/off/prefix.log >> $S; head -3 $R/off/restore_report.txt | cut -c1-200 >> $S
    OUT=$R NCU_S=75 TOP=30 timeout 160 bash scripts/gpu_ncu.sh "qwen3-4b decode 1" "qwen3.5-4b prefill 1024" > $R/ncu_all.txt 2>&1; cat $R/ncu_all.txt >> $S
    rm -f $R/ncu_*.csv; tar czf $OUT/r.tgz -C $R .; rm -rf $R; cat $S
}
final() {
    export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
    R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt
    say() { echo "$*" >> $S; }
    python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >/dev/null 2>&1
    T="python3 -m pytest -q -p no:cacheprovider -rfE"
    timeout 75 $T tests/kernels/test_cuda_ops.py -k "decode or combine or paged or norm or silu" > $R/t_core.log 2>&1 &
    timeout 75 $T plugins/qwen35/tests/test_qwen35_cuda_ops.py plugins/qwen35/tests/test_qwen35_cuda_engine.py plugins/qwen35/tests/test_qwen35_cuda.py > $R/t_q35.log 2>&1 &
    wait
    say "core: $(tail -1 $R/t_core.log)"; say "q35: $(tail -1 $R/t_q35.log)"; grep -h "^FAILED\|^ERROR" $R/t_*.log | cut -c1-160 >> $S
    L="python3 -m openinfer bench latency --load-format dummy --device cuda"
    timeout 35 $L --model qwen3-4b --max-model-len 20480 --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192 --output-json $R/lat_qwen3.json > $R/lat_qwen3.log 2>&1; say "qwen3-4b"; grep -A4 "^batch" $R/lat_qwen3.log >> $S
    timeout 30 $L --model qwen3.5-4b --max-model-len 4096 --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 2 --output-json $R/lat_qwen35.json > $R/lat_qwen35.log 2>&1; say "qwen3.5-4b"; grep -A2 "^batch" $R/lat_qwen35.log >> $S
    timeout 20 python3 scripts/gpu_kernel_times.py qwen3.5-4b prefill 1024 > $R/q35_steps.log 2>&1; grep -E "steps|profiled" $R/q35_steps.log >> $S
    cp $R/t_*.log $R/*.json $OUT/ 2>/dev/null; cat $S
}
"${1:-final}"
