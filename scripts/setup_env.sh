#!/usr/bin/env bash
# Set up the Python environment for torchfuse; idempotent and quick when already done.
#
# Source it (scripts/test.sh and scripts/demo.sh do) to get TORCHFUSE_PYTHON, the interpreter to use,
# or run it directly just to set up. Two modes:
#   - default: a venv in <repo>/.venv with torch==2.13.0 and `pip install -e '.[dev]'`.
#   - TORCHFUSE_NO_VENV=1 with an importable system torch (the GPU machine: no network, torch
#     preinstalled): install nothing; use python3 with PYTHONPATH=<repo>/src.

_TF_CHECK='
import importlib.metadata, platform
import torch
if platform.system() == "Linux":
    import triton
importlib.metadata.distribution("torchfuse")
'

_tf_setup() {
    local root venv py stamp want
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

    if [[ "${TORCHFUSE_NO_VENV:-0}" == "1" ]] && python3 -c 'import torch' 2>/dev/null; then
        export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
        TORCHFUSE_PYTHON="$(command -v python3)"
        export TORCHFUSE_PYTHON
        return 0
    fi

    venv="$root/.venv"
    py="$venv/bin/python"
    if [[ ! -x "$py" ]]; then
        echo "setup_env: creating $venv" >&2
        python3 -m venv "$venv" || return 1
    fi

    # Already set up? torch and triton import, torchfuse is installed (its metadata, not an import:
    # a work-in-progress import error must not trigger a reinstall on every run), and the stamp
    # matches the current pyproject.toml, so a changed dependency list does reinstall.
    stamp="$venv/.torchfuse-installed"
    want="$(cksum < "$root/pyproject.toml")"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$py" -c "$_TF_CHECK" 2>/dev/null; then
        TORCHFUSE_PYTHON="$py"
        export TORCHFUSE_PYTHON
        return 0
    fi

    # torch first and pinned: this machine keeps a CPU build of 2.13.0 on disk, which pip takes
    # without downloading; an unpinned `torch>=2.11` from pyproject would pull a multi-GB CUDA build.
    if ! "$py" -c 'import torch' 2>/dev/null; then
        echo "setup_env: installing torch==2.13.0" >&2
        "$py" -m pip install -qq torch==2.13.0 || return 1
    fi
    echo "setup_env: installing torchfuse (editable) with dev extras" >&2
    "$py" -m pip install -qq -e "$root[dev]" || return 1
    echo "$want" > "$stamp"
    TORCHFUSE_PYTHON="$py"
    export TORCHFUSE_PYTHON
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    # Run directly: set up, report, and exit with the set-up's status.
    set -euo pipefail
    _tf_setup
    "$TORCHFUSE_PYTHON" -c 'import sys, torch; print(f"torchfuse env: {sys.executable} (torch {torch.__version__})")'
else
    _tf_setup || return 1
fi
