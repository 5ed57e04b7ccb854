#!/usr/bin/env bash
# On a GPU machine, from the repository root: every GPU test (marked `cuda`) of the core and of each plugin, one
# pytest process per folder side by side (each plugin has its own conftest). Exit status 1 if any failed.
#   bash scripts/gpu_test.sh [pytest options, e.g. -k attention]
# An offline machine first installs the wheels of scripts/gpu_wheels.sh from .whl/ (into /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/openinfer-gpu-tests}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/install.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
plugins=(plugins/*/)
editable=(-e .)
for p in "${plugins[@]}"; do editable+=(-e "$p"); done
$PY -m pip install -q --no-deps --no-build-isolation "${editable[@]}" >>"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see $OUT/install.log)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
pids=()
for dir in tests "${plugins[@]%/}"; do
    name=$(basename "$dir")
    [ -d "$dir/tests" ] && dir=$dir/tests
    # the agent-stack tests import SDKs the GPU image lacks (and hold no GPU test)
    $PY -m pytest -q -p no:cacheprovider -rfE -m cuda --ignore=tests/server/test_agent_stacks.py "$dir" "$@" >"$OUT/$name.log" 2>&1 &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
for log in "$OUT"/*.log; do
    [ "$log" = "$OUT/install.log" ] && continue
    echo "$(basename "$log" .log): $(tail -1 "$log")"
    grep -h "^FAILED\|^ERROR" "$log" | cut -c1-200
done
exit $rc
