"""A compile worker process: compiles Triton kernels for a GPU target into the binary cache.

``compile_pool.py`` starts each worker as ``python -c BOOT <package dir>`` (fork and exec: no
Python code runs in a forked copy of a process that may hold CUDA state). BOOT registers
``torchfuse`` as a bare package, so importing this module does not run ``torchfuse/__init__``
(torch, Dynamo and the whole compiler: 3.4 s on the 2-core machine, against 0.25 s for Triton
alone), then calls ``serve()``. This module imports only the standard library, Triton (inside
functions) and the leaf modules ``binary_cache`` and ``triton_module``; a worker never imports
torch, never initialises a GPU and never launches anything.

Protocol: length-prefixed pickles (both ends are this package, same interpreter) on stdin and
the original stdout; fd 1 is pointed at stderr first, so a library that prints cannot corrupt
a reply. A request is a job ``dict`` (``kind``: "triton" or "ping"); each gets one reply ``dict``.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from torchfuse.runtime import binary_cache
from torchfuse.runtime.triton_module import load_gpu_module

# Runs in the fresh interpreter: argv[1] is the directory holding the torchfuse package.
BOOT = (
    "import sys, types\n"
    "package = types.ModuleType('torchfuse')\n"
    "package.__path__ = [sys.argv[1] + '/torchfuse']\n"
    "sys.modules['torchfuse'] = package\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from torchfuse.runtime.compile_worker import serve\n"
    "serve()\n"
)
_HEADER = struct.Struct("<Q")


def write_message(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: BinaryIO) -> Any:
    """The next message, or None at the end of the stream (the other side is gone)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size = _HEADER.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def serve() -> None:
    """Answer jobs until stdin closes."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() and C-level writes to stdout go to stderr from here on
    requests = sys.stdin.buffer
    _import_compiler()  # while the main process still traces: the first job starts compiling at once
    while True:
        job = read_message(requests)
        if job is None:
            return
        write_message(replies, handle(job))


def handle(job: dict) -> dict:
    started = time.perf_counter()
    try:
        if job["kind"] == "ping":
            reply = {"ok": True, "pid": os.getpid(), "torch_loaded": "torch" in sys.modules}
        elif job["kind"] == "triton":
            reply = compile_triton(job)
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")
    except Exception as error:  # noqa: BLE001 - the job fails, the worker lives on
        reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    reply.setdefault("seconds", time.perf_counter() - started)
    reply["key"] = job.get("key")
    return reply


def _import_compiler() -> None:
    try:
        import triton.compiler  # noqa: F401 - imported for its side effect (loading Triton)
    except ImportError:
        pass  # every job will say so


_modules: dict[str, Any] = {}


def compile_triton(job: dict) -> dict:
    """Compile one specialization of a kernel for ``job["target"]`` and store its binary.

    The job carries what ``JITFunction.run`` would hand ``triton.compile`` (computed by the main
    process with Triton's own specialization code): signature, constexprs, attrs, options.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    root = Path(job["root"])
    if binary_cache.lookup(root, job["key"]) is not None:
        return {"ok": True, "cached": True}
    path = job["module_path"]
    if path not in _modules:
        _modules[path] = load_gpu_module(Path(path))
    fn = getattr(_modules[path], job["function"])
    target = GPUTarget(*job["target"])
    source = ASTSource(fn, job["signature"], job["constexprs"], job["attrs"])
    compiled = triton.compile(source, target=target, options=job["options"])
    binary_ext = make_backend(target).binary_ext
    # The PTX too: the static launcher checks the binary's parameters against its ``.entry``.
    files = {name: Path(file).read_bytes() for name, file in compiled.metadata_group.items()
             if name.endswith((".json", ".ptx", "." + binary_ext))}
    binary_cache.store(root, job["key"], files, job.get("info"))
    return {"ok": True, "cached": False, "launcher": prebuild_launcher(source, compiled)}


def prebuild_launcher(source: Any, compiled: Any) -> str:
    """Build Triton's C launcher for this signature now, into Triton's own cache.

    Triton 3.6 compiles a small C module per kernel signature with the system C compiler at a
    kernel's first launch (``CudaLauncher``, cached on disk by the C source); building it here
    takes that off the main process. Later Triton versions have one generic launcher and need
    nothing. Best effort: without a CUDA driver library (CPU machines) this does nothing.
    """
    try:
        from triton.backends.nvidia import driver as nvidia_driver
    except ImportError:
        return "no nvidia backend"
    if not hasattr(nvidia_driver, "make_launcher") or source.fn is None:
        return "not needed"
    try:
        nvidia_driver.CudaLauncher(source, compiled.metadata)
    except Exception as error:  # noqa: BLE001 - the main process builds it at the first launch
        return f"skipped ({type(error).__name__})"
    return "built"
