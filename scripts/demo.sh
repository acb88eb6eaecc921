#!/usr/bin/env bash
# The main job: compile a LLaMA-style block with torchfuse, check it against eager, time both.
# bash scripts/demo.sh [--device auto|cpu|cuda] [--dtype float32|bfloat16|float16] [--steps N]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/setup_env.sh
source "$root/scripts/setup_env.sh"
unset TRITON_INTERPRET
exec "$TORCHFUSE_PYTHON" -m torchfuse demo "$@"
