#!/usr/bin/env bash
# Stop 20's device runs: stop 19's two calls (written in stop 19, never run there) re-cut for a session whose device time
# was mostly spent on failed starts. Trees are carried in .whl/NAME (git archive REV core plugins tests scripts
# pyproject.toml | tar -x -C .whl/NAME): cur = the commit under test, base = 5aaebe6 (stop 17), fold = next/gdn-norm-fold.
#   bash scripts/gpu_stop20_calls.sh callN   (server-stack wheels in .whl/, scripts/gpu_wheels.sh)
# callA (~9 min), what decides the defaults: the skinny GEMM's smoke run and GPU tests, then, only if both pass,
#   the engine A/B with OPENINFER_SKINNY_GEMM=tune against 0 on Qwen3-4B batch 32 / 128 and batch 1 and Qwen3.5-4B
#   batch 1 (logs saved as they come), then the Qwen3 engine's GPU tests with the kernel on every 9..128-row GEMM.
# callB (~9 min), the rest: skinny_bench (every weight, width, split and variant), decode-attention clusters at
#   batch 1 (attn_bench, engine on / off), the GDN norm fold (Qwen3.5 batch 1, its tests), the split-decode tests,
#   structured outputs on the CUDA backend, cur against base, and the first-ever start with an empty kernel cache.
# callC (~5 min), main itself (the working tree) after the skinny GEMM was taken out: the GPU tests (kernels,
#   but decode attention's; sampling, cuBLASLt, launch arguments, structured outputs, the Qwen3 engine), then `openinfer serve`'s
#   start-up and idle RSS with dummy weights, first-ever and warm.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
Q3BIG="--model qwen3-4b --batch-sizes 32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
case ${1:-} in
callA) tree cur precompile
       ( cd .whl/cur/scripts && tree cur timeout 40 python3 skinny_bench.py --smoke > $L/smoke.log 2>&1 ); SMOKE=$?
       say "skinny smoke (rc $SMOKE):"; tail -7 $L/smoke.log | tee -a $S
       [ $SMOKE = 0 ] && ( export PYTHONPATH=$PWD/.whl/cur/core:/tmp/site; cd .whl/cur
         timeout 150 $T tests/kernels/test_cuda_skinny_gemm.py > $L/t_skinny.log 2>&1 )
       say "tests skinny: $(tail -1 $L/t_skinny.log 2>/dev/null)"
       grep -h "^FAILED\|^ERROR" $L/t_skinny.log 2>/dev/null | cut -c1-200 | head -8 | tee -a $S
       if [ $SMOKE = 0 ] && grep -q " passed" $L/t_skinny.log && ! grep -q "failed\|error" $L/t_skinny.log; then
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk1_q3 60 $Q3BIG; OPENINFER_SKINNY_GEMM=0 tree cur lat sk0_q3 60 $Q3BIG
           grep -h "skinny GEMM for" $L/sk1_q3.log | cut -c1-400 | tee -a $S; tar -C $L -czf $R/logs_early.tgz .
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk1_q3b1 30 $Q3B1; OPENINFER_SKINNY_GEMM=0 tree cur lat sk0_q3b1 30 $Q3B1
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk1_q35 35 $Q35; OPENINFER_SKINNY_GEMM=0 tree cur lat sk0_q35 35 $Q35
           grep -h "skinny GEMM for" $L/sk1_q3b1.log $L/sk1_q35.log | cut -c1-400 | tee -a $S; tar -C $L -czf $R/logs_early.tgz .
           ( export PYTHONPATH=$PWD/.whl/cur/core:$PWD/.whl/cur/plugins/qwen3:/tmp/site OPENINFER_SKINNY_GEMM=1
             cd .whl/cur; timeout 120 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3_skinny.log 2>&1 )
           say "tests qwen3 engine, skinny on: $(tail -1 $L/t_q3_skinny.log 2>/dev/null)"
           grep -h "^FAILED\|^ERROR" $L/t_q3_skinny.log 2>/dev/null | cut -c1-200 | head -8 | tee -a $S
       fi ;;
callB) tree cur precompile & tree base precompile & tree fold precompile & wait
       ( cd .whl/cur/scripts && tree cur timeout 150 python3 skinny_bench.py --json $R/skinny_bench.json > $L/skinny.log 2>&1 )
       say "skinny_bench:"; grep -v "^$" $L/skinny.log 2>/dev/null | tail -40 | tee -a $S
       tree cur timeout 40 python3 .whl/cur/scripts/attn_bench.py --batches 1 --contexts 1024,16384 \
           --variants nocl,cl --split-keys 64,128 > $L/attn.log 2>&1; say "attn_bench:"; tail -6 $L/attn.log | tee -a $S
       OPENINFER_DECODE_CLUSTER=8 tree cur lat cl_q3 30 $Q3B1; tree cur lat cur_q3 30 $Q3B1; tree base lat base_q3 30 $Q3B1
       tree cur lat cur_q35 35 $Q35; OPENINFER_GDN_NORM_FOLD=1 tree fold lat fold_q35 35 $Q35
       ( export PYTHONPATH=$PWD/.whl/fold/core:$PWD/.whl/fold/plugins/qwen35:/tmp/site; cd .whl/fold
         timeout 90 $T plugins/qwen35/tests -k "gdn_decode_norm or norm_fold" > $L/t_fold.log 2>&1 )
       say "tests fold: $(tail -1 $L/t_fold.log)"
       ( export PYTHONPATH=$PWD/.whl/cur/core:/tmp/site; cd .whl/cur
         timeout 60 $T tests/kernels/test_cuda_ops.py -k "split_decode or decode_attention_graph" > $L/t_core.log 2>&1 )
       say "tests core: $(tail -1 $L/t_core.log)"
       ( export PYTHONPATH=$PWD/.whl/cur/core:$PWD/.whl/cur/plugins/qwen3:/tmp/site; cd .whl/cur
         timeout 90 $T tests/test_cuda_structured_engine.py > $L/t_structured.log 2>&1 )
       say "tests structured outputs: $(tail -1 $L/t_structured.log)"
       startup first_start OPENINFER_CACHE_DIR=/tmp/oc_empty   # empty kernel cache: stop 15 took 24.9 s, compiling serially
       grep -h "compiled .* in" $L/first_start_server.log | sort -t' ' -k1,1 | tail -20 > $L/first_start_compiles.txt ;;
callC) K=tests/kernels
       timeout 120 $T $K/test_cuda_ops.py $K/test_cuda_elementwise.py $K/test_cuda_gemv.py $K/test_cuda_lt.py \
           $K/test_cuda_launch_args.py $K/test_cuda_sampling.py $K/test_cuda_attention.py -k "not decode_attention" \
           tests/test_cuda_structured_engine.py tests/test_cuda_sampling_engine.py > $L/t_core.log 2>&1 &
       timeout 120 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
       wait; for f in core q3; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
       grep -h "^FAILED\|^ERROR" $L/t_*.log | cut -c1-220 | head -12 | tee -a $S
       startup first_c OPENINFER_CACHE_DIR=/tmp/oc_c; startup warm_c OPENINFER_CACHE_DIR=/tmp/oc_c ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
