# Shared by the GPU call scripts (source it from the repo root): output folders, the server-stack wheels from .whl/,
# the editable install, and the helpers every call uses. $OUT is the device tool's output folder; logs go to $OUT/logs, so
# that a call stopped at its time limit still returns them.
R=${OUT:-/tmp/openinfer-gpu}; L=$R/logs; mkdir -p "$R" $L; S=$R/summary.txt
export PYTHONUNBUFFERED=1 OPENINFER_CACHE_DIR=/tmp/oc
say() { echo "$*" | tee -a $S; }
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(git rev-parse --short HEAD 2>/dev/null)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/install.log 2>&1 && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 -e plugins/qwen35 >> $L/install.log 2>&1 || say "install failed"
OI="python3 -m openinfer"
LAT="$OI bench latency --load-format dummy --device cuda --max-model-len 20480"
T="python3 -m pytest -q -p no:cacheprovider -rfEs"
lat() { local name=$1 t=$2; shift 2; timeout $t $LAT "$@" --output-json $L/$name.json > $L/$name.log 2>&1; say "$name:"; grep -A4 "^batch" $L/$name.log | tail -n +3 | tee -a $S || tail -2 $L/$name.log | tee -a $S; }
tests() {  # seconds, then the core test files
    local t=$1; shift
    timeout $t $T "$@" > $L/t_core.log 2>&1 &
    timeout $t $T plugins/qwen3/tests/test_cuda_engine.py > $L/t_q3.log 2>&1 &
    timeout $t $T plugins/qwen35/tests -k "cuda or gpu or checkpoint" > $L/t_q35.log 2>&1 &
    wait
    for f in core q3 q35; do say "tests $f: $(tail -1 $L/t_$f.log)"; done
    grep -h "^FAILED\|^ERROR\|^SKIPPED" $L/t_*.log | cut -c1-220 | head -16 | tee -a $S
}
prof() { local name=$1; shift; timeout 60 python3 scripts/gpu_profile.py "$@" > $L/prof_$name.log 2>&1; say "profile $name:"; tail -4 $L/prof_$name.log | tee -a $S; }
startup() {  # name, then env assignments for the server
    local name=$1; shift
    env "$@" timeout 60 $OI bench startup --base-url http://127.0.0.1:8021 --vocab-size 151000 --burst 0 \
        --server-log $L/${name}_server.log --output-json $L/$name.json -- $OI serve --model qwen3-4b \
        --load-format dummy --device cuda --port 8021 --max-model-len 20480 > $L/$name.log 2>&1
    say "$name: $(grep -h 'ready\|frameworks' $L/$name.log | tr '\n' ' ')"
}
ncu() { OUT=$L NCU_S=65 TOP=18 timeout 70 bash scripts/gpu_ncu.sh "$@" > /dev/null 2>&1; cat $L/ncu_*.txt >> $S; rm -f $L/ncu_*.csv; }
# a carried tree's code first on the path (.whl/NAME: git archive REV core plugins tests scripts pyproject.toml)
ROOT=$PWD
tree() { local d=$ROOT/.whl/$1; shift; PYTHONPATH=$d/core:$d/plugins/qwen3:$d/plugins/qwen35:/tmp/site "$@"; }
precompile() { python3 -c "import cupy; from openinfer.kernels.cuda import compile as kc; kc.compile_all('sm_90a')" > $L/precompile.log 2>&1; }
Q3="--model qwen3-4b --batch-sizes 1,32,128 --input-lens 1024 --output-lens 64 --num-iters 2 --max-num-batched-tokens 8192"
Q3B1="--model qwen3-4b --batch-sizes 1 --input-lens 1024 --output-lens 64 --num-iters 3"
Q35="--model qwen3.5-4b --batch-sizes 1 --input-lens 1024 --output-lens 128 --num-iters 3"
