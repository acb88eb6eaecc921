"""Compile a graph's Triton kernels before its first run: in the worker pool, once per machine.

For each predicted launch (``predict.py``) the main process computes what ``JITFunction.run``
would hand ``triton.compile``, with Triton's own specialization code (its argument binder and
``_pack_args``, present from Triton 3.4 to 3.9), so the binary is the one Triton would build at
that launch. The binary's key (``binary_key``) names everything it depends on; an intact entry
in the binary cache (``binary_cache.py``) is used as it is, and a missing one is compiled by a
worker (``compile_pool.py``). The launcher gets a loader per specialization
(``launch.Launcher.prepare``): at the first launch it waits for the worker if needed and builds
a ``CompiledKernel`` from the stored files, without Triton's compile path (which would hash
Triton's 500 MB library once per process before finding its own cache entry:
docs/decisions.md, "Compiled GPU binaries").

Anything unexpected (no GPU target, an unknown Triton, a worker error) leaves that kernel to
Triton's compile at its first launch, as before.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from torchfuse.runtime import binary_cache, compile_pool, kernel_cache
from torchfuse.runtime.cache_paths import cache_dir
from torchfuse.runtime.launch_configs import FLAT_KINDS, Config, has_row_loop
from torchfuse.runtime.launch_configs import default_config as launch_config
from torchfuse.runtime.predict import PredictedLaunch, Unpredicted


@dataclass(frozen=True)
class Target:
    """A GPU target as Triton names it (``GPUTarget``): backend, architecture, warp size."""

    backend: str
    arch: Any  # an int for CUDA (90 for sm_90), a string for AMD
    warp_size: int


@dataclass(frozen=True)
class TritonSpec:
    """What ``triton.compile`` needs besides the function: as ``JITFunction.run`` computes it."""

    signature: dict
    constexprs: dict
    attrs: dict
    options: dict


@dataclass
class AheadStats:
    predicted: int = 0  # binaries predicted: one per kernel of a graph (per candidate config under max-autotune)
    from_disk: int = 0  # of which found in the binary cache when the graph compiled
    compiled: int = 0  # of which sent to the worker pool
    unpredicted: int = 0  # kernels left to Triton's first-launch compile
    failed: int = 0  # compiles or loads that failed (Triton compiled those at the first launch)
    wait_seconds: float = 0.0  # time first launches waited for a worker
    load_seconds: float = 0.0  # time spent building CompiledKernels from stored binaries
    errors: list[str] = field(default_factory=list)  # the first few failures, for the report


stats = AheadStats()
_stats_lock = threading.Lock()


def binaries_root() -> Path:
    return cache_dir() / "gpu"


def current_target() -> Target | None:
    """The current GPU's target, read as Triton's launch path reads it (None without a GPU)."""
    try:
        from triton.runtime.driver import driver

        target = driver.active.get_current_target()
    except Exception:  # noqa: BLE001 - no driver, no GPU: nothing to compile ahead for
        return None
    return Target(target.backend, target.arch, target.warp_size)


def compile_ahead(kernels: dict[str, Any], fns: dict[str, Any], predictions: dict[str, Any],
                  target: Target | None = None, configs: dict[str, list[Config]] | None = None,
                  ) -> dict[str, tuple[PredictedLaunch, list[AheadBinary]]]:
    """Start compiling every predicted launch; returns, per kernel name, the launch and the
    loaders of its binaries (one per config, each knowing its ``config``).

    Args:
        kernels: rendered ``TritonKernel``s by name.
        fns: their ``JITFunction``s by name (``kernel_cache.load_kernel``).
        predictions: ``predict.predict_launches``' result.
        target: the GPU to compile for; default: the current GPU (none: nothing is compiled).
        configs: per kernel name, the launch configs to compile (max-autotune: the candidates,
            ``autotune.configs_to_compile``); default: the launcher's default config alone.
    """
    target = target or current_target()
    ready: dict[str, tuple[PredictedLaunch, list[AheadBinary]]] = {}
    if target is None or not _triton_supported():
        return ready
    for name, launch in predictions.items():
        if isinstance(launch, Unpredicted):
            _count("unpredicted")
            continue
        loaders = []
        for config in (configs or {}).get(name) or [default_config(kernels[name], launch)]:
            try:
                loader = _start(kernels[name], fns[name], launch, target, config)
            except Exception as error:  # noqa: BLE001 - unexpected Triton internals: compile at launch
                _failed(f"{name}: {type(error).__name__}: {error}")
                continue
            if loader is not None:
                loaders.append(loader)
        if loaders:
            ready[name] = (launch, loaders)
    return ready


def default_config(kernel: Any, launch: PredictedLaunch) -> Config:
    """The config ``launch.Launcher`` uses for this launch when nothing is tuned."""
    return launch_config(kernel.kind, kernel.persistent, kernel.outer, kernel.tile, launch.xnumel, launch.rnumel,
                         getattr(kernel, "live_tiles", 0), getattr(kernel, "special_step", 0),
                         getattr(kernel, "chunk_lanes", 0))


def _start(kernel: Any, fn: Any, launch: PredictedLaunch, target: Target, config: Config) -> AheadBinary | None:
    """The loader of ``launch``'s binary for ``config``: found on disk, or being compiled by a
    worker; None when it is not on disk and compiling ahead is off (``TORCHFUSE_COMPILE_WORKERS=0``)."""
    spec = specialize(fn, kernel, launch, target, config)
    key = binary_key(kernel_cache.module_source(kernel.source), kernel.function, spec, target)
    loader = AheadBinary(fn, spec, key, target, config)
    if binary_cache.lookup(binaries_root(), key) is not None:
        _count("predicted")
        _count("from_disk")
        return loader
    pool = compile_pool.get_pool()
    if pool is None:
        return None
    loader.future = pool.submit(_job(kernel, spec, key, target))
    _count("predicted")
    _count("compiled")
    return loader


def _job(kernel: Any, spec: TritonSpec, key: str, target: Target) -> dict:
    return {"kind": "triton", "key": key, "root": str(binaries_root()),
            "module_path": str(kernel_cache.module_path(kernel.source)), "function": kernel.function,
            "signature": spec.signature, "constexprs": spec.constexprs, "attrs": spec.attrs,
            "options": spec.options, "target": (target.backend, target.arch, target.warp_size),
            "info": {"function": kernel.function, "triton": _triton_version()}}


class AheadBinary:
    """Loads one ahead-compiled specialization, compiled for ``config``, for the current device
    (``Launcher.prepare``)."""

    def __init__(self, fn: Any, spec: TritonSpec, key: str, target: Target, config: Config) -> None:
        self.fn, self.spec, self.key, self.target, self.config = fn, spec, key, target, config
        self.future: Future | None = None
        self.target_now: Callable[[], Target | None] = current_target  # tests: a GPU without one

    def __call__(self) -> Any:
        if self.future is not None and not self._worker_succeeded():
            return None
        if self.target_now() != self.target:  # another kind of GPU than the one compiled for
            return None
        started = time.perf_counter()
        try:
            entry = binary_cache.lookup(binaries_root(), self.key)
            compiled = None if entry is None else load_compiled(self.fn, self.spec, entry)
        except Exception as error:  # noqa: BLE001 - a bad entry: Triton compiles at this launch
            _failed(f"loading {self.fn.__name__}: {type(error).__name__}: {error}")
            compiled = None
        with _stats_lock:
            stats.load_seconds += time.perf_counter() - started
        return compiled

    def _worker_succeeded(self) -> bool:
        started = time.perf_counter()
        reply = compile_pool.wait(self.future)
        with _stats_lock:
            stats.wait_seconds += time.perf_counter() - started
        if not reply.get("ok"):
            _failed(f"{self.fn.__name__}: {reply.get('error')}")
            return False
        return True


def load_compiled(fn: Any, spec: TritonSpec, entry: binary_cache.Entry) -> Any:
    """A ``CompiledKernel`` from a cache entry, as Triton builds one on a hit in its own cache;
    None when the binary it read is not the one stored."""
    from triton.compiler import ASTSource, CompiledKernel

    metadata_name = next(name for name in entry.files if name.endswith(".json"))
    metadata = json.loads(entry.files[metadata_name].read_text())
    group = {name: str(path) for name, path in entry.files.items()}
    compiled = CompiledKernel(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs), group, metadata["hash"])
    binary_name = next(name for name in entry.files if not name.endswith((".json", ".ptx")))
    if not entry.verified(binary_name, compiled.kernel):
        _failed(f"{binary_name}: changed on disk while loading")
        return None
    return compiled


# -- what Triton would compile ------------------------------------------------------------------
_binders: dict[tuple[int, Target], tuple[Any, Any]] = {}


def specialize(fn: Any, kernel: Any, launch: PredictedLaunch, target: Target,
               config: Config | None = None) -> TritonSpec:
    """Signature, constexprs, attributes and options for ``launch`` with ``config`` (default:
    the launcher's default config), from Triton's own code."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    cache_key = (id(fn), target)
    if cache_key not in _binders:
        backend = make_backend(GPUTarget(target.backend, target.arch, target.warp_size))
        _binders[cache_key] = (backend, create_function_from_signature(fn.signature, fn.params, backend))
    backend, binder = _binders[cache_key]
    config = config or default_config(kernel, launch)
    numels = (launch.xnumel,) if kernel.kind in FLAT_KINDS else (launch.xnumel, launch.rnumel)
    kwargs: dict[str, Any] = dict(config.kernel_constexprs(has_row_loop(fn)), **config.launch_options())
    # The options JITFunction.run adds before binding (Triton 3.6: debug, instrumentation_mode;
    # 3.9 also fpsan_homomorphic_casts), so the compile options match a first-launch compile.
    kwargs["debug"] = fn.debug or knobs.runtime.debug
    for option in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, option):
            kwargs[option] = getattr(knobs.compilation, option)
    bound, specialization, options = binder(*launch.args, *numels, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return TritonSpec(signature, constexprs, attrs, dict(options.__dict__))


def binary_key(module_source: str, function: str, spec: TritonSpec, target: Target) -> str:
    """Everything the binary depends on (binary_cache.entry_key hashes it with its format)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return binary_cache.entry_key({
        "module": module_source, "function": function,
        "signature": repr(sorted(spec.signature.items())), "constexprs": repr(sorted(spec.constexprs.items())),
        "attrs": repr(sorted(spec.attrs.items())), "options": repr(sorted(spec.options.items())),
        "target": f"{target.backend}:{target.arch}:{target.warp_size}",
        "triton": _triton_version(), "torch": torch.__version__,
        "env": repr(sorted(get_cache_invalidating_env_vars().items())),
    })


_versions: list[str] = []


def _triton_version() -> str:
    """Triton's version and its compiler library's identity (path, size, mtime: a rebuilt Triton
    of the same version is another compiler, and hashing its 500 MB would cost a warm start)."""
    if not _versions:
        import triton
        from triton._C import libtriton

        library = os.path.realpath(libtriton.__file__)
        info = os.stat(library)
        _versions.append(f"{triton.__version__}:{library}:{info.st_size}:{info.st_mtime_ns}")
    return _versions[0]


def _triton_supported() -> bool:
    """Triton 3.4 or later: the binder and launcher conventions this module and launch.py use."""
    try:
        import triton
        from triton import knobs
    except ImportError:
        return False
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    return version >= (3, 4) and getattr(knobs.runtime, "add_stages_inspection_hook", None) is None


def _count(name: str) -> None:
    with _stats_lock:
        setattr(stats, name, getattr(stats, name) + 1)


def _failed(message: str) -> None:
    with _stats_lock:
        stats.failed += 1
        if len(stats.errors) < 10:
            stats.errors.append(message)
