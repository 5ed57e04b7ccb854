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
# call3 (written for the next session) never ran: no device was lent in stop 19; it is part of
#   scripts/gpu_stop20_calls.sh callB now.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
# tree (gpu_common.sh) takes ROOT, not $PWD: call 1 ran its tests from .whl/cur with this path taken from there, so
# they ran the working tree (then = cur)
case ${1:-} in
call1) tree cur precompile
       ( cd .whl/cur && tree cur tests 240 tests/kernels/test_cuda_ops.py -k "decode or paged_attention or gemv or silu or wide or linear" )
       tree cur timeout 120 python3 .whl/cur/scripts/attn_bench.py --variants nocl,new --split-keys 64,128 \
           > $L/attn_bench.log 2>&1; say "attn_bench (ms a call):"; tail -9 $L/attn_bench.log | tee -a $S
       tree cur timeout 200 python3 .whl/cur/scripts/gemv_bench.py --wide --output-json $R/gemv_wide.json \
           > $L/gemv_wide.log 2>&1; say "gemv wide:"; tail -60 $L/gemv_wide.log | tee -a $S ;;
*) echo "usage: $0 callN" >&2; exit 2 ;;
esac
say "done in ${SECONDS}s"
tar -C $L -czf $R/logs.tgz .
