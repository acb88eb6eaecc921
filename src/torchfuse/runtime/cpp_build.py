"""Build a graph's C++ translation unit into a shared library, cache it, load it with ctypes.

One compiler call per graph: every kernel of the graph is in one source. The library is
cached on disk under ``cache_dir()/cpp`` by a sha256 of the source, the flags and the
compiler's identity (its resolved path, size and mtime, so that a second process never has
to run the compiler, even for ``--version``) plus the CPU's model and flags (``-march=native``
code must not run on another machine sharing the cache). Files are written to a temporary
name and renamed, so concurrent processes never load half a library.

The instruction set is ``-march=$TORCHFUSE_CPP_ARCH`` (default ``native``; e.g. ``x86-64``,
``x86-64-v2``, ``x86-64-v3``, ``x86-64-v4``): CI builds the C++ tests for older levels too,
since users' CPUs differ from ours (``arch()``, ``compile_flags()``).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchfuse.codegen.cpp import kernel as cpp_kernel
from torchfuse.runtime import compile_pool
from torchfuse.runtime.cache_paths import cache_dir

# -O3 -march=<arch()>: vectorize for this CPU (or the level $TORCHFUSE_CPP_ARCH names).
# -fno-math-errno and -fno-trapping-math change no result (we never read errno or FP exception
# flags) but let sqrt and selects vectorize. -ffp-contract=off: no fused multiply-adds, so
# results round like eager's (an FMA turns x*y - x*y into a nonzero value, and inf - inf into
# -inf). Kernel pointers are not __restrict__ (codegen/cpp/kernel.py: they may alias), so GCC
# versions loops for aliasing: one runtime check per pair of a stored and another accessed
# pointer, and above vect-max-version-for-alias-checks (default 10) it leaves the loop scalar;
# a fused kernel with 2 stores and 5 loads already needs 11 (GCC_FLAGS, GCC only).
# $TORCHFUSE_CXXFLAGS adds flags after these (debugging: e.g. -fopt-info-vec); all flags are
# part of the cache key.
BASE_FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
              "-std=c++17", "-shared", "-fPIC", "-w")
GCC_FLAGS = ("--param", "vect-max-version-for-alias-checks=64")
DEFAULT_ARCH = "native"
# What -march= accepts: a name such as native, x86-64-v3, znver3 or armv8.2-a+fp16.
_ARCH_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Every symbol must resolve at link time: a missing libmvec function fails the build (and we
# retry without libmvec) instead of failing when the library is loaded.
LINK_FLAGS = ("-Wl,--no-undefined", "-lmvec", "-lm")
NO_MVEC_FLAGS = ("-DTF_NO_MVEC",)


class CppCompileError(RuntimeError):
    """The C++ compiler is missing or rejected a generated source."""


@dataclass
class BuildStats:
    compiler_calls: int = 0  # builds that ran the compiler in this process
    compiler_seconds: float = 0.0  # wall time of those compiler runs
    disk_hits: int = 0  # libraries found on disk (built by an earlier process or graph)
    corrupt_entries: int = 0  # cached libraries that failed their digest check and were rebuilt
    memory_hits: int = 0  # libraries already loaded in this process


stats = BuildStats()
_loaded: dict[str, ctypes.CDLL] = {}  # cache key -> loaded library
_paths: dict[str, tuple[Path, Path]] = {}  # cache key -> (library, source)
_lock = threading.Lock()
_stats_lock = threading.Lock()
_compiler_checked: dict[str, str | None] = {}


def find_compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else g++, else c++ (None when there is none)."""
    key = os.environ.get("CXX", "")
    if key not in _compiler_checked:
        candidates = [key] if key else ["g++", "c++"]
        found = None
        for name in candidates:
            path = shutil.which(name)
            if path:
                found = os.path.realpath(path)
                break
        _compiler_checked[key] = found
    return _compiler_checked[key]


def compiler_available() -> bool:
    return find_compiler() is not None


def arch() -> str:
    """The instruction set kernels are compiled for: ``$TORCHFUSE_CPP_ARCH``, else ``native``.

    ``native`` is this CPU; an x86-64 level (``x86-64``: SSE2, ``-v2``: SSE4.2, ``-v3``: AVX2
    and FMA, ``-v4``: AVX-512) builds what a machine of that level would, which is how the
    tests check the code other CPUs get (eager ATen picks its own code path at run time).

    Raises:
        ValueError: the value is not a ``-march`` name.
    """
    value = os.environ.get("TORCHFUSE_CPP_ARCH", "").strip() or DEFAULT_ARCH
    if not _ARCH_PATTERN.fullmatch(value):
        raise ValueError(f"TORCHFUSE_CPP_ARCH={value!r} is not a -march value (e.g. native, x86-64-v3)")
    return value


