"""``mode="max-autotune"``: time a few launch configs of each kernel at its first launch, keep the fastest.

A ``KernelTuner`` belongs to one ``launch.Launcher``. At the first launch of a specialization
(sizes, dtypes, alignment: the launcher's key) the launcher asks it for a ``Config``:

1. the candidates (``autotune_configs.candidate_configs``: the default and a few neighbours);
   a kernel too small to matter, or of a tiling the candidates do not know, keeps its default;
2. a choice stored on disk for this kernel, launch and machine (``autotune_cache``) is used
   as it is: a second process times nothing;
3. otherwise each candidate runs on the real arguments, timed (``cuda_timer``: CUDA events
   around batches of launches), and the fastest wins unless it beats the default by less than
   ``MARGIN`` (noise must not move a choice). Nothing is timed inside a CUDA graph capture
   (the default runs; the runner's warm-up call, which comes first, is where tuning happens)
   nor for CPU tensors, which run in Triton's interpreter (tests give ``timer_for`` a timer).

Timing must not change results. A kernel writes only the parameters it stores to (read from
its source: ``tl.store`` / ``tl.atomic_*``). A written tensor whose old value the kernel reads
(it is loaded too, or updated atomically) or that shares memory with another argument (a
mutated input written in place, ``scheduler/in_place.py``) is replaced by a scratch copy for
the timing runs, so an ``x.add_(1)`` is applied once, by the real launch that follows. Any
other output is written by the timing runs and then overwritten, element for element, by that
launch (every config stores the same elements). Scratch copies keep the original's offset
modulo 16 elements, hence its alignment, so the binaries compiled while timing are the ones
the real arguments' specialization needs (checked; if not, the kernel keeps its default).

Candidates are compiled ahead in the worker pool with the rest of the graph when the launch
was predicted (``configs_to_compile``, used by ``pipeline._compile_ahead``); with a choice on
disk only that config is compiled. Unpredicted launches (symbolic sizes) compile their
candidates through Triton's JIT while tuning.
"""
from __future__ import annotations

import functools
import hashlib
import math
import re
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.runtime import autotune_cache, kernel_cache
from torchfuse.runtime.autotune_configs import candidate_configs
from torchfuse.runtime.launch import Launcher, predicted_key, specialization
from torchfuse.runtime.launch_configs import Config
from torchfuse.runtime.predict import PredictedLaunch

MARGIN = 0.03  # a candidate must beat the default by 3% to be chosen: timings of equals differ by ~1%
Timer = Callable[[Callable[[], None], Config], float]  # (run once, the config it runs) -> seconds per run


@dataclass
class AutotuneStats:
    timed: int = 0  # launches whose candidates were timed
    candidates_timed: int = 0
    from_disk: int = 0  # launches whose choice a previous process stored
    untuned: int = 0  # launches that kept their default untimed (small, unknown tiling, capture)
    failed_candidates: int = 0  # candidates that did not compile or launch (skipped)
    seconds: float = 0.0  # time spent choosing: compiling candidates (or waiting for them) and timing
    timing_seconds: float = 0.0  # of which in the timing loops
    errors: list[str] = field(default_factory=list)  # the first few failed candidates, and why


stats = AutotuneStats()
_stats_lock = threading.Lock()


@dataclass(frozen=True)
class Choice:
    """What one tuned launch got, for the report (``GraphReport.autotune``)."""

    kernel: str
    xnumel: int
    rnumel: int
    config: Config
    default: Config
    how: str  # "timed", "from disk", or "default: <why it was not timed>"
    timings: tuple[tuple[Config, float], ...] = ()  # seconds per run of each candidate timed
    seconds: float = 0.0  # time spent choosing


@dataclass(frozen=True)
class Effects:
    """What a kernel writes, read from its source; positions are those of the launch arguments."""

    written: frozenset[int]  # parameters stored to
    read_back: frozenset[int]  # of which the old value matters: also loaded, or updated atomically


