"""Compile times: cold (this process, empty disk caches) and warm (a later process, disk caches full).

Both are the wall time of a backend's first call: Dynamo, AOTAutograd, the backend's lowering and
code generation, its compiler (Triton, g++), loading, and the call itself. Beside it, the part
spent inside the backend (Dynamo's ``OutputGraph.call_user_compiler`` timer: AOTAutograd and
everything after it), which is what a backend controls. Before either is measured every backend
compiles a tiny unrelated function, so imports and device start-up are not charged to the first
case, and each case runs once eagerly, so the model's own first-call costs (e.g. oneDNN's set-up)
are not charged to a backend. A full garbage collection runs before each timed call: otherwise
the one that earlier cases' allocations have made due lands in whichever case comes next
(measured: 0.12-0.14 s inside the convnet's warm first call). The collections that still run
during the call (Dynamo's tracing allocates a lot) are timed too, as "gc" in the split: on a CPU
they were a quarter of a small transformer's warm first call, for every backend alike.

Warm runs are this module as a script, one fresh interpreter per backend with the same cache
directories, so that no backend's first call profits from Dynamo work another one did:

    python -m torchfuse.bench.compile_time --device cuda --backends torchfuse --cases a,b

"dynamo" is a pseudo-backend: ``torch.compile(fn, backend="eager")``, Dynamo's capture alone, the
floor under every backend's warm time.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch._dynamo.utils import compilation_time_metrics

import torchfuse
from torchfuse.bench.measure import sync
from torchfuse.diagnostics.compile_times import snapshot
from torchfuse.bench.suites import select
from torchfuse.frontend import aot_cache

CACHE_VARIABLES = ("TORCHFUSE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def use_fresh_caches() -> str:
    """Point every compiler's disk cache at a new empty directory (children inherit it), removed
    when this process exits (the children, warm-compile runs, end before it)."""
    root = tempfile.mkdtemp(prefix="torchfuse-bench-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for variable in CACHE_VARIABLES:
        os.environ[variable] = os.path.join(root, variable.split("_")[0].lower())
    return root


def compiler_for(backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    if backend == "eager":
        return lambda fn: fn
    if backend == "inductor":
        return lambda fn: torch.compile(fn)  # default mode, as users call it
    if backend == "torchfuse":
        return lambda fn: torchfuse.compile(fn)
    if backend == "inductor-ro":
        return lambda fn: torch.compile(fn, mode="reduce-overhead")
    if backend == "torchfuse-ro":
        return lambda fn: torchfuse.compile(fn, mode="reduce-overhead")
    if backend == "inductor-max-autotune":
        return lambda fn: torch.compile(fn, mode="max-autotune")
    if backend == "torchfuse-max-autotune":
        return lambda fn: torchfuse.compile(fn, mode="max-autotune")
    if backend == "dynamo":
        return lambda fn: torch.compile(fn, backend="eager")
    raise ValueError(f"unknown backend {backend!r}; choose from eager, inductor, torchfuse, inductor-ro, "
                     "torchfuse-ro, inductor-max-autotune, torchfuse-max-autotune, dynamo")


def warm_up_compilers(backends: list[str], device: torch.device) -> None:
    """Compile and run a tiny function with each backend, forward and backward: imports, device
    start-up and AOTAutograd's first training graph are paid once, not by the first case."""
    x = torch.randn(8, 8, device=device)
    w = torch.randn(8, device=device, requires_grad=True)
    for backend in backends:
        if backend != "eager":
            compiler_for(backend)(lambda t: (t.sin() + 1).sum(-1))(x)
            compiler_for(backend)(lambda t, v: (t * v).tanh().sum())(x, w).backward()
    torch._dynamo.reset()


class FirstCall(NamedTuple):
    step: Callable[[], Any]
    out: Any
    seconds: float  # wall time of the first call, compile included
    backend_seconds: float  # of which inside the backend (nan when Dynamo's timer is missing)
    # torchfuse's split of it (diagnostics/compile_times.py: capture, aot, ours, cpp, gpu_wait, ...,
    # aot_hits / aot_misses of the warm cache) and "gc": garbage collections during the call
    split: dict[str, float]


BACKEND_TIMER = "OutputGraph.call_user_compiler"  # Dynamo's timer around every backend call


