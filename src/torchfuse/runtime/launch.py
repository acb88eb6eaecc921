"""Launch generated kernels: grid and block sizes are chosen here, from the real sizes.

Block sizes are ``tl.constexpr``: the kernel source stays the same for every shape, and
Triton compiles one binary per distinct block size it is launched with.
"""
from __future__ import annotations

import threading
from typing import Any

MAX_POINTWISE_BLOCK = 1024
MAX_PERSISTENT_TILE = 4096  # elements of one [XBLOCK, RBLOCK] tile held in registers
LOOPED_RBLOCK = 1024

# Launches hold this lock. Triton's interpreter (kernels on CPU tensors) patches triton.language
# for the duration of a launch and restores it afterwards: two threads interpreting at once
# restored each other's patches, and a GPU kernel compiled meanwhile (a first launch compiles)
# saw the patched module and failed ("'ir.value' object has no attribute 'data'", found on an
# H200 when one test interpreted from four threads). Uncontended, it costs well under a microsecond.
_launch_lock = threading.RLock()


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch_pointwise(kernel: Any, xnumel: int, *args: Any) -> None:
    if xnumel <= 0:
        return
    block = min(MAX_POINTWISE_BLOCK, max(16, next_power_of_2(xnumel)))
    warps = 4 if block >= 256 else 2
    with _launch_lock:
        kernel[(cdiv(xnumel, block),)](*args, xnumel, XBLOCK=block, num_warps=warps)


def launch_reduction(kernel: Any, persistent: bool, xnumel: int, rnumel: int, *args: Any) -> None:
    if xnumel <= 0:
        return
    if persistent:
        rblock = max(2, next_power_of_2(rnumel))
        xblock = max(1, min(next_power_of_2(xnumel), MAX_PERSISTENT_TILE // rblock, 64))
    else:
        rblock = min(LOOPED_RBLOCK, max(2, next_power_of_2(rnumel)))
        xblock = 1
    warps = 8 if rblock * xblock >= 2048 else 4
    with _launch_lock:
        kernel[(cdiv(xnumel, xblock),)](*args, xnumel, rnumel, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)
