"""Compiled GPU binaries on disk: one directory per kernel specialization, never loaded unverified.

An entry is what Triton needs to rebuild a ``CompiledKernel`` without compiling: its metadata
(``<fn>.json``) and its binary (``<fn>.cubin``), plus our ``manifest.json`` holding the sha256 of
each file and the key. The key (``entry_key``) hashes everything the binary depends on: the
kernel module's source, the function, Triton's specialization (signature, constants, attributes),
the compile options, the GPU target (backend, architecture, warp size), Triton's version and
library, torch's version, the environment variables Triton's own cache key includes, and
``FORMAT``. A later process with the same key launches the stored binary and compiles nothing.

Safety, in the order things can go wrong:

- A writer builds the entry in a private temporary directory and renames it into place (one
  atomic ``rename``); readers never see a partial entry. Two processes writing the same entry
  both succeed: the second rename finds the directory there and its copy is dropped.
- A reader checks every file against the manifest before handing out paths; a truncated, garbled
  or incomplete entry (or one written under another key or format) is moved aside and deleted,
  counted in ``stats.corrupt``, and reported as a miss, so the caller compiles it again.
- The caller checks the bytes it actually loaded against ``Entry.digests`` (``verified``), so a
  file changed between this check and its read is caught too.

A leaf module (standard library only): the compile workers use it without importing torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

FORMAT = "gpu-binary-1"
MANIFEST = "manifest.json"


@dataclass
class StoreStats:
    hits: int = 0  # entries found intact
    misses: int = 0  # no entry
    corrupt: int = 0  # entries that failed verification, deleted
    stored: int = 0  # entries this process wrote
    lost_races: int = 0  # writes that found the entry already written by another process


stats = StoreStats()
_stats_lock = threading.Lock()


@dataclass(frozen=True)
class Entry:
    """An intact entry: its files by name, and the sha256 each must have when read."""

    directory: Path
    files: dict[str, Path]
    digests: dict[str, str]

    def verified(self, name: str, data: bytes) -> bool:
        """Whether ``data``, read from file ``name`` by someone else (Triton), is what was stored."""
        return hashlib.sha256(data).hexdigest() == self.digests.get(name)


def entry_key(parts: Mapping[str, str]) -> str:
    """The sha256 of every part the binary depends on (names and values), and ``FORMAT``."""
    digest = hashlib.sha256(FORMAT.encode())
    for name in sorted(parts):
        digest.update(b"\0" + name.encode() + b"\0" + str(parts[name]).encode())
    return digest.hexdigest()


def entry_dir(root: Path, key: str) -> Path:
    return root / key[:2] / key


def lookup(root: Path, key: str) -> Entry | None:
    """The intact entry ``key`` under ``root``; None when there is none (a bad one is deleted)."""
    directory = entry_dir(root, key)
    if not directory.is_dir():
        _count("misses")
        return None
    entry = _read_verified(directory, key)
    if entry is None:
        _count("corrupt")
        _discard(directory)
        return None
    _count("hits")
    return entry


def _read_verified(directory: Path, key: str) -> Entry | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("key") != key or not manifest.get("files"):
            return None
        digests: dict[str, str] = dict(manifest["files"])
        for name, digest in digests.items():
            if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest:
                return None
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # missing manifest or file, unreadable, not JSON, not the expected shape
    return Entry(directory, {name: directory / name for name in digests}, digests)


def store(root: Path, key: str, files: Mapping[str, bytes], info: Mapping[str, str] | None = None) -> Entry:
    """Write an entry atomically (see the module docstring); returns the entry now in place.

    Raises:
        OSError: the cache directory cannot be written.
    """
    directory = entry_dir(root, key)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{key[:16]}.", suffix=".tmp"))
    try:
        digests = {}
        for name, data in files.items():
            if name == MANIFEST or os.path.basename(name) != name:
                raise ValueError(f"bad entry file name {name!r}")
            (staging / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        manifest = {"format": FORMAT, "key": key, "files": digests, "info": dict(info or {})}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        for attempt in range(2):
            try:
                os.rename(staging, directory)
                _count("stored")
                return Entry(directory, {name: directory / name for name in digests}, digests)
            except OSError:
                # Already there: another process (or thread) wrote it first. Keep theirs if it is
                # intact; a bad one is deleted by lookup, and the rename is tried once more.
                existing = lookup(root, key)
                if existing is not None:
                    _count("lost_races")
                    return existing
        raise OSError(f"could not put cache entry {directory} in place")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _discard(directory: Path) -> None:
    """Move a bad entry aside (one rename, so no reader sees it half-deleted), then delete it."""
    doomed = directory.with_name(f".{directory.name[:16]}.{os.getpid()}.{threading.get_ident()}.bad")
    try:
        os.rename(directory, doomed)
    except OSError:
        return  # someone else moved or replaced it first
    shutil.rmtree(doomed, ignore_errors=True)


def _count(field: str) -> None:
    with _stats_lock:
        setattr(stats, field, getattr(stats, field) + 1)
