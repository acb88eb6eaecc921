"""Whole-graph cache: compiling an ATen graph seen before skips lowering, scheduling and rendering.

A graph's key hashes everything its generated code depends on: every node (op, arguments, the
shape, strides and dtype tracing gave it, its source line), the values of 0-d tensor constants
(they are inlined), the target, the graph's kind, the options, ``TORCHFUSE_*`` variables,
whether deterministic algorithms are on, torch's version, torchfuse's own source and the CPU. An entry holds what the wrapper needs: its
source and the objects it names, the rendered kernels (whose libraries come back from the
kernel caches) and the graph's report. Entries live in this process and on disk under
``$TORCHFUSE_CACHE_DIR/graphs``.

A graph whose compile added guards or runtime assertions to the ShapeEnv is not stored: a hit
could not replay them. ``TORCHFUSE_GRAPH_CACHE=0`` turns the cache off (the test suite does, so
that a test never gets another test's compile; tests/test_graph_cache.py turns it on).
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import tempfile
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.fx

from torchfuse.frontend.symbolic import constant_value
from torchfuse.runtime import cpp_build
from torchfuse.runtime.cache_paths import cache_dir

FORMAT = "graph-cache-1"
# Variables that change where things go or what is printed, never what is generated.
IGNORED_VARIABLES = {"TORCHFUSE_CACHE_DIR", "TORCHFUSE_DUMP", "TORCHFUSE_CHECK", "TORCHFUSE_GRAPH_CACHE",
                     "TORCHFUSE_AOT_CACHE"}


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    stored: int = 0
    not_stored: dict[str, int] = field(default_factory=dict)  # reason -> count


@dataclass
class GraphEntry:
    """What rebuilding a compiled graph's callable needs, without its IR."""
    wrapper_source: str
    wrapper_constants: dict[str, Any]  # names the wrapper uses -> objects (ops, dtypes, kernels)
    kernels: dict[str, Any]  # kernel name -> rendered CppKernel / TritonKernel
    constant_targets: dict[str, str]  # buffer name of a tensor constant -> its get_attr target
    report: Any  # the GraphReport of the compile that stored it
    # GPU kernel name -> its predicted launch (runtime/predict.py), compiled ahead again on a hit
    predictions: dict[str, Any] = field(default_factory=dict)
    # Launcher constant -> argument positions fixed at every call (``WrapperWriter.fixed_args``)
    fixed_args: dict[str, frozenset[int]] = field(default_factory=dict)


stats = CacheStats()
_memory: dict[str, GraphEntry] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("TORCHFUSE_GRAPH_CACHE", "1") != "0"


def clear_memory() -> None:
    with _lock:
        _memory.clear()


# -- the key ---------------------------------------------------------------------------------
def graph_key(gm: torch.fx.GraphModule, kind: str, target: str, options: Any) -> str | None:
    """The graph's key, or None for a graph the key cannot describe: one holding anything but
    tensors as attributes (a higher-order op's subgraph module)."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and not isinstance(attribute(gm, node.target), torch.Tensor):
            return None
    digest = hashlib.sha256()
    for part in _key_parts(gm, kind, target, options):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _key_parts(gm: torch.fx.GraphModule, kind: str, target: str, options: Any):
    yield FORMAT
    yield torchfuse_source_digest()
    yield torch.__version__
    yield f"{kind}|{target}"
    yield repr({f.name: getattr(options, f.name) for f in fields(options) if f.name not in ("dump", "check")})
    yield repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("TORCHFUSE_") and k not in IGNORED_VARIABLES))
    # Deterministic algorithms keep accumulating scatters ATen calls on the Triton target.
    yield f"deterministic={torch.are_deterministic_algorithms_enabled()}"
    yield _machine(target)
    for node in gm.graph.nodes:
        yield "|".join((node.op, node.name, _describe(node.target), _describe(node.args), _describe(node.kwargs),
                        _describe(node.meta.get("val")), str(node.meta.get("stack_trace") or "")))
        if node.op == "get_attr":
            yield _describe_constant(attribute(gm, node.target))


def attribute(module: torch.nn.Module, target: str) -> Any:
    """``module.a.b`` for the target ``"a.b"`` of a get_attr node."""
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _describe(value: Any) -> str:
    """Text that differs whenever the value could change generated code."""
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, torch.Tensor):
        return (f"T({value.dtype},{value.device},{[str(s) for s in value.shape]},"
                f"{[str(s) for s in value.stride()]},{value.storage_offset()},{value.requires_grad})")
    if isinstance(value, (list, tuple)):
        inner = ",".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym({value.node.expr})"
    if isinstance(value, float):
        return repr(value)  # keeps -0.0, nan and inf apart
    return f"{type(value).__name__}:{value}"


def _describe_constant(tensor: torch.Tensor) -> str:
    """0-d constants are inlined into kernels, so their value is part of the code."""
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 0:
        return f"value={constant_value(tensor)!r}"
    return ""


def _machine(target: str) -> str:
    if target == "cpp":
        return cpp_build._cpu_identity()
    return ""


_source_digest: list[str] = []


def torchfuse_source_digest() -> str:
    """A digest of torchfuse's own .py files: a new version never reads an old entry."""
    if not _source_digest:
        root = Path(__file__).resolve().parents[1]
        digest = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
        _source_digest.append(digest.hexdigest())
    return _source_digest[0]


def shape_env_marks(shape_env: Any) -> tuple[int, int] | None:
    """Counts of guards and runtime assertions: a compile that changes them is not cacheable."""
    if shape_env is None:
        return None
    asserts = sum(len(v) for v in getattr(shape_env, "deferred_runtime_asserts", {}).values())
    return len(shape_env.guards), asserts


# -- lookup and store ------------------------------------------------------------------------
def lookup(key: str) -> GraphEntry | None:
    with _lock:
        entry = _memory.get(key)
    if entry is not None:
        stats.memory_hits += 1
        return entry
    path = _path(key)
    try:
        with open(path, "rb") as handle:
            entry = pickle.load(handle)
    except FileNotFoundError:
        stats.misses += 1
        return None
    except Exception:  # noqa: BLE001 - a damaged or stale entry is a miss, and goes away
        path.unlink(missing_ok=True)
        stats.misses += 1
        return None
    if not isinstance(entry, GraphEntry):
        stats.misses += 1
        return None
    stats.disk_hits += 1
    with _lock:
        _memory[key] = entry
    return entry


def store(key: str, entry: GraphEntry) -> None:
    """Keep ``entry`` in memory and on disk; an entry that does not pickle stays in memory only."""
    with _lock:
        _memory[key] = entry
    try:
        buffer = io.BytesIO()
        _Pickler(buffer).dump(entry)
    except Exception as error:  # noqa: BLE001 - e.g. an extern argument pickle cannot write
        reason = type(error).__name__
        stats.not_stored[reason] = stats.not_stored.get(reason, 0) + 1
        return
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(buffer.getvalue())
    os.replace(tmp, path)
    stats.stored += 1


def not_stored(reason: str) -> None:
    stats.not_stored[reason] = stats.not_stored.get(reason, 0) + 1


def _path(key: str) -> Path:
    return cache_dir() / "graphs" / key[:2] / f"{key}.pkl"


class _Pickler(pickle.Pickler):
    """ATen ops pickle by name (an OpOverload holds pybind objects pickle cannot write)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return _resolve_op, (obj._schema.name, obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            return _resolve_op, (obj._qualified_op_name, None)
        return NotImplemented


def _resolve_op(qualified_name: str, overload: str | None) -> Any:
    namespace, name = qualified_name.split("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)

