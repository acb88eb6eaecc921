"""Which producers a kernel on another device may recompute: the scheduler's device rule.

A kernel runs on one device and reads memory of that device only, plus CPU scalars it receives
by value (``ir/devices.is_kernel_scalar``). So a producer is inlined into a reader on another
device only as a *value*: a 0-d CPU computation (size arithmetic such as
``scalar_tensor(s0) * 2.0``, which decompositions create on the CPU inside GPU graphs) recomputed
in the GPU kernel from its scalar arguments. Anything else that another device reads is stored
by a kernel of its own device.
"""
from __future__ import annotations

from typing import Callable

import torch

from torchfuse.ir.devices import is_kernel_scalar
from torchfuse.ir.expr import read_buffers
from torchfuse.ir.graph import Buffer, Pointwise


def may_inline_across(producer: Pointwise, reader_device: torch.device) -> bool:
    """Whether ``producer`` may be recomputed in a kernel on ``reader_device`` at all."""
    if producer.device == reader_device:
        return True
    return producer.device.type == "cpu" and reader_device.type != "cpu" and len(producer.shape) == 0


def travels_as_value(producer: Pointwise, reader_device: torch.device,
                     inlinable: Callable[[str], Pointwise | None], buffers: dict[str, Buffer]) -> bool:
    """Whether a kernel on ``reader_device`` can recompute ``producer`` (a 0-d CPU value) with
    every memory read it needs being a kernel scalar, through the producers it inlines too."""
    if not may_inline_across(producer, reader_device):
        return False
    for name in dict.fromkeys(read_buffers(producer.body)):
        inner = inlinable(name)
        if inner is not None:
            if not travels_as_value(inner, reader_device, inlinable, buffers):
                return False
        elif not is_kernel_scalar(buffers[name], reader_device):
            return False
    return True
