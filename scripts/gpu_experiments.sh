#!/usr/bin/env bash
# The decode experiments that stop 12 left switchable, in one H200 call (~2.5 min at 6743fdb, where they ran first;
# results in docs/benchmarks/h200-2026-12-03-stop13/exp_*; the L2-prefetch rows were removed with the experiment):
#   bash scripts/gpu_experiments.sh          (server-stack wheels in .whl/, as for every call script)
# 1. their GPU tests: the cuBLASLt bindings, pipelined decode;
# 2. Qwen3-4B batch-1 decode with programmatic dependent launch off, for every kernel, and for kernel-name prefixes
#    (OPENINFER_PDL: which launches gain, which lose);
# 3. scripts/gemm_algos_bench.py: cuBLASLt's heuristic algorithms against GemmEx at M = 16..256;
# 4. pipelined decode (step N+1 queued before step N's host work; the default since stop 13) against serial
#    (--no-pipelined-decode), batch 1/32/128.
# Each bench latency row is `step ms` of 3 iterations; runs alternate so a drifting host shows up as spread.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
precompile
timeout 200 $T plugins/qwen3/tests/test_cuda_engine.py \
    tests/kernels/test_gemm_algos_bench.py tests/test_cuda_graphs_capture.py -k "gemm_algos or pipelined" \
    > $L/t_exp.log 2>&1
say "tests: $(tail -1 $L/t_exp.log)"; grep -h "^FAILED\|^ERROR" $L/t_exp.log | cut -c1-220 | head -8 | tee -a $S
for pdl in 0 1 gemv paged_decode,rope,add_rms_norm,rms_norm 0; do
    OPENINFER_PDL=$pdl lat "q3_pdl_${pdl//,/+}" 40 $Q3B1
done
timeout 240 python3 scripts/gemm_algos_bench.py --output-json $L/gemm_algos.json > $L/gemm_algos.log 2>&1
tail -40 $L/gemm_algos.log | tee -a $S
lat q3_serial 70 $Q3 --no-pipelined-decode; lat q3_pipelined 70 $Q3; lat q3_serial_again 70 $Q3 --no-pipelined-decode
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
