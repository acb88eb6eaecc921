"""Which buffers a kernel on another device may read: eager's rule for CPU scalars.

Eager lets a CUDA op read a 0-d CPU tensor as a *scalar*: ``cuda_x * torch.tensor(0.5)``
launches a CUDA kernel that receives 0.5 as an argument. Our kernels do the same: the wrapper
reads the value on the host and passes it by value, with no copy. Any other buffer a kernel
reads is on the kernel's own device (``lowering/devices.py`` makes it so).
"""
from __future__ import annotations

import torch

from torchfuse.ir.graph import Buffer

# dtypes whose every value a Triton scalar argument holds exactly (a Python float is typed fp32,
# which holds any float32, bfloat16 or float16 value; ints pick i32 or i64 by value). A float64
# value does not fit: such tensors are copied to the device instead.
SCALAR_DTYPES = frozenset({
    torch.float32, torch.float16, torch.bfloat16, torch.bool,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
})


def is_kernel_scalar(buffer: Buffer, kernel_device: torch.device) -> bool:
    """Whether a kernel on ``kernel_device`` receives ``buffer`` by value: a 0-d CPU tensor read
    by a GPU kernel."""
    return (kernel_device.type != "cpu" and buffer.device.type == "cpu" and len(buffer.shape) == 0
            and buffer.dtype in SCALAR_DTYPES)
