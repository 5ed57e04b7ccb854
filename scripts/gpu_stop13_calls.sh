#!/usr/bin/env bash
# The H200 calls of stop 13, as run (results: docs/benchmarks/h200-2026-12-03-stop13/).
#   bash scripts/gpu_stop13_calls.sh call1|call2   (server-stack wheels in .whl/, baseline tree in .whl/base)
# The baseline is `git archive 6743fdb core plugins` unpacked into .whl/base (the end of stop 12): `base_lat` runs
# bench latency on it in the same call, so before/after share a host. The experiments run before call1
# (scripts/gpu_experiments.sh at 6743fdb) are in the same folder as exp_summary.txt.
# call1: the GPU tests (core kernels and graphs, Qwen3 and Qwen3.5 engines) with pipelined decode on by default and
#   one-wave decode-attention splits; bench latency Qwen3-4B batch 1/32/128 for the new default, the new tree
#   serial (--no-pipelined-decode) and the baseline; attention microbenchmark at batch 32 and 128, new and base;
#   PDL for the small kernels against none, alternating; the decode graphs' GPU time.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base
base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
attn() { local name=$1 b=$2; timeout 30 python3 scripts/attn_bench.py --batches $b --contexts 1024 > $L/$name.log 2>&1; say "$name:"; tail -1 $L/$name.log | tee -a $S; }
CORE="tests/kernels/test_cuda_ops.py tests/kernels/test_cuda_sampling.py tests/test_cuda_graphs_capture.py"
SMALL=paged_decode,rope,add_rms_norm,rms_norm
case ${1:-} in
call1) python3 -c "import openinfer; print(openinfer.__file__)" | tee -a $S
       base python3 -c "import openinfer; print('base:', openinfer.__file__)" | tee -a $S
       precompile; base precompile; tests 200 $CORE
       lat q3 60 $Q3; lat q3_serial 60 $Q3 --no-pipelined-decode; base lat base_q3 60 $Q3
       for b in 32 128; do attn attn_b$b $b; base attn base_attn_b$b $b; done
       prof q3 qwen3-4b; lat q35 45 $Q35; base lat base_q35 45 $Q35
       for p in 0 $SMALL 0 $SMALL; do OPENINFER_PDL=$p lat "q3_b1_pdl_${p//,/+}" 40 $Q3B1; done ;;
*) echo "usage: $0 call1" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
