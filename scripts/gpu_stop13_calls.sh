#!/usr/bin/env bash
# The H200 calls of stop 13, as run (results: docs/benchmarks/h200-2026-12-03-stop13/).
#   bash scripts/gpu_stop13_calls.sh call1|call2|call3|call4|call5   (server-stack wheels in .whl/, baseline tree in .whl/base)
# The baseline is `git archive 6743fdb core plugins` unpacked into .whl/base (the end of stop 12): `base_lat` runs
# bench latency on it in the same call, so before/after share a host. The experiments run before call1
# (scripts/gpu_experiments.sh at 6743fdb) are in the same folder as exp_summary.txt.
# call1: the GPU tests (core kernels and graphs, Qwen3 and Qwen3.5 engines) with pipelined decode on by default and
#   one-wave decode-attention splits; bench latency Qwen3-4B batch 1/32/128 for the new default, the new tree
#   serial (--no-pipelined-decode) and the baseline; attention microbenchmark at batch 32 and 128, new and base;
#   PDL for the small kernels against none, alternating; the decode graphs' GPU time.
# call2: the GPU tests again (the pipelined-decode test fixed, PDL's default set, cuBLASLt-tuned GEMMs); serve
#   start-up twice (the first start tunes the GEMMs into the empty cache, the second reads them back); bench
#   latency Qwen3-4B batch 1/32/128 with the final defaults, with OPENINFER_CUBLASLT=0 and with OPENINFER_PDL=0
#   (alternating); the decode graphs' GPU time.
# call3 (right after call2, same machine): Qwen3.5-4B; prefix hits (20 repeats); attn_bench batch 1 then 32 in one
#   process; `serve` under the benchmark client (64 random 1024/128 prompts at 16 req/s, then a multi-turn run whose later turns
#   hit the prefix cache), pipelined decode on (the default) and off: every request must succeed.
# call4: batch 32 / 128 decode, three rounds of the defaults, OPENINFER_PDL=0 and OPENINFER_CUBLASLT=0 in turn (call 2
#   had PDL's small-kernel set 0.1-0.2 ms slower at batch 32 in one sample); attn_bench batch 1 then 32 in one
#   process without PDL, and each kernel alone with it (call 3's run faulted at batch 1).
# call5 (at the commit that captures decode graphs of more than 8 rows without PDL): the GPU tests of the engines and
#   graphs; bench latency Qwen3-4B batch 1/32/128, twice with the defaults and once with OPENINFER_PDL=0.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
BASE=$PWD/.whl/base
base() { PYTHONPATH=$BASE/core:$BASE/plugins/qwen3:$BASE/plugins/qwen35:/tmp/site "$@"; }
attn() { local name=$1 b=$2; timeout 30 python3 scripts/attn_bench.py --batches $b --contexts 1024 > $L/$name.log 2>&1; say "$name:"; tail -1 $L/$name.log | tee -a $S; }
serve_bench() {  # name, then serve flags: a server on dummy weights, two benchmark runs against it
    local name=$1; shift
    $OI serve --model qwen3-4b --load-format dummy --device cuda --port 8022 --max-model-len 4096 "$@" > $L/${name}_server.log 2>&1 &
    local pid=$!
    local B="$OI bench serve --base-url http://127.0.0.1:8022 --model qwen3-4b --vocab-size 151000 --ready-check-timeout-sec 60 --disable-tqdm"
    timeout 90 $B --num-prompts 64 --request-rate 16 --random-input-len 1024 --random-output-len 128 > $L/${name}_random.log 2>&1
    timeout 90 $B --dataset multi-turn --multi-turn-conversations 16 --multi-turn-turns 3 --request-rate 8 > $L/${name}_multiturn.log 2>&1
    kill $pid; wait $pid 2>/dev/null
    say "$name:"; grep -h -i "successful\|failed\|output token throughput\|mean ttft\|mean tpot" $L/${name}_random.log $L/${name}_multiturn.log | tee -a $S
}
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
call2) precompile; tests 200 $CORE tests/kernels/test_cuda_lt.py
       startup startup_tune; startup startup_warm
       lat q3 60 $Q3; OPENINFER_CUBLASLT=0 lat q3_gemmex 60 $Q3; OPENINFER_PDL=0 lat q3_nopdl 60 $Q3; lat q3_again 60 $Q3
       prof q3 qwen3-4b ;;
call3) precompile; lat q35 45 $Q35
       timeout 120 python3 scripts/gpu_prefix_hit.py --lengths 1024,16384 --repeats 20 --gc-freeze > $L/prefix_hit.log 2>&1
       tail -10 $L/prefix_hit.log | tee -a $S
       timeout 30 python3 scripts/attn_bench.py --batches 1,32 --contexts 1024 > $L/attn_b1_b32.log 2>&1
       say "attn b1 then b32:"; tail -3 $L/attn_b1_b32.log | tee -a $S
       serve_bench serve_pipelined; serve_bench serve_serial --no-pipelined-decode ;;
call4) precompile
       Q3M="--model qwen3-4b --batch-sizes 32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
       for i in 1 2 3; do lat q3m_default_$i 60 $Q3M; OPENINFER_PDL=0 lat q3m_nopdl_$i 60 $Q3M; OPENINFER_CUBLASLT=0 lat q3m_gemmex_$i 60 $Q3M; done
       for run in "OPENINFER_PDL=0 attn_nopdl 1,32 old,new" "OPENINFER_PDL=$SMALL attn_old 1,32 old" "OPENINFER_PDL=$SMALL attn_new 1,32 new"; do
           set -- $run
           env $1 timeout 30 python3 scripts/attn_bench.py --batches $3 --contexts 1024 --variants $4 > $L/$2.log 2>&1
           say "$2:"; grep -v "^  File\|^    " $L/$2.log | tail -4 | tee -a $S
       done ;;
call5) precompile; tests 170 tests/test_cuda_graphs_capture.py tests/kernels/test_cuda_ops.py -k "pdl or graph"
       lat q3 60 $Q3; OPENINFER_PDL=0 lat q3_nopdl 60 $Q3; lat q3_again 60 $Q3 ;;
*) echo "usage: $0 call1|call2|call3|call4|call5" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