def compile_flags(compiler: str | None = None) -> tuple[str, ...]:
    """Every flag but the link flags for ``compiler`` (default: ``find_compiler()``): the base
    flags, GCC's own, ``-march=<arch()>``, then ``$TORCHFUSE_CXXFLAGS`` (which may override them)."""
    compiler = compiler or find_compiler() or ""
    gcc = GCC_FLAGS if "clang" not in os.path.basename(compiler) else ()
    extra = tuple(filter(None, os.environ.get("TORCHFUSE_CXXFLAGS", "").split()))
    return (*BASE_FLAGS, *gcc, f"-march={arch()}", *extra)


def targets_avx512() -> bool:
    """Whether the kernels are compiled for AVX-512 (``native`` on a CPU with it, or ``x86-64-v4``)."""
    level = arch()
    if level == "native":
        return "avx512f" in _cpu_identity().split()
    return level == "x86-64-v4"


@dataclass(frozen=True)
class Library:
    """A loaded shared library and where it came from."""

    handle: ctypes.CDLL
    path: Path
    source_path: Path

    def function(self, name: str, pointer_count: int, size_count: int):
        """The C function ``name(ptr..., int64..., int threads)`` as a ctypes callable."""
        fn = getattr(self.handle, name)
        fn.argtypes = [ctypes.c_void_p] * pointer_count + [ctypes.c_int64] * size_count + [ctypes.c_int]
        fn.restype = None
        return fn


def build(source: str, name_hint: str = "graph") -> Library:
    """Compile ``source`` (or find it compiled) and load it.

    Raises:
        CppCompileError: no compiler, or the compiler failed (with its message and the path
            of the generated source).
    """
    compiler = find_compiler()
    if compiler is None:
        raise CppCompileError("no C++ compiler found (looked for $CXX, g++, c++); install g++ or set CXX")
    flags = compile_flags(compiler)
    key = _cache_key(source, compiler, flags)
    with _lock:
        if key in _loaded:
            stats.memory_hits += 1
            return _library(key)
    # The compiler runs outside the lock: the libraries of one graph build in parallel
    # (load_graph_kernels). Two threads building one key both write through a rename.
    directory = cache_dir() / "cpp" / key[:2]
    directory.mkdir(parents=True, exist_ok=True)
    lib_path, src_path = directory / f"{key}.so", directory / f"{key}.cpp"
    if lib_path.exists() and _intact(lib_path):
        stats.disk_hits += 1
    else:
        _write_atomic(src_path, source.encode())
        _compile(compiler, flags, src_path, lib_path, name_hint)
        _write_atomic(_digest_path(lib_path), _digest(lib_path).encode())
    with _lock:
        if key not in _loaded:
            _loaded[key] = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_LOCAL)
            _paths[key] = (lib_path, src_path)
        return _library(key)


def _library(key: str) -> Library:
    lib_path, src_path = _paths[key]
    return Library(_loaded[key], lib_path, src_path)


def _cache_key(source: str, compiler: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(flags), _compiler_identity(compiler), _cpu_identity()):
        digest.update(part.encode())
        digest.update(b"\0\0")
    return digest.hexdigest()


def _compiler_identity(compiler: str) -> str:
    info = os.stat(compiler)
    return f"{compiler}:{info.st_size}:{info.st_mtime_ns}"


_cpu: list[str] = []


def _cpu_identity() -> str:
    """Model name and feature flags: what ``-march=native`` compiles for."""
    if not _cpu:
        wanted = []
        try:
            with open("/proc/cpuinfo") as handle:
                for line in handle:
                    if line.startswith(("model name", "flags", "Features", "CPU part")):
                        wanted.append(line.strip())
                    if not line.strip() and wanted:
                        break  # the first processor describes them all
        except OSError:
            wanted.append(platform.processor() or platform.machine())
        _cpu.append("\n".join(wanted))
    return _cpu[0]


