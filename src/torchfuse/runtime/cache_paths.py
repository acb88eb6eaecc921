"""Where torchfuse keeps its disk caches: ``$TORCHFUSE_CACHE_DIR``, else ``~/.cache/torchfuse``.

A leaf module (standard library only): the compile workers (``compile_worker.py``) use it
without importing torch.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("TORCHFUSE_CACHE_DIR") or os.path.join(Path.home(), ".cache", "torchfuse")
    return Path(root)