def effects_of(source: str) -> Effects:
    """The parameters ``source``'s kernel stores to, and which of them it also reads."""
    signature = re.search(r"def \w+\((.*?)\):", source, re.S)
    params = [p.split(":")[0].strip() for p in signature.group(1).split(",")] if signature else []
    position = {name: i for i, name in enumerate(params)}
    stored = {name for _, name in re.findall(r"tl\.(store|atomic_\w+)\(\s*(\w+)", source)}
    atomic = {name for name in re.findall(r"tl\.atomic_\w+\(\s*(\w+)", source)}
    loaded = set(re.findall(r"tl\.load\(\s*(\w+)", source))
    written = frozenset(position[n] for n in stored if n in position)
    read_back = frozenset(position[n] for n in stored & (loaded | atomic) if n in position)
    return Effects(written, read_back)


class KernelTuner:
    """Chooses the launch config of one kernel's specializations (``Launcher.tuner``).

    Args:
        name: the kernel's name in its graph (for the report).
        kernel: the rendered kernel (its source keys the choices; its kind and tiling name the
            candidates).
        on_choice: called with each ``Choice`` (the pipeline adds it to the graph's report).
    """

    def __init__(self, name: str, kernel: TritonKernel, on_choice: Callable[[Choice], None] | None = None) -> None:
        self.name = name
        self.kind, self.persistent, self.outer = kernel.kind, kernel.persistent, kernel.outer
        self.live_tiles, self.special_step = kernel.live_tiles, kernel.special_step
        self.chunk_lanes = kernel.chunk_lanes
        self.function = kernel.function
        self.module_digest = module_digest(kernel)
        self.effects = effects_of(kernel.source)
        self.on_choice = on_choice

    def choose(self, launcher: Launcher, key: tuple | None, xnumel: int, rnumel: int,
               args: tuple) -> tuple[Config, Callable[..., None] | None]:
        """The config for this launch and, when the launcher launches binaries directly and the
        choice was timed now, the direct launch of its binary (compiled while timing)."""
        started = time.perf_counter()
        default = launcher.config(xnumel, rnumel)
        candidates = candidate_configs(self.kind, self.persistent, self.outer, xnumel, rnumel, self.live_tiles,
                                       self.special_step, self.chunk_lanes)
        why = _why_untuned(candidates, default)
        if why:
            self._report(Choice(self.name, xnumel, rnumel, default, default, f"default: {why}"), "untuned", started)
            return default, None
        choice_key = self.choice_key(xnumel, rnumel, specialization(args), candidates, device_of(args))
        stored = autotune_cache.lookup(choice_key, candidates)
        if stored is not None:
            self._report(Choice(self.name, xnumel, rnumel, stored, default, "from disk"), "from_disk", started)
            return stored, None
        timer = timer_for(args)
        why = _why_not_timed(timer, args)
        timing_args = scratch_arguments(args, self.effects) if not why else args
        if not why and specialization(timing_args) != specialization(args):
            why = "scratch copies of its outputs would not have their alignment"
        if why:
            self._report(Choice(self.name, xnumel, rnumel, default, default, f"default: {why}"), "untuned", started)
            return default, None
        timings, launches = self._time_all(launcher, key, xnumel, rnumel, timing_args, candidates, timer)
        del timing_args
        chosen = pick(timings)
        autotune_cache.store(choice_key, chosen, timings)
        with _stats_lock:
            stats.candidates_timed += len(timings)
        self._report(Choice(self.name, xnumel, rnumel, chosen, default, "timed", tuple(timings)), "timed", started)
        return chosen, launches.get(chosen)

    def choice_key(self, xnumel: int, rnumel: int, spec: tuple, candidates: list[Config],
                   device: str) -> autotune_cache.ChoiceKey:
        return autotune_cache.ChoiceKey(self.module_digest, self.function, f"{xnumel},{rnumel}", repr(spec),
                                        repr(candidates), device, versions())

    def _time_all(self, launcher: Launcher, key: tuple | None, xnumel: int, rnumel: int, args: list,
                  candidates: list[Config], timer: Timer) -> tuple[list[tuple[Config, float]], dict[Config, Any]]:
        """Seconds per run of each candidate that compiles and launches (the default must)."""
        timings: list[tuple[Config, float]] = []
        launches: dict[Config, Any] = {}
        for config in candidates:
            try:
                launches[config], run = _runner(launcher, key, config, xnumel, rnumel, args)
                timing_started = time.perf_counter()
                timings.append((config, timer(run, config)))
                with _stats_lock:
                    stats.timing_seconds += time.perf_counter() - timing_started
            except Exception as error:  # noqa: BLE001 - e.g. too much shared memory: that candidate is out
                if config == candidates[0]:
                    raise  # the default is what runs without autotuning: its failure is real
                with _stats_lock:
                    stats.failed_candidates += 1
                    if len(stats.errors) < 10:
                        stats.errors.append(f"{self.name} {describe(config)}: {type(error).__name__}: {error}"[:300])
        return timings, launches

    def _report(self, choice: Choice, counter: str, started: float) -> None:
        seconds = time.perf_counter() - started
        with _stats_lock:
            setattr(stats, counter, getattr(stats, counter) + 1)
            stats.seconds += seconds
        if self.on_choice is not None:
            self.on_choice(replace(choice, seconds=seconds))


