# Sourced by the GPU scripts, from the repository root with OUT and PY set: the wheels of scripts/gpu_wheels.sh from
# .whl/ where there are any (an offline machine; into /tmp/site, which goes on PYTHONPATH), then this tree and every
# plugin, editable. Logs to $OUT/install.log; a failed install ends the script.
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/install.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
editable=(-e .)
for p in plugins/*/; do editable+=(-e "$p"); done
$PY -m pip install -q --no-deps --no-build-isolation "${editable[@]}" >>"$OUT/install.log" 2>&1 \
    || { echo "editable install failed (see $OUT/install.log)"; exit 1; }
