#!/usr/bin/env bash
# On a GPU machine: run the GLM-5.x plugin's GPU tests (its hand-written and TileLang kernels, the tiny model), then
# time its DSA kernels, hand-written and TileLang, at GLM-5.2 decode shapes (8k/32k/128k contexts) against the
# bytes-moved floor (scripts/glm52_dsa_times.py). Logs go to $OUT.
#   bash scripts/gpu_glm52.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=${OPENINFER_CACHE_DIR:-/tmp/openinfer-cache}
export PYTHONPATH=core:plugins/glm52${PYTHONPATH:+:$PYTHONPATH}

$PY -m pytest -q -p no:cacheprovider -rfE -m cuda plugins/glm52/tests 2>&1 | tee "$OUT/glm52_tests.log"
rc=${PIPESTATUS[0]}

$PY scripts/glm52_dsa_times.py 2>&1 | tee "$OUT/glm52_timings.log"
exit "$rc"
