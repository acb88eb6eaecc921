"""`torchfuse bench`: every case with every backend in one process, then the table and files.

For each case: build its workload once; per backend compile and run it once (cold compile time,
output checked against float64, or against eager where a float64 run would cost too much), count
kernels and peak memory; then time all backends round by round. Warm compile times come from a
second process at the end (see compile_time.py). A backend failing on a case is recorded and the
run goes on.
"""
from __future__ import annotations

import argparse
import math
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchfuse.bench import compile_time, measure
from torchfuse.bench.cases import Case, Workload, select

BACKENDS = ("eager", "inductor", "torchfuse")


@dataclass
class CaseResult:
    case: str
    suite: str
    note: str = ""
    ms: dict[str, float] = field(default_factory=dict)
    cold_s: dict[str, float] = field(default_factory=dict)
    warm_s: dict[str, float] = field(default_factory=dict)
    # Of the cold and warm seconds, the part inside the backend (AOTAutograd and after).
    backend_cold_s: dict[str, float] = field(default_factory=dict)
    backend_warm_s: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    peak_mb: dict[str, float] = field(default_factory=dict)
    rel_err: dict[str, float] = field(default_factory=dict)
    error_bound: float = math.nan
    error_against: str = "float64"  # or "eager" where no float64 reference is run
    bytes_moved: int = 0  # memory-bound cases: inputs + outputs, what a perfect kernel moves
    errors: dict[str, str] = field(default_factory=dict)
    skipped: str = ""

    def speedup(self, backend: str) -> float:
        return self.ms["eager"] / self.ms[backend] if {"eager", backend} <= self.ms.keys() else math.nan

    def bandwidth_fraction(self, backend: str, copy_gbs: float) -> float:
        if not self.bytes_moved or backend not in self.ms:
            return math.nan
        return self.bytes_moved / (self.ms[backend] * 1e-3) / 1e9 / copy_gbs

    def accurate(self, backend: str) -> bool:
        return self.rel_err.get(backend, math.inf) <= self.error_bound


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchfuse bench", description="eager vs Inductor vs torchfuse, side by side")
    p.add_argument("--suite", choices=["micro", "models", "all"], default="all")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, from eager,inductor,torchfuse")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all of the suite)")
    p.add_argument("--out", default="bench-out", help="directory for results.json/.md/.png (default: bench-out)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per case (default 30; --quick 3)")
    p.add_argument("--quick", action="store_true", help="tiny inputs and few repeats: a smoke test, not a benchmark")
    p.add_argument("--no-warm", action="store_true", help="skip the second process that times warm compiles")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on a CPU (default: torch's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torchfuse bench: --device cuda asked for, but CUDA is not available")
        return 2
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown or "eager" not in backends:
        print(f"torchfuse bench: backends must include eager and come from {', '.join(BACKENDS)}; got {args.backends}")
        return 2
    try:
        cases = select(args.suite, device, set(filter(None, args.cases.split(","))))
    except ValueError as error:
        print(f"torchfuse bench: {error}")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 30)
    warnings.filterwarnings("ignore", category=UserWarning)
    compile_time.use_fresh_caches()  # cold means cold; the warm process reuses these directories

    from torchfuse.bench import output

    env = output.environment(device)
    copy_gbs = measure.copy_bandwidth_gbs(device) if any(c.suite == "micro" for c in cases) else math.nan
    compile_time.warm_up_compilers(backends, device)
    results = run_cases(cases, backends, device, args.quick, repeats)
    if not args.no_warm:
        ran = [r.case for r in results if not r.skipped]
        warm = compile_time.measure_warm(ran, backends, device, args.quick)
        for result in results:
            measured = warm.get(result.case, {})
            result.warm_s.update(measured.get("seconds", {}))
            result.backend_warm_s.update(measured.get("backend_seconds", {}))
    out_dir = Path(args.out)
    output.write_all(results, env, copy_gbs, repeats, args.quick, out_dir)
    bad = [f"{r.case}/{b}" for r in results for b in backends if b in r.rel_err and not r.accurate(b)]
    if bad:
        print(f"outside the error bound: {', '.join(bad)}")
    return 1 if any(b.endswith("/torchfuse") for b in bad) else 0


def run_cases(cases: list[Case], backends: list[str], device: torch.device, quick: bool,
              repeats: int) -> list[CaseResult]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench", total=len(cases))
        for case in cases:
            progress.update(task, description=f"{case.name}")
            result = run_case(case, backends, device, quick, repeats, lambda what: progress.update(
                task, description=f"{case.name}: {what}"))
            console.print(_one_line(result))
            results.append(result)
            progress.advance(task)
    return results


def run_case(case: Case, backends: list[str], device: torch.device, quick: bool, repeats: int,
             status: Any = print) -> CaseResult:
    result = CaseResult(case.name, case.suite)
    missing = case.missing()
    if missing:
        result.skipped = f"needs {', '.join(missing)}"
        return result
    try:
        workload = case.build(device, quick)
    except Exception as exc:  # noqa: BLE001 - a case that cannot be built is reported, not fatal
        result.skipped = f"could not build: {type(exc).__name__}: {exc}"[:300]
        return result
    result.note = workload.note
    steps = _first_calls(workload, backends, device, result, status)
    status("timing")
    result.ms = measure.median_ms(steps, device, repeats)
    del steps
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _first_calls(workload: Workload, backends: list[str], device: torch.device, result: CaseResult,
                 status: Any) -> dict[str, measure.Step]:
    """Compile and run each backend once: cold compile time, accuracy, kernels, memory."""
    reference = None
    if workload.reference is not None:
        status("float64 reference")
        reference = workload.reference()
    else:
        result.error_against = "eager"
    steps = {}
    for backend in backends:
        status(f"compiling with {backend}")
        try:
            step, out, seconds, backend_seconds = compile_time.timed_first_call(
                lambda: workload.make_step(compile_time.compiler_for(backend)), device)
            if backend != "eager":
                result.cold_s[backend] = seconds
                result.backend_cold_s[backend] = backend_seconds
            if reference is None:  # eager is the reference; keep a copy, later steps may reuse memory
                reference = [t.detach().clone() for t in measure.flat_tensors(out)]
            result.rel_err[backend] = measure.relative_error(out, reference)
            if workload.memory_bound and backend == "eager":
                result.bytes_moved = measure.tensor_bytes(workload.inputs) + measure.tensor_bytes(out)
            del out
            result.kernels[backend] = measure.count_kernels(step, device)
            result.peak_mb[backend] = measure.peak_memory_mb(step, device)
            steps[backend] = step
        except Exception as exc:  # noqa: BLE001 - one backend failing must not lose the others
            traceback.print_exc()
            result.errors[backend] = f"{type(exc).__name__}: {exc}"[:500]
    eager_error = result.rel_err.get("eager") if result.error_against == "float64" else 0.0
    result.error_bound = measure.error_bound(eager_error, workload.dtype)
    if result.error_against == "eager":  # compiled vs eager in low precision: rounding differs per op
        result.error_bound = max(result.error_bound, 3e-2 if workload.dtype != torch.float32 else 1e-4)
    return steps


def _one_line(result: CaseResult) -> str:
    if result.skipped:
        return f"[yellow]{result.case}: skipped ({result.skipped})[/yellow]"
    parts = [f"{b} {ms:.3f} ms" for b, ms in result.ms.items()]
    failed = [f"[red]{b} failed[/red]" for b in result.errors]
    return f"{result.case}: " + ", ".join(parts + failed)
