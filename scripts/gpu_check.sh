#!/usr/bin/env bash
# One call's worth of GPU work for the device machine (torch and Triton preinstalled, no
# network): the GPU tests, then the benchmark suites, everything written under $OUT.
#   bash scripts/gpu_check.sh [micro|models|all]     (default: all)
# Each step has its own time limit so that a slow one cannot cost the others their results.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PYTHONPATH="$root/src:$root${PYTHONPATH:+:$PYTHONPATH}"
export TORCHFUSE_CACHE_DIR="${TORCHFUSE_CACHE_DIR:-/tmp/torchfuse-cache}"
out="${OUT:-$root/out}"
mkdir -p "$out"
suite="${1:-all}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv > "$out/gpu.txt" 2>&1
timeout 300 python3 -m pytest tests -m gpu -q -p no:cacheprovider > "$out/tests_gpu.log" 2>&1
echo "gpu tests exit $?" >> "$out/tests_gpu.log"
if [[ "$suite" == micro || "$suite" == all ]]; then
    timeout 300 python3 -m torchfuse bench --suite micro --device cuda --out "$out/micro" > "$out/micro.log" 2>&1
    echo "micro exit $?" >> "$out/micro.log"
fi
if [[ "$suite" == models || "$suite" == all ]]; then
    timeout 900 python3 -m torchfuse bench --suite models --device cuda --out "$out/models" > "$out/models.log" 2>&1
    echo "models exit $?" >> "$out/models.log"
fi
tail -n 3 "$out"/*.log