def pick(timings: list[tuple[Config, float]]) -> Config:
    """The fastest config; the default (first) unless another is faster by more than MARGIN."""
    default, default_seconds = timings[0]
    fastest, seconds = min(timings, key=lambda timing: timing[1])
    return fastest if seconds < default_seconds * (1 - MARGIN) else default


def _why_untuned(candidates: list[Config], default: Config) -> str | None:
    if not candidates or candidates[0] != default:
        return "its launcher's default is not one the candidates are built around (another tiling)"
    if len(candidates) == 1:
        return "too small to matter (the launch costs more than the tile shape)"
    return None


def _why_not_timed(timer: Timer | None, args: tuple) -> str | None:
    if _capturing(args):  # checked first: not even a scratch copy may be made (it would be recorded)
        return "first launched inside a CUDA graph capture, where nothing may be timed"
    if timer is None:
        return "no timer for CPU tensors (Triton's interpreter: its speed says nothing of a GPU's)"
    return None


def _capturing(args: tuple) -> bool:
    cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    return cuda and torch.cuda.is_current_stream_capturing()


def _runner(launcher: Launcher, key: tuple | None, config: Config, xnumel: int, rnumel: int,
            args: list) -> tuple[Callable[..., None] | None, Callable[[], None]]:
    """Compile ``config`` (or load it, compiled ahead) and run it once on ``args``; returns its
    direct launch (None through Triton's interpreter) and a function running it again."""
    if key is None:  # no direct launches (the interpreter): every run goes through Triton
        launcher.launch_through_triton(config, xnumel, rnumel, args, binary=False)
        return None, lambda: launcher.launch_through_triton(config, xnumel, rnumel, args, binary=False)
    stream = launcher.current_stream(key[0])
    launch = launcher.ahead_launch(key, config)
    if launch is None:
        launch = launcher.launch_through_triton(config, xnumel, rnumel, args, binary=True)
    else:
        launch(stream, *args)
    if launch is None:
        raise RuntimeError("Triton returned no binary to launch directly")
    return launch, lambda: launch(stream, *args)


# -- side effects -------------------------------------------------------------------------------
def scratch_arguments(args: tuple, effects: Effects) -> list:
    """``args`` with each written tensor whose old value matters, or that shares memory with
    another argument, replaced by a copy the timing runs may overwrite at will."""
    out = list(args)
    for i in sorted(effects.written):
        value = args[i] if i < len(args) else None
        if isinstance(value, torch.Tensor) and (i in effects.read_back or _shares_memory(value, args, i)):
            out[i] = scratch_copy(value)
    return out


def _shares_memory(tensor: torch.Tensor, args: tuple, position: int) -> bool:
    storage = tensor.untyped_storage().data_ptr()
    return any(isinstance(other, torch.Tensor) and other.untyped_storage().data_ptr() == storage
               for i, other in enumerate(args) if i != position)


def scratch_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with ``tensor``'s sizes and strides at the same storage offset modulo 16 elements:
    fresh allocations are aligned, so the copy's address is 16-byte aligned exactly when the
    original's is (what Triton specializes pointers on)."""
    offset = tensor.storage_offset() % 16
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0
    base = torch.empty(offset + span, dtype=tensor.dtype, device=tensor.device)
    return base.as_strided(tensor.shape, tensor.stride(), offset).copy_(tensor)


