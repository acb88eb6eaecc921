"""A progress line while the first run waits for kernels still compiling: on a terminal only.

Waits shorter than ``SHOW_AFTER_SECONDS`` show nothing; longer ones draw one rich status line
on stderr ("torchfuse: compiling GPU kernels 41/120 in 16 processes") until the wait ends.
Silent when stderr is not a terminal (logs, CI, the benchmark's children) or with
``TORCHFUSE_PROGRESS=0``.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

SHOW_AFTER_SECONDS = 1.0


def wanted() -> bool:
    return os.environ.get("TORCHFUSE_PROGRESS", "1") != "0" and sys.stderr.isatty()


def wait(future: Future, describe: Callable[[], str]) -> Any:
    """``future.result()``, drawing ``describe()`` (refreshed) when it takes long on a terminal."""
    try:
        return future.result(timeout=SHOW_AFTER_SECONDS if wanted() else None)
    except FutureTimeout:
        pass
    from rich.console import Console

    with Console(stderr=True).status(describe()) as status:
        while True:
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                status.update(describe())
