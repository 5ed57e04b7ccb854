#!/usr/bin/env bash
# The five H200 calls of stop 11, as run (results: docs/benchmarks/h200-2026-12-03-stop11/callN_*).
#   bash scripts/gpu_stop11_calls.sh call1|call2|call3|call4|call5      (wheels for the server stack in .whl/)
# call1: PDL for every kernel (GPU tests, PDL on/off, qwen3.5, 16k, start-up); call2: the merged helpers (SiLU-fused
# GEMV, word rope, dummy-weight kernel, tokenizer cache, capture, qwen3.5 checkpoint), PDL variants, 64-token
# contexts, ncu decode profiles; call3: paged_combine/rope fixes, GEMV sweep, qwen3.5 prefill profile; call4: the
# add+RMSNorm GEMV and the wgmma prefill attention; call5: final code, first-ever and warm start-up, prefix hits.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh   # (stop 11 ran these helpers inline; startup then printed the ready line only)
Q3B1="--model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 2"
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