# -- timing -------------------------------------------------------------------------------------
ROUND_MS = 1.0  # GPU: launches per timed batch so that a batch takes about this long
MIN_REPS, MAX_REPS, ROUNDS = 3, 200, 3
HOST_REPEATS = 2


def timer_for(args: tuple) -> Timer | None:
    """CUDA events for GPU tensors; None for CPU tensors, whose kernels run in Triton's
    interpreter (tests replace this function to drive the tuner there, ``host_timer`` or fake)."""
    if any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args):
        return cuda_timer
    return None


def cuda_timer(run: Callable[[], None], config: Config) -> float:
    """Seconds per run: the best of ``ROUNDS`` batches, each timed with CUDA events around enough
    back-to-back launches for about ``ROUND_MS`` (so a short kernel is not lost in event noise)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    reps = min(MAX_REPS, max(MIN_REPS, int(ROUND_MS / once_ms)))
    best = math.inf
    for _ in range(ROUNDS):
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best / 1e3


def host_timer(run: Callable[[], None], config: Config) -> float:
    """Seconds per run by the host clock (for tests through Triton's interpreter)."""
    run()  # warm-up (the interpreter rewrites the kernel's AST on its first run)
    best = math.inf
    for _ in range(HOST_REPEATS):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def describe(config: Config) -> str:
    """A config as people read it: "XBLOCK 8, RBLOCK 512, 8 warps" (and the stages when set)."""
    blocks = ", ".join(f"{name} {value}" for name, value in config.blocks().items())
    stages = f", {config.num_stages} stages" if config.num_stages is not None else ""
    return f"{blocks}, {config.num_warps} warps{stages}"


# -- keys ---------------------------------------------------------------------------------------
def module_digest(kernel: TritonKernel) -> str:
    return hashlib.sha256(kernel_cache.module_source(kernel.source).encode()).hexdigest()


def device_of(args: tuple) -> str:
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    return device_identity(device.type, device.index)


@functools.lru_cache(maxsize=None)
def device_identity(device_type: str, index: int | None) -> str:
    """The machine a timing holds for: the GPU's name, compute capability and SM count."""
    if device_type != "cuda":
        return f"{device_type} (Triton's interpreter)"
    properties = torch.cuda.get_device_properties(index)
    return f"{properties.name}:{properties.major}.{properties.minor}:{properties.multi_processor_count} SMs"


def versions() -> str:
    """Triton's and torch's versions (Triton is imported by then: the kernel was loaded with it)."""
    return f"triton {getattr(sys.modules.get('triton'), '__version__', 'none')}, torch {torch.__version__}"


# -- compiling ahead ----------------------------------------------------------------------------
def configs_to_compile(kernels: dict[str, TritonKernel], predictions: dict[str, Any],
                       defaults: Callable[[TritonKernel, PredictedLaunch], Config]) -> dict[str, list[Config]]:
    """Per predicted GPU kernel, the configs its tuner will want: the choice stored on disk for
    this launch and GPU if there is one, else every candidate. Kernels with one candidate (or a
    tiling the candidates do not know: ``defaults`` gives the launcher's default) are left out:
    they compile their default as in the default mode."""
    wanted: dict[str, list[Config]] = {}
    for name, launch in predictions.items():
        kernel = kernels.get(name)
        if not isinstance(launch, PredictedLaunch) or kernel is None:
            continue
        candidates = candidate_configs(kernel.kind, kernel.persistent, kernel.outer, launch.xnumel, launch.rnumel,
                                       kernel.live_tiles, kernel.special_step, kernel.chunk_lanes)
        if len(candidates) <= 1 or candidates[0] != defaults(kernel, launch):
            continue
        spec = predicted_key(launch.xnumel, launch.rnumel, launch.args)[2:]
        key = KernelTuner(name, kernel).choice_key(launch.xnumel, launch.rnumel, spec, candidates,
                                                   device_identity("cuda", torch.cuda.current_device()))
        stored = autotune_cache.lookup(key, candidates, count=False)
        wanted[name] = [stored] if stored is not None else candidates
    return wanted
