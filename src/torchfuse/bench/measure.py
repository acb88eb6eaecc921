"""Measurements: time per call, kernels launched, peak memory, bandwidth, error against float64.

Times are medians. On a GPU each sample is bracketed by CUDA events (GPU time, not launch time);
on a CPU perf_counter is the clock. Backends take turns within each round, so a slow phase of the
machine (another process, a frequency drop) hurts all of them alike.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

Step = Callable[[], Any]

SAMPLE_SECONDS = 0.02  # calls are batched so that one timing sample lasts about this long


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds_once(step: Step, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def calls_per_sample(step: Step, device: torch.device, warmup: int = 3) -> int:
    """Warm the step up and pick how many calls one sample batches (1 to 200)."""
    once = [_seconds_once(step, device) for _ in range(warmup)]
    return max(1, min(200, int(SAMPLE_SECONDS / max(statistics.median(once), 1e-6))))


def _sample_ms(step: Step, device: torch.device, calls: int) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    began = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - began) * 1e3 / calls


def median_ms(steps: dict[str, Step], device: torch.device, repeats: int) -> dict[str, float]:
    """Median milliseconds per call of every step, backends interleaved round by round."""
    calls = {name: calls_per_sample(step, device) for name, step in steps.items()}
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            samples[name].append(_sample_ms(step, device, calls[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


def count_kernels(step: Step, device: torch.device) -> int | None:
    """GPU kernels one call launches (copies and memsets are not kernels); None on a CPU."""
    if device.type != "cuda":
        return None
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")))


def peak_memory_mb(step: Step, device: torch.device) -> float | None:
    """Memory one call allocates at its peak beyond what was live before it (GPU only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = step()
    torch.cuda.synchronize(device)
    del out
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def copy_bandwidth_gbs(device: torch.device, repeats: int = 20) -> float:
    """A device-to-device copy's bandwidth (bytes read + written per second): the practical ceiling."""
    nbytes = (1 << 30) if device.type == "cuda" else (128 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = median_ms({"copy": lambda: dst.copy_(src)}, device, repeats)["copy"]
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) value: a lower bound on what a kernel must move."""
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


def flat_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flat_tensors(item)]
    return []


def relative_error(out: Any, ref: Any) -> float:
    """Worst ||out - ref|| / ||ref|| over the outputs, in float64; inf when an output is not finite."""
    worst = 0.0
    for got, want in zip(flat_tensors(out), flat_tensors(ref), strict=True):
        got64, want64 = got.detach().double(), want.detach().double()
        if got64.shape != want64.shape or not torch.isfinite(got64).all():
            return math.inf
        worst = max(worst, ((got64 - want64).norm() / want64.norm().clamp_min(1e-300)).item())
    return worst


def error_bound(eager_error: float | None, dtype: torch.dtype) -> float:
    """Accepted error for a compiled backend: twice eager's own, or the dtype's rounding noise."""
    noise = {torch.bfloat16: 5e-3, torch.float16: 1e-3}.get(dtype, 1e-5)
    return max(2 * eager_error, noise) if eager_error is not None else noise