def _compile(compiler: str, flags: tuple[str, ...], source: Path, target: Path, name_hint: str) -> None:
    """Run the compiler into a temporary file, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        for extra in ((), NO_MVEC_FLAGS):
            command = [compiler, *flags, *extra, str(source), "-o", tmp, *LINK_FLAGS]
            if extra:
                command.remove("-lmvec")
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            with _stats_lock:  # builds of one graph run in several threads
                stats.compiler_calls += 1
                stats.compiler_seconds += time.perf_counter() - started
            if done.returncode == 0:
                os.replace(tmp, target)
                return
            if extra or not _missing_mvec(done.stderr):
                break
        raise CppCompileError(
            f"C++ compilation of {name_hint} failed (exit {done.returncode}); generated source: {source}\n"
            f"command: {' '.join(command)}\n{done.stderr.strip()[-4000:]}"
        )
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_path(lib_path: Path) -> Path:
    return lib_path.with_suffix(".sha256")


def _intact(lib_path: Path) -> bool:
    """A cached library is loaded only if its bytes hash to the digest written beside it;
    a truncated or corrupted one (or one without a digest) is deleted and rebuilt."""
    digest_path = _digest_path(lib_path)
    try:
        if digest_path.read_text().strip() == _digest(lib_path):
            return True
    except OSError:
        pass
    stats.corrupt_entries += 1
    for path in (lib_path, digest_path):
        path.unlink(missing_ok=True)
    return False


def _missing_mvec(stderr: str) -> bool:
    return "_ZGV" in stderr or "lmvec" in stderr


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def clear_memory_cache() -> None:
    """Forget loaded libraries (they stay mapped; the next build of a source reloads from disk)."""
    with _lock:
        _loaded.clear()
        _paths.clear()


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """One warning per distinct message per process (a missing compiler, not once per graph)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


def build_graph_kernels(kernels: list, buffers: dict, graph_name: str) -> tuple[dict, dict]:
    """Render a graph's fused kernels into one translation unit, build it and load it.

    Args:
        kernels: the schedule's ``FusedKernel``s.
        buffers: the graph's buffers.
        graph_name: for messages.
    Returns:
        (rendered ``CppKernel`` by kernel name, ctypes function by kernel name).
    """
    avx512 = targets_avx512()
    rendered = {k.name: cpp_kernel.render_kernel(k, buffers, avx512=avx512) for k in kernels}
    return rendered, load_graph_kernels(rendered, graph_name)


# A graph with at least this many kernels per library is built as several libraries, compiled
# at once, on machines with at least MIN_WORKERS_TO_SPLIT CPUs: a C++ compile of a whole
# training graph is one long compiler run, and each part needs only its own kernels (each
# library has its own prelude, about 0.1 s of compile, hence the minimum). On the 2-core
# machine, loaded by other work, two halves of a 44-kernel backward graph compiled at once took
# 1.40-1.59 s against 1.51-1.56 s for one library, so small machines keep one library per graph.
MIN_KERNELS_PER_LIBRARY = 8
MIN_WORKERS_TO_SPLIT = 4
_builders: ThreadPoolExecutor | None = None


def load_graph_kernels(rendered: dict, graph_name: str) -> dict:
    """The ctypes function of each rendered ``CppKernel``, from the graph's libraries, built (or
    found) in parallel: threads suffice, each waits on its compiler process."""
    if not rendered:
        return {}
    workers = compile_pool.worker_count()
    parts = library_parts(list(rendered.items()), workers if workers >= MIN_WORKERS_TO_SPLIT else 1)
    if len(parts) == 1:
        libraries = [build(cpp_kernel.render_module(list(rendered.values())), graph_name)]
    else:
        sources = [cpp_kernel.render_module([kernel for _, kernel in part]) for part in parts]
        names = [f"{graph_name} (library {i + 1} of {len(parts)})" for i in range(len(parts))]
        libraries = list(_builder_threads().map(build, sources, names))
    return {name: library.function(name, len(k.pointer_args), len(k.size_args))
            for part, library in zip(parts, libraries) for name, k in part}


def library_parts(kernels: list[tuple[str, Any]], workers: int) -> list[list[tuple[str, Any]]]:
    """Consecutive groups of kernels, one library each, of about equal source length; one group
    unless there are at least ``MIN_KERNELS_PER_LIBRARY`` kernels per group and several workers.
    Deterministic, so each part's library is found in the cache by the next process."""
    count = min(max(1, workers), len(kernels) // MIN_KERNELS_PER_LIBRARY)
    if count <= 1:
        return [kernels]
    total = sum(len(k.source) for _, k in kernels)
    parts: list[list[tuple[str, Any]]] = [[]]
    done = 0
    for item in kernels:
        if parts[-1] and done >= total * len(parts) / count and len(parts) < count:
            parts.append([])
        parts[-1].append(item)
        done += len(item[1].source)
    return parts


def _builder_threads() -> ThreadPoolExecutor:
    global _builders
    with _lock:
        if _builders is None:
            _builders = ThreadPoolExecutor(max(1, compile_pool.worker_count()), thread_name_prefix="torchfuse-cpp")
        return _builders
