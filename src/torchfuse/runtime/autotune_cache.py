"""Autotuning choices on disk: one small JSON file per tuned launch, so a later process times nothing.

An entry lives at ``$TORCHFUSE_CACHE_DIR/autotune/<sha256 of the key>.json`` and holds the key's
fields, the chosen config and the timings that chose it. The key (``ChoiceKey``) names what the
choice depends on: the kernel module's source and function (the code timed), the launch's
sizes and Triton specialization (dtypes, pointer alignment, integer classes), the candidate
set (so a change to ``autotune_configs`` retunes), the device (GPU name, compute capability and
SM count: a MIG slice of an H200 is another machine), Triton's and torch's versions and
``FORMAT``.

Safety: an entry is written to a temporary file and renamed into place (a reader sees a whole
file or none; of two processes writing the same entry the last rename wins, and either is a
valid choice). A reader checks that the file parses, was written for this exact key (not only
the same digest) and chose one of the current candidates; anything else is deleted, counted in
``stats.corrupt``, and answered as a miss, so the caller times again and rewrites it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torchfuse.runtime.cache_paths import cache_dir
from torchfuse.runtime.launch_configs import Config

FORMAT = "autotune-1"


@dataclass(frozen=True)
class ChoiceKey:
    """Everything a tuned launch's choice depends on (all text, so it is stored as it is)."""

    module_digest: str  # sha256 of the kernel's module source
    function: str
    sizes: str  # "xnumel,rnumel"
    specialization: str  # what Triton specializes the arguments on
    candidates: str  # the candidate configs, in order
    device: str  # "NVIDIA H200:9.0:132 SMs", or "cpu" for Triton's interpreter
    versions: str  # Triton's and torch's

    def digest(self) -> str:
        text = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # entries unreadable, written for another key, or choosing a config no longer offered
    stored: int = 0


stats = CacheStats()
_stats_lock = threading.Lock()


def root() -> Path:
    return cache_dir() / "autotune"


def path_of(key: ChoiceKey) -> Path:
    return root() / f"{key.digest()}.json"


def lookup(key: ChoiceKey, candidates: list[Config], count: bool = True) -> Config | None:
    """The stored choice for ``key`` if it is intact and among ``candidates``; else None (and a
    bad entry is deleted). ``count=False``: a look ahead (compiling), not counted as a hit or miss."""
    path = path_of(key)
    try:
        text = path.read_text()
    except OSError:
        if count:
            _count("misses")
        return None
    choice = _parse(text, key)
    if choice is None or choice not in candidates:
        _count("corrupt")
        _remove(path)
        return None
    if count:
        _count("hits")
    return choice


def store(key: ChoiceKey, choice: Config, timings: list[tuple[Config, float]]) -> None:
    """Write the choice for ``key`` (and what each candidate measured, for people reading it)."""
    payload = {"format": FORMAT, "key": asdict(key), "choice": _config_fields(choice),
               "timings_us": [[_config_fields(c), seconds * 1e6] for c, seconds in timings]}
    directory = root()
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        os.replace(tmp, path_of(key))
    except BaseException:
        _remove(Path(tmp))
        raise
    _count("stored")


def _parse(text: str, key: ChoiceKey) -> Config | None:
    try:
        payload = json.loads(text)
        if payload.get("format") != FORMAT or payload.get("key") != asdict(key):
            return None
        return _config_from(payload["choice"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _config_fields(config: Config) -> dict[str, Any]:
    return {"grid": config.grid, "constexprs": list(config.constexprs), "num_warps": config.num_warps,
            "num_stages": config.num_stages}


def _config_from(fields: dict[str, Any]) -> Config:
    stages = fields["num_stages"]
    if not isinstance(fields["grid"], int) or not isinstance(fields["num_warps"], int) \
            or not all(isinstance(c, int) for c in fields["constexprs"]) or not (stages is None or isinstance(stages, int)):
        raise TypeError("not a config")
    return Config(fields["grid"], tuple(fields["constexprs"]), fields["num_warps"], stages)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _count(name: str) -> None:
    with _stats_lock:
        setattr(stats, name, getattr(stats, name) + 1)
