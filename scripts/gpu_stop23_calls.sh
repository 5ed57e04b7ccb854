#!/usr/bin/env bash
# Stop 23's device runs (the working tree is main under test; server-stack wheels in .whl/, scripts/gpu_wheels.sh;
# pass carry [".whl"]).   bash scripts/gpu_stop23_calls.sh callN
# call1 (~3 min): does a persistent GEMV chain whose weights stream through shared memory ahead of the math
#   (gemv_stream: a producer warp a SM copying with cp.async.bulk across op boundaries) read a Qwen3-4B step's 145
#   GEMVs faster than a kernel per GEMV? scripts/gemv_chain_bench.py at four ring shapes, beside stop 14's chain
#   and the engine's GEMV; then the engine's batch 1 for this machine's baseline.
# call2 (~2 min): Nsight Compute on gemv_stream (ring 8 x 24 KB) and the first GEMV kernels of a 8-layer chain:
#   speed of light, warp stall reasons, occupancy. Call 1 had gemv_stream at 1.6-1.8 TB/s against 2.6 for the units.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_common.sh
case ${1:-} in
call1) timeout 240 python3 scripts/gemv_chain_bench.py --repeats 10 --output-json $L/gemv_chain.json \
           > $L/gemv_chain.log 2>&1
       say "gemv chain:"; tail -12 $L/gemv_chain.log | tee -a $S
       lat base_q3 50 $Q3B1 ;;
call2) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       cat > /tmp/drv.py <<'PY'
import sys; sys.path.insert(0, "scripts")
import cupy as cp
import gemv_chain_bench as b
c = b.Chain(b.chain_shapes(8), chained=False)
c.stream(8, 24); c.units(); cp.cuda.Device().synchronize()
PY
       timeout 200 $NCU --clock-control none -k regex:"gemv_stream|gemv_units" --launch-count 3 --section SpeedOfLight \
           --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
           --section SourceCounters python3 /tmp/drv.py > $L/ncu_stream.txt 2>&1
       grep -E "gemv_|Duration|DRAM Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Registers Per" \
           $L/ncu_stream.txt | head -60 | tee -a $S ;;
*) echo "usage: $0 call1|call2"; exit 2 ;;
esac
