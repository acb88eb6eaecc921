#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args...]  (e.g. -m gpu, -k lowering, -x, or
# tests/test_views.py: named files or folders are run instead of the whole suite)
#
# Without arguments (what CI runs), the C++ tests then run again for other x86-64 levels than this
# CPU's: our kernels are compiled for the machine they run on (-march=$TORCHFUSE_CPP_ARCH, default
# native), eager ATen picks its code path at run time, and users' CPUs are not ours.
#   - x86-64-v3 (AVX2 + FMA, no AVX-512): tests/test_cpp.py, test_fuzz.py, test_mutation.py,
#     test_embedding_backward.py
#   - x86-64 (SSE2, no FMA): tests/test_elementwise.py
# Each pass has its own kernel cache and sees no GPU. TORCHFUSE_ISA_PASSES=1 runs them after a run
# with arguments too, =0 skips them; they are skipped on CPUs that are not x86-64.
# The exit status is the first failing pass's, and a recap of every pass is printed at the end.
#
# Without arguments every pass runs on one pytest-xdist worker per usable CPU (at most 8: each
# worker holds its own torch, ~1-2 GB); TORCHFUSE_TEST_WORKERS=N sets the count for any run, and
# 0 or 1 runs in this process. With arguments the run stays in one process unless that is set.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/setup_env.sh
source "$root/scripts/setup_env.sh"
# torchfuse decides itself when to use Triton's interpreter (CPU tensors); a stray global setting
# would push real GPU runs through the interpreter too.
unset TRITON_INTERPRET

isa_passes="${TORCHFUSE_ISA_PASSES:-}"
if [[ -z "$isa_passes" ]]; then
    isa_passes=$([[ $# -eq 0 ]] && echo 1 || echo 0)
fi
case "$(uname -m)" in x86_64 | amd64) ;; *) isa_passes=0 ;; esac

workers="${TORCHFUSE_TEST_WORKERS:-}"
if [[ -z "$workers" ]]; then
    workers=$([[ $# -eq 0 ]] && "$TORCHFUSE_PYTHON" -c 'import os; print(min(8, len(os.sched_getaffinity(0))))' || echo 0)
fi
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
    echo "test.sh: TORCHFUSE_TEST_WORKERS must be a whole number of workers (0: one process), not '$workers'" >&2
    exit 2
fi
parallel=()
if [[ "$workers" -gt 1 ]]; then
    if "$TORCHFUSE_PYTHON" -c 'import xdist' 2>/dev/null; then
        parallel=(-n "$workers")
    else
        echo "test.sh: pytest-xdist is not installed; running in one process" >&2
    fi
fi

status=0
recap=()
run_pass() {  # run_pass NAME [ENV=VALUE...] -- PYTEST_ARGS...
    local name="$1" code=0 started=$SECONDS
    shift
    local env_args=()
    while [[ "$1" != "--" ]]; do env_args+=("$1"); shift; done
    shift
    env ${env_args[@]+"${env_args[@]}"} "$TORCHFUSE_PYTHON" -m pytest ${parallel[@]+"${parallel[@]}"} "$@" || code=$?
    recap+=("$name: exit $code, $((SECONDS - started)) s")
    if [[ $code -ne 0 && $status -eq 0 ]]; then status=$code; fi
    if [[ $code -eq 2 ]]; then isa_passes=0; fi  # interrupted (Ctrl-C): no further passes
}

# Arguments that name test files or folders (tests/test_x.py, tests/test_x.py::test_y) replace
# the whole suite; options alone (-k, -m, -x) select within it.
targets=(tests)
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then targets=(); break; fi
done
run_pass "main" -- ${targets[@]+"${targets[@]}"} "$@"

if [[ "$isa_passes" == "1" ]]; then
    scratch="$(mktemp -d "${TMPDIR:-/tmp}/torchfuse-isa.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    # "not triton": the Triton parametrizations of these modules do not depend on the ISA.
    for pass in "x86-64-v3|tests/test_cpp.py tests/test_fuzz.py tests/test_mutation.py tests/test_embedding_backward.py" \
                "x86-64|tests/test_elementwise.py"; do
        arch="${pass%%|*}"
        read -r -a files <<< "${pass#*|}"
        echo
        echo "=== C++ tests again for TORCHFUSE_CPP_ARCH=$arch: ${files[*]}"
        run_pass "TORCHFUSE_CPP_ARCH=$arch" TORCHFUSE_CPP_ARCH="$arch" TORCHFUSE_CACHE_DIR="$scratch/$arch" \
            CUDA_VISIBLE_DEVICES="" -- "${files[@]}" -k "not triton"
    done
fi

echo
for line in "${recap[@]}"; do echo "test.sh: $line"; done
exit "$status"
