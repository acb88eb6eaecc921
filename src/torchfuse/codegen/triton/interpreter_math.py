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
    return torch.tensor(value), None


def _wrap(result: torch.Tensor, like) -> object:
    from triton.runtime.interpreter import TensorHandle
    import triton.language as tl

    data = result.numpy()
    return tl.tensor(TensorHandle(data, like.handle.dtype.scalar if hasattr(like.handle.dtype, "scalar") else like.handle.dtype), like.type)


def _elementwise(fn: Callable[..., torch.Tensor], result_is_bool: bool = False) -> Callable:
    def apply(*args):
        tensors, likes = zip(*(_unwrap(a) for a in args))
        like = next(l for l in likes if l is not None)
        dtype = tensors[likes.index(like)].dtype
        tensors = [t.to(dtype) for t in tensors]
        out = fn(*tensors)
        if result_is_bool:
            out = out.to(torch.int32)
        else:
            out = out.to(dtype)
        return _wrap(torch.broadcast_to(out, torch.broadcast_shapes(*[t.shape for t in tensors])).contiguous(), like)

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
