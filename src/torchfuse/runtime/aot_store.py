"""The warm cache's entries on disk (``frontend/aot_cache.py`` makes and reads them).

An entry is ``$TORCHFUSE_CACHE_DIR/aot/<2 hex>/<key>.bin``: the sha256 of the payload, then the
payload. ``load`` returns the payload of an intact entry; a short or damaged one (the digest does
not match) is deleted and counted, and reads as missing, so the graph is traced again and its
entry written anew. ``save`` writes a temporary file in the same directory and renames it into
place, so a reader sees a whole entry or none, and two processes writing one key at once both
succeed (the last rename wins; both wrote the same entry).

``TORCHFUSE_GRAPH_CACHE=0`` turns this cache off with the graph cache (the test suite does), and
``TORCHFUSE_AOT_CACHE=0`` turns off this one alone.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from torchfuse.runtime import cpp_build, graph_cache
from torchfuse.runtime.cache_paths import cache_dir

DIGEST_BYTES = 32


@dataclass
class StoreStats:
    damaged: int = 0  # entries deleted because their digest did not match
    written: int = 0


stats = StoreStats()


def enabled() -> bool:
    return graph_cache.enabled() and os.environ.get("TORCHFUSE_AOT_CACHE", "1") != "0"


def key_text(options: Any) -> str:
    """torchfuse's part of an entry's key: its source, the options (what is dumped or checked
    aside), the ``TORCHFUSE_*`` variables that change code, and the CPU."""
    chosen = {f.name: getattr(options, f.name) for f in fields(options) if f.name not in ("dump", "check")}
    variables = sorted((k, v) for k, v in os.environ.items()
                       if k.startswith("TORCHFUSE_") and k not in graph_cache.IGNORED_VARIABLES)
    return "\n".join((graph_cache.torchfuse_source_digest(), repr(chosen), repr(variables), cpp_build._cpu_identity()))


def path(key: str) -> Path:
    return cache_dir() / "aot" / key[-2:] / f"{key}.bin"


def load(key: str) -> bytes | None:
    """The payload stored under ``key``, or None (missing, or damaged and now deleted)."""
    where = path(key)
    try:
        data = where.read_bytes()
    except OSError:
        return None
    payload = data[DIGEST_BYTES:]
    if len(data) < DIGEST_BYTES or hashlib.sha256(payload).digest() != data[:DIGEST_BYTES]:
        where.unlink(missing_ok=True)
        stats.damaged += 1
        return None
    return payload


def save(key: str, payload: bytes) -> None:
    where = path(key)
    where.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(hashlib.sha256(payload).digest())
            handle.write(payload)
        os.replace(tmp, where)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    stats.written += 1
