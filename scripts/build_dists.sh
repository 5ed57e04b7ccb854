#!/usr/bin/env bash
# A wheel and an sdist of every distribution: the core (openinfer), then each plugin (plugins/*/pyproject.toml),
# into $OUT (default dist/), each wheel built from its sdist. Further arguments go to `python -m build`:
# --no-isolation builds offline with this environment's setuptools (>= 70.1) instead of fetching one.
# $PYTHON (default python3) runs the builds; it needs the `build` package.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${OUT:-dist}")
for dir in . plugins/*/; do
  [ -f "$dir/pyproject.toml" ] || continue
  "${PYTHON:-python3}" -m build --outdir "$out" "$@" "$dir"
done
ls "$out"
