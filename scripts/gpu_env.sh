# Sourced by the GPU machine's scripts (gpu_check.sh, gpu_conformance.sh): torch and Triton are
# preinstalled there and nothing can be downloaded. Sets root (the checkout, made the current
# directory) and out ($OUT, where results come back), installs the wheels carried in .whl/
# (expecttest, for the OpInfo database) and runs torchfuse from src/ without installing it.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing .whl/ failed" >&2; exit 1; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHFUSE_CACHE_DIR="${TORCHFUSE_CACHE_DIR:-/tmp/torchfuse-cache}"
out="${OUT:-$root/out}"
mkdir -p "$out"
