"""Import a generated kernel module for the GPU: ``triton.jit``, Triton's libdevice, exact bf16 rounding.

The one place that turns a kernel module file into ``JITFunction``s for a GPU, used by the main
process (``kernel_cache.py``) and by the compile workers (``compile_worker.py``), so both compile
the same functions. A leaf module (standard library and Triton only): workers import it without
torch.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def module_name(path: Path, interpret: bool) -> str:
    """The module's name: part of each function's full name, which Triton hashes into its keys."""
    return f"torchfuse_kernel_{path.stem}_{int(interpret)}"


def load_gpu_module(path: Path) -> ModuleType:
    """Execute the kernel module at ``path`` with the names its header says the loader supplies."""
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    spec = importlib.util.spec_from_file_location(module_name(path, False), path)
    module = importlib.util.module_from_spec(spec)
    module.ROUND_BY_BITS = tl.constexpr(False)
    module.jit = triton.jit
    module.libdevice = libdevice
    spec.loader.exec_module(module)
    return module
