"""``libdevice`` for Triton's interpreter: the same math, computed by PyTorch on CPU.

Triton's interpreter (how we run generated kernels on CPU tensors in tests) cannot call
``libdevice``'s CUDA functions. Rather than generate different source for tests, kernels
see this namespace under the name ``libdevice`` when interpreted. It reaches into the
interpreter's tensor handles, which is Triton-internal, so it lives here alone.
"""
from __future__ import annotations

import types
from typing import Callable

import numpy as np
import torch


def _unwrap(value):
    handle = getattr(value, "handle", None)
    if handle is not None and hasattr(handle, "data"):
        return torch.from_numpy(np.ascontiguousarray(handle.data)), value
    # A Python scalar: exact in float64 (or int64), then converted to the tensor's dtype.
    return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None), None


def _wrap(result: torch.Tensor, like, tl_dtype=None) -> object:
    """A Triton interpreter tensor holding ``result``, shaped like ``like``."""
    from triton.runtime.interpreter import TensorHandle
    import triton.language as tl

    scalar = like.handle.dtype.scalar if hasattr(like.handle.dtype, "scalar") else like.handle.dtype
    if tl_dtype is not None:
        scalar = tl_dtype
    block = tl.block_type(scalar, list(result.shape)) if result.dim() else scalar
    return tl.tensor(TensorHandle(result.numpy(), scalar), block)


def _elementwise(fn: Callable[..., torch.Tensor], result_is_bool: bool = False) -> Callable:
    def apply(*args):
        tensors, likes = zip(*(_unwrap(a) for a in args))
        # The first real tensor argument gives the dtype. (Not ``likes.index``: comparing
        # Triton tensors with ``==`` builds a Triton comparison, not a Python bool.)
        position = next(k for k, l in enumerate(likes) if l is not None)
        like, dtype = likes[position], tensors[position].dtype
        tensors = [t.to(dtype) for t in tensors]
        out = fn(*tensors)
        shape = torch.broadcast_shapes(*[t.shape for t in tensors])
        if result_is_bool:
            import triton.language as tl

            return _wrap(torch.broadcast_to(out.to(torch.bool), shape).contiguous(), like, tl.int1)
        return _wrap(torch.broadcast_to(out.to(dtype), shape).contiguous(), like)

    return apply


libdevice = types.SimpleNamespace(
    pow=_elementwise(torch.pow), atan2=_elementwise(torch.atan2), copysign=_elementwise(torch.copysign),
    hypot=_elementwise(torch.hypot), fmod=_elementwise(torch.fmod), trunc=_elementwise(torch.trunc),
    nearbyint=_elementwise(torch.round), expm1=_elementwise(torch.expm1), log10=_elementwise(torch.log10),
    log1p=_elementwise(torch.log1p), sqrt=_elementwise(torch.sqrt), rsqrt=_elementwise(torch.rsqrt),
    tan=_elementwise(torch.tan), asin=_elementwise(torch.asin), acos=_elementwise(torch.acos),
    atan=_elementwise(torch.atan), sinh=_elementwise(torch.sinh), cosh=_elementwise(torch.cosh),
    tanh=_elementwise(torch.tanh), asinh=_elementwise(torch.asinh), acosh=_elementwise(torch.acosh),
    atanh=_elementwise(torch.atanh), erf=_elementwise(torch.erf), erfc=_elementwise(torch.erfc),
    erfinv=_elementwise(torch.erfinv), lgamma=_elementwise(torch.lgamma),
    signbit=_elementwise(torch.signbit, result_is_bool=True),
)