def timed_first_call(make: Callable[[], Callable[[], Any]], device: torch.device) -> FirstCall:
    """``make`` builds the compiled step, which then runs once, timed."""
    gc.collect()
    backend_calls = len(compilation_time_metrics.get(BACKEND_TIMER, []))
    before = snapshot(torchfuse.report().graphs)
    sync(device)
    with _collections_timed() as collections:
        start = time.perf_counter()
        step = make()
        out = step()
        sync(device)
        seconds = time.perf_counter() - start
    timer = compilation_time_metrics.get(BACKEND_TIMER)
    backend_seconds = sum(timer[backend_calls:]) if timer is not None else float("nan")
    split = snapshot(torchfuse.report().graphs).minus(before).as_dict()
    split["gc"] = collections[0]
    return FirstCall(step, out, seconds, backend_seconds, split)


@contextlib.contextmanager
def _collections_timed() -> Iterator[list[float]]:
    """Seconds the garbage collector runs inside the block (``[seconds]``, filled at its end)."""
    spent, started = [0.0], [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]

    gc.callbacks.append(callback)
    try:
        yield spent
    finally:
        gc.callbacks.remove(callback)


def measure_warm(case_names: list[str], backends: list[str], device: torch.device,
                 quick: bool) -> dict[str, dict[str, dict[str, float]]]:
    """Warm compile seconds per case, as ``{case: {"seconds": {backend: s}, "backend_seconds":
    {backend: s}, "split": {"torchfuse...": {part: s}}, "warm_cache": {"torchfuse": why}}}`` (plus
    "dynamo", the floor, in "seconds"), each backend in its own process; a backend whose process
    fails is left out (it says why). "warm_cache" says why captured graphs were traced again."""
    compiled = [b for b in backends if b != "eager"]
    if not compiled or not case_names:
        return {}
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    for backend in [*compiled, "dynamo"]:
        cmd = [sys.executable, "-m", "torchfuse.bench.compile_time", "--device", device.type,
               "--backends", backend, "--cases", ",".join(case_names)] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            print(f"warm-compile process for {backend} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}",
                  file=sys.stderr)
            continue
        for case, measured in json.loads(lines[-1]).items():
            for key, by_backend in measured.items():
                seconds.setdefault(case, {}).setdefault(key, {}).update(by_backend)
    return seconds


def _child_env() -> dict[str, str]:
    """The child finds torchfuse where this process did, installed or not."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(torchfuse.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))


def _warm_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="time first calls against the disk caches a cold run filled")
    parser.add_argument("--device", required=True)
    parser.add_argument("--backends", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    backends = args.backends.split(",")
    warm_up_compilers(backends, device)
    seconds: dict[str, dict[str, dict[str, float]]] = {}
    for case in select("all", device, set(args.cases.split(","))):
        workload = case.build(device, args.quick)
        workload.make_step(compiler_for("eager"))()  # the model's own first-call costs
        sync(device)
        for backend in backends:
            reasons = _warm_cache_reasons()
            first = timed_first_call(lambda: workload.make_step(compiler_for(backend)), device)
            measured = seconds.setdefault(case.name, {"seconds": {}, "backend_seconds": {}, "split": {},
                                                      "warm_cache": {}})
            measured["seconds"][backend] = first.seconds
            if backend != "dynamo":
                measured["backend_seconds"][backend] = first.backend_seconds
            if backend.startswith("torchfuse"):
                measured["split"][backend] = first.split
                measured["warm_cache"][backend] = "; ".join(
                    f"{reason} ({n})" for reason, n in (_warm_cache_reasons() - reasons).items())
            del first
        torch._dynamo.reset()
    print(json.dumps(seconds), flush=True)
    return 0


def _warm_cache_reasons() -> Counter:
    """Why the warm cache traced, stored or loaded nothing, so far in this process."""
    stats = aot_cache.stats
    return (Counter({f"not cached: {k}": v for k, v in stats.not_cached.items()})
            + Counter({f"not stored: {k}": v for k, v in stats.not_stored.items()})
            + Counter({f"not loaded: {k}": v for k, v in stats.not_loaded.items()}))


if __name__ == "__main__":
    raise SystemExit(_warm_main())
