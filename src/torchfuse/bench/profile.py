"""Where a GPU step's time goes: wall time against summed kernel time, launches, host cost per launch.

A step is *host-bound* when its wall time is well above the GPU time of its kernels: the GPU
idles while Python prepares launches. ``profile_step`` measures both in one place so a change to
the launch path or to the kernels can be judged on whole models:

- wall ms: median over steps of host clock from start to the GPU finishing (synchronized);
- GPU ms: summed duration of the step's GPU kernels (profiler), per step;
- host ms: time until the step's Python returns, before waiting for the GPU: the work of
  issuing the step, divided by its launches for the host cost per launch;
- the kernels taking the most GPU time, with their calls per step.
"""
from __future__ import annotations

import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

Step = Callable[[], Any]


@dataclass
class KernelTime:
    name: str
    ms: float  # GPU time per step, all calls together
    calls: float  # calls per step


@dataclass
class StepProfile:
    wall_ms: float
    gpu_ms: float
    host_ms: float
    launches: float  # GPU kernels per step (copies and memsets not counted)
    top: list[KernelTime] = field(default_factory=list)

    @property
    def host_us_per_launch(self) -> float:
        return 1e3 * self.host_ms / self.launches if self.launches else float("nan")

    @property
    def wall_over_gpu(self) -> float:
        return self.wall_ms / self.gpu_ms if self.gpu_ms else float("nan")


def profile_step(step: Step, steps: int = 10, top: int = 8) -> StepProfile:
    """Profile a warmed-up GPU ``step`` (call it a few times first, so nothing compiles here)."""
    return profile_steps({"step": step}, steps, top)["step"]


def profile_steps(steps: dict[str, Step], rounds: int = 10, top: int = 8) -> dict[str, StepProfile]:
    """Profile warmed-up GPU steps (one per backend) side by side: the wall and host clocks of
    each round time every step once, in turn, so a slow spell of the machine (the H200 box's
    host speed moved ~1.8x between and within calls) falls on all of them alike; then the
    kernels of each step under the profiler."""
    wall: dict[str, list[float]] = {name: [] for name in steps}
    host: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            issued = time.perf_counter()
            torch.cuda.synchronize()
            wall[name].append(time.perf_counter() - start)
            host[name].append(issued - start)
    profiles = {}
    for name, step in steps.items():
        totals = sorted(_kernel_times(step, rounds).values(), key=lambda k: -k.ms)
        profiles[name] = StepProfile(1e3 * statistics.median(wall[name]), sum(k.ms for k in totals),
                                     1e3 * statistics.median(host[name]), sum(k.calls for k in totals), totals[:top])
    return profiles


def _kernel_times(step: Step, steps: int) -> dict[str, KernelTime]:
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ms: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or event.name.startswith(("Memcpy", "Memset")):
            continue
        ms[event.name] += event.device_time / 1e3  # microseconds -> ms
        calls[event.name] += 1
    return {name: KernelTime(_short(name), ms[name] / steps, calls[name] / steps) for name in ms}


def _short(name: str) -> str:
    return name if len(name) <= 70 else name[:67] + "..."


def format_profiles(rows: list[tuple[str, str, StepProfile]]) -> str:
    """A plain table: case, backend, wall, GPU, wall/GPU, launches, host us per launch."""
    lines = [f"{'case':<22} {'backend':<10} {'wall ms':>8} {'GPU ms':>8} {'wall/GPU':>8} "
             f"{'launches':>8} {'host ms':>8} {'us/launch':>9}"]
    for case, backend, p in rows:
        lines.append(f"{case:<22} {backend:<10} {p.wall_ms:8.3f} {p.gpu_ms:8.3f} {p.wall_over_gpu:8.2f} "
                     f"{p.launches:8.0f} {p.host_ms:8.3f} {p.host_us_per_launch:9.1f}")
    return "\n".join(lines)
