"""torchfuse: a fusion compiler backend for torch.compile (ATen -> loop IR -> fused kernels)."""
from torchfuse.api import backend, compile, explain, report, reset, warmup

__all__ = ["backend", "compile", "explain", "report", "reset", "warmup"]
__version__ = "0.1.0"


def _register_backend() -> None:
    from torch._dynamo import list_backends, register_backend

    if "torchfuse" not in list_backends(exclude_tags=()):
        register_backend(name="torchfuse")(backend)


_register_backend()
