"""Where eager's float32 ``erf`` becomes exactly 1, measured in this process.

Eager's float32 ``erf`` on CPU is not one function: ATen hands contiguous float32 data to
MKL's ``vsErf`` (``at::vml``), and MKL picks its code by CPU (vendor and ISA) at run time.
Its results differ by an ulp or two from machine to machine, and with them the x from which
the result is exactly 1.0: 3.8325069 where ``tf_erff``'s threshold was first measured,
3.9277344 on an AMD EPYC (AVX-512 or AVX2 alike), while the correctly rounded erf reaches 1
at 3.9192097. A ``floor(4 * erf(x))`` or ``erf(x) == 1`` downstream turns that last ulp into
a whole unit, so ``tf_erff`` takes the threshold as ``TF_ERF_ONE`` (prelude.py), measured
here once per process from ``torch.erf`` itself. The value is part of the source, so of the
compiled library's cache key.
"""
from __future__ import annotations

import concurrent.futures
import struct

import torch

# The correctly rounded float32 erf is 1 from here on (what the prelude assumes undefined).
CORRECTLY_ROUNDED_ONE = 3.9192097187042236
_LOW, _HIGH = 3.0, 6.0  # float32 erf is below 1 at 3 (1 - 2.2e-5) and exactly 1 at 6 anywhere
_WINDOW = 2048  # float32 values checked on each side of the bisected threshold
_measured: list[float] = []


def erf_one_threshold() -> float:
    """The smallest float32 ``t > 0`` with ``torch.erf(x) == 1`` for every float32 ``x >= t``
    near it (and, erf being odd in MKL as in ``tf_erff``, ``-1`` for ``x <= -t``)."""
    if not _measured:
        # The compile runs under AOTAutograd's fake tensor mode, which would turn the probe's
        # tensors into fake ones. torch's dispatch modes are thread-local: a fresh thread
        # computes with real tensors, through public API only.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            _measured.append(pool.submit(_measure).result())
    return _measured[0]


def _bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _measure() -> float:
    def erf_is_one(bits: torch.Tensor) -> torch.Tensor:
        # Each value 64 times: the vector body of whatever kernel eager runs, not a scalar tail.
        values = bits.to(torch.int32).repeat_interleave(64).view(torch.float32)
        return (torch.erf(values) == 1).view(-1, 64).all(dim=1)

    low, high = _bits(_LOW), _bits(_HIGH)
    if bool(erf_is_one(torch.tensor([low]))) or not bool(erf_is_one(torch.tensor([high]))):
        return CORRECTLY_ROUNDED_ONE
    while high - low > 1:  # erf(low) < 1 == erf(high)
        middle = (low + high) // 2
        if bool(erf_is_one(torch.tensor([middle]))):
            high = middle
        else:
            low = middle
    # Should eager's erf not be a clean step, take where its last run of ones starts nearby.
    window = torch.arange(high - _WINDOW, high + _WINDOW, dtype=torch.int32)
    ones = torch.erf(window.view(torch.float32)) == 1
    below = (~ones).nonzero()
    start = int(below[-1]) + 1 if below.numel() else 0
    start = min(start, ones.numel() - 1)
    return float(window[start : start + 1].view(torch.float32).item())
