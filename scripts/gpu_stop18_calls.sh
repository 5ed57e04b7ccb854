#!/usr/bin/env bash
# Stop 18's H200 runs. Trees are carried in .whl/NAME (git archive REV core plugins tests scripts pyproject.toml |
# tar -x -C .whl/NAME): cur = the commit under test (the working tree may hold a helper's unfinished edits),
# base = 5aaebe6 (stop 17's last commit), fold = branch next/gdn-norm-fold.
#   bash scripts/gpu_stop18_calls.sh callN   (server-stack wheels in .whl/, scripts/gpu_wheels.sh)
# call1 (cur = 4417f28): GPU tests of decode attention (clusters on and off), the GEMVs (wide ones too) and both
#   engines; attn_bench.py at batch 1 / 32 / 128, 1k and 16k contexts, 64 and 128 keys a split, with and without
#   clusters; gemv_bench.py --wide (the GEMV at 8 < M <= 64 against cuBLASLt).
# call2 (two rounds of call 3's decode runs) was never run: the device stopped answering; call 3 replaces it.
# From call 3 on clusters are opt-in (OPENINFER_DECODE_CLUSTER=8, exported by the calls; the default is 1).
# call3 (for the next session; short enough for a small device budget), in order of need: attn_bench at batch 1
#   with the cluster occupancy; batch-1 decode of Qwen3-4B (cur, base, cur with 128 keys a split) and Qwen3.5-4B
#   (cur, base, fold with OPENINFER_GDN_NORM_FOLD=1: the GDN output norm folded into the decode step); the split-decode GPU tests and the
#   fold's GPU tests. Make the trees first: cur = main, base = 5aaebe6, fold = next/gdn-norm-fold.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
ROOT=$PWD   # call 1 ran its tests from .whl/cur with this path taken from there: they ran the working tree (then = cur)
tree() { local d=$ROOT/.whl/$1; shift; PYTHONPATH=$d/core:$d/plugins/qwen3:$d/plugins/qwen35:/tmp/site "$@"; }
case ${1:-} in
call1) tree cur precompile
       ( cd .whl/cur && tree cur tests 240 tests/kernels/test_cuda_ops.py -k "decode or paged_attention or gemv or silu or wide or linear" )
       tree cur timeout 120 python3 .whl/cur/scripts/attn_bench.py --variants nocl,new --split-keys 64,128 \
           > $L/attn_bench.log 2>&1; say "attn_bench (ms a call):"; tail -9 $L/attn_bench.log | tee -a $S
       tree cur timeout 200 python3 .whl/cur/scripts/gemv_bench.py --wide --output-json $R/gemv_wide.json \
           > $L/gemv_wide.log 2>&1; say "gemv wide:"; tail -60 $L/gemv_wide.log | tee -a $S ;;
call3) tree cur precompile & tree base precompile & tree fold precompile & wait
       tree cur timeout 40 python3 .whl/cur/scripts/attn_bench.py --batches 1 --contexts 1024,16384 \
           --variants nocl,cl --split-keys 64,128 > $L/attn.log 2>&1; say "attn_bench:"; tail -6 $L/attn.log | tee -a $S
       export OPENINFER_DECODE_CLUSTER=8   # opt-in (base ignores it)
       tree cur lat cur_q3 30 $Q3B1; tree base lat base_q3 30 $Q3B1; OPENINFER_DECODE_SPLIT_KEYS=128 tree cur lat cur_k128_q3 30 $Q3B1
       tree cur lat cur_q35 35 $Q35; tree base lat base_q35 35 $Q35; OPENINFER_GDN_NORM_FOLD=1 tree fold lat fold_q35 35 $Q35
       OPENINFER_DECODE_CLUSTER=1 tree cur lat cur_nocl_q3 30 $Q3B1
       ( export PYTHONPATH=$PWD/.whl/cur/core:/tmp/site; cd .whl/cur
         timeout 60 $T tests/kernels/test_cuda_ops.py -k "split_decode or decode_attention_graph" > $L/t_core.log 2>&1 )
       say "tests core: $(tail -1 $L/t_core.log)"
       ( export PYTHONPATH=$PWD/.whl/fold/core:$PWD/.whl/fold/plugins/qwen35:/tmp/site; cd .whl/fold
         timeout 120 $T plugins/qwen35/tests -k "gdn_decode_norm or norm_fold" > $L/t_fold.log 2>&1 )
       say "tests fold: $(tail -1 $L/t_fold.log)" ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
