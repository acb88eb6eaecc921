"""torchfuse: a fusion compiler backend for torch.compile (ATen -> loop IR -> fused kernels).

The public names: ``compile``, ``backend``, ``report`` and ``reset`` from the API (``api.py``), and
the tools ``explain`` and ``warmup`` built on it (``tools/``).
"""
import torch._dynamo

from torchfuse.api import backend, compile, report, reset
from torchfuse.tools.explain import explain
from torchfuse.tools.warmup import warmup

__all__ = ["backend", "compile", "explain", "report", "reset", "warmup"]
__version__ = "0.1.0"


def _register_backend() -> None:
    if "torchfuse" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name="torchfuse")(backend)


_register_backend()
