#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args...]  (e.g. -m gpu, -k lowering, -x)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/setup_env.sh
source "$root/scripts/setup_env.sh"
# torchfuse decides itself when to use Triton's interpreter (CPU tensors); a stray global setting
# would push real GPU runs through the interpreter too.
unset TRITON_INTERPRET
exec "$TORCHFUSE_PYTHON" -m pytest tests "$@"
