#!/usr/bin/env bash
# On a GPU machine with Nsight Compute: per-kernel GPU time of single engine steps (scripts/gpu_kernel_times.py),
# one ncu process per scenario, each summed by scripts/ncu_table.py into $OUT/ncu_<name>.txt.
#   bash scripts/gpu_ncu.sh "qwen3-4b decode 1" "qwen3-4b decode 32" "qwen3.5-4b prefill 1024"
# Assumes openinfer is installed (scripts/gpu_bench.sh and gpu_test.sh do that). Clocks are left alone
# (--clock-control none). Each scenario first runs once without the profiler: start-up times GEMM and GEMV candidates
# for the shapes not yet in the on-disk cache, launches Nsight Compute would profile one by one; the profiled start
# finds them cached. Only the step's NVTX range is profiled (the start and warm-up steps of a large scenario take
# minutes under ncu), or every kernel where that range caught none of the step's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
mkdir -p "$OUT"
profile() {   # scenario, name, then ncu's extra arguments
    local scenario=$1 name=$2
    shift 2
    timeout ${NCU_S:-120} "$NCU" --clock-control none --graph-profiling node "$@" \
        --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$name.csv" \
        $PY scripts/gpu_kernel_times.py $scenario >"$OUT/ncu_$name.log" 2>&1
}
for scenario in "$@"; do
    name=$(echo "$scenario" | tr ' /' '__')   # a path among its arguments (--tokenizer DIR) stays in the name
    $PY scripts/gpu_kernel_times.py $scenario >"$OUT/ncu_$name.warm.log" 2>&1
    profile "$scenario" "$name" --nvtx --nvtx-include "openinfer_step/"
    kernels=$($PY scripts/ncu_table.py "$OUT/ncu_$name.csv" 2>/dev/null | head -1 | cut -d' ' -f1)
    [ "${kernels:-0}" -ge 10 ] || profile "$scenario" "$name"   # the range caught too few of the step's: every kernel
    { echo "== $scenario"; $PY scripts/ncu_table.py "$OUT/ncu_$name.csv" --top ${TOP:-22} 2>&1; } | tee "$OUT/ncu_$name.txt"
done
