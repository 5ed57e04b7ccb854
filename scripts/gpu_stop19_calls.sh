#!/usr/bin/env bash
# Stop 19's H200 runs (no device was lent in stop 19: written for the next session). Trees are carried in .whl/NAME
# (git archive REV core plugins tests scripts pyproject.toml | tar -x -C .whl/NAME): cur = the commit under test,
# base = 5aaebe6 (stop 17's last commit), fold = branch next/gdn-norm-fold.
#   bash scripts/gpu_stop19_calls.sh callN   (server-stack wheels in .whl/, scripts/gpu_wheels.sh)
# Two calls of 5-10 minutes each; each step's figure is useful alone if the device goes away.
# call1, the skinny GEMM (order of need; run it with the device's whole 600 s):
#   1. a 40-second smoke run of every skinny GEMM kernel (the rest only if it passes), then its GPU tests (decode
#      GEMMs of 1..128 rows; OPENINFER_SKINNY_GEMM, off by default);
#   2. Qwen3-4B decode at batch 32 / 128, skinny tuned (OPENINFER_SKINNY_GEMM=tune) and off (cur), alternating, and
#      tuned with PDL for it in the larger graphs (OPENINFER_PDL_WIDE=skinny_gemm);
#   3. the Qwen3 engine's GPU tests with it on (eager = graph, batched, prefix hits, vs transformers);
#   4. scripts/skinny_bench.py: each decode weight at M = 1 / 8 / 16 / 32 / 64 / 128 under every split and variant
#      against the GEMV (up to 8 rows) or cuBLASLt, gate_up with its SiLU epilogue, and the 145-GEMM chain.
# call2, stop 18's call 3: attn_bench at batch 1 with the cluster occupancy cap, batch-1 decode of Qwen3-4B (clusters
#      on / off, base) and Qwen3.5-4B (cur, base, the GDN norm fold), then both with OPENINFER_SKINNY_GEMM=tune (the
#      width-8 skinny GEMM where it beats the GEMV; SKINNY_OK=0 skips this if call 1 failed it), the split-decode and
#      the fold's GPU tests; the first-ever start (empty kernel cache) with the kernels compiled on background threads.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
ROOT=$PWD
tree() { local d=$ROOT/.whl/$1; shift; PYTHONPATH=$d/core:$d/plugins/qwen3:$d/plugins/qwen35:/tmp/site "$@"; }
Q3BIG="--model qwen3-4b --batch-sizes 32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
case ${1:-} in
call1) tree cur precompile
       ( cd .whl/cur/scripts && tree cur timeout 40 python3 skinny_bench.py --smoke > $L/smoke.log 2>&1 ); SMOKE=$?
       say "skinny smoke (rc $SMOKE):"; tail -7 $L/smoke.log | tee -a $S
       [ $SMOKE = 0 ] && ( export PYTHONPATH=$PWD/.whl/cur/core:/tmp/site; cd .whl/cur
         timeout 150 $T tests/kernels/test_cuda_skinny_gemm.py > $L/t_skinny.log 2>&1 )
       say "tests skinny: $(tail -1 $L/t_skinny.log 2>/dev/null)"
       grep -h "^FAILED\|^ERROR" $L/t_skinny.log 2>/dev/null | cut -c1-200 | head -8 | tee -a $S
       if [ $SMOKE = 0 ] && grep -q " passed" $L/t_skinny.log && ! grep -q "failed\|error" $L/t_skinny.log; then
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk1_q3 60 $Q3BIG; OPENINFER_SKINNY_GEMM=0 tree cur lat sk0_q3 60 $Q3BIG
           OPENINFER_SKINNY_GEMM=tune OPENINFER_PDL_WIDE=skinny_gemm tree cur lat skpdl_q3 60 $Q3BIG
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk1b_q3 60 $Q3BIG; grep -h "skinny GEMM for" $L/sk1_q3.log | tee -a $S
       fi
       tar -C $L -czf $R/logs_early.tgz .   # in case the rest runs past the call's limit
       [ $SMOKE = 0 ] && ( export PYTHONPATH=$PWD/.whl/cur/core:$PWD/.whl/cur/plugins/qwen3:/tmp/site OPENINFER_SKINNY_GEMM=1
         cd .whl/cur; timeout 120 $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3_skinny.log 2>&1 )
       say "tests qwen3 engine, skinny on: $(tail -1 $L/t_q3_skinny.log 2>/dev/null)"
       [ $SMOKE = 0 ] && ( cd .whl/cur/scripts && tree cur timeout 200 python3 skinny_bench.py --json $R/skinny_bench.json > $L/skinny.log 2>&1 )
       say "skinny_bench:"; grep -v "^$" $L/skinny.log 2>/dev/null | tail -80 | tee -a $S ;;
call2) tree cur precompile & tree base precompile & tree fold precompile & wait
       tree cur timeout 40 python3 .whl/cur/scripts/attn_bench.py --batches 1 --contexts 1024,16384 \
           --variants nocl,cl --split-keys 64,128 > $L/attn.log 2>&1; say "attn_bench:"; tail -6 $L/attn.log | tee -a $S
       export OPENINFER_DECODE_CLUSTER=8   # opt-in (base ignores it)
       tree cur lat cur_q3 30 $Q3B1; tree base lat base_q3 30 $Q3B1; OPENINFER_DECODE_CLUSTER=1 tree cur lat cur_nocl_q3 30 $Q3B1
       tree cur lat cur_q35 35 $Q35; tree base lat base_q35 35 $Q35; OPENINFER_GDN_NORM_FOLD=1 tree fold lat fold_q35 35 $Q35
       if [ "${SKINNY_OK:-1}" = 1 ]; then   # the width-8 skinny GEMM where start-up timing beats the GEMV
           OPENINFER_SKINNY_GEMM=tune tree cur lat sk_q3b1 30 $Q3B1; OPENINFER_SKINNY_GEMM=tune tree cur lat sk_q35 35 $Q35
           grep -h "skinny GEMM for" $L/sk_q3b1.log $L/sk_q35.log | cut -c1-400 | tee -a $S
       fi
       ( export PYTHONPATH=$PWD/.whl/cur/core:/tmp/site; cd .whl/cur
         timeout 60 $T tests/kernels/test_cuda_ops.py -k "split_decode or decode_attention_graph" > $L/t_core.log 2>&1 )
       say "tests core: $(tail -1 $L/t_core.log)"
       ( export PYTHONPATH=$PWD/.whl/fold/core:$PWD/.whl/fold/plugins/qwen35:/tmp/site; cd .whl/fold
         timeout 120 $T plugins/qwen35/tests -k "gdn_decode_norm or norm_fold" > $L/t_fold.log 2>&1 )
       say "tests fold: $(tail -1 $L/t_fold.log)"
       startup first_start OPENINFER_CACHE_DIR=/tmp/oc_empty   # empty kernel cache: stop 15 took 24.9 s, compiling serially
       grep -h "compiled .* in" $L/first_start_server.log | sort -t' ' -k1,1 | tail -20 > $L/first_start_compiles.txt ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
