"""`torchfuse bench`: every case with every backend in one process, then the table and files.

For each case: build its workload once; per backend compile and run it once (cold compile time,
output checked against float64, or against eager where a float64 run would cost too much), count
kernels and peak memory; then time all backends round by round. Warm compile times come from a
second process at the end (see compile_time.py). A backend failing on a case is recorded and the
run goes on. Nothing fails quietly: a case that cannot be built, a backend that raises, an output
outside its error bound and a graph torchfuse ran with ATen because it could not compile it are
each shown in the table and listed under it, and make the exit status 1 (where torchfuse or the
case itself is at fault). A case whose library is not installed is listed as skipped, with why.
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

import torchfuse
from torchfuse.bench import bandwidth, compile_time, measure, output, profile
from torchfuse.diagnostics.compile_times import compile_events
from torchfuse.bench.cases import Case, Workload
from torchfuse.bench.suites import select

BACKENDS = ("eager", "inductor", "torchfuse", "inductor-ro", "torchfuse-ro", "inductor-max-autotune",
            "torchfuse-max-autotune")
# mode="reduce-overhead" and "max-autotune" (both compilers record CUDA graphs in it): the first
# call runs without CUDA graphs (warm-up; autotuning happens there), the second records and the
# third replays; the output checked is the third's.
CUDA_GRAPH_BACKENDS = ("inductor-ro", "torchfuse-ro", "inductor-max-autotune", "torchfuse-max-autotune")
CALLS_UNTIL_REPLAYED = 3
CASE_STAGES = ("build", "reference", "timing")  # keys of CaseResult.errors that are not backends


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
    # torchfuse's first calls split (diagnostics/compile_times.CompileTimes.as_dict)
    tf_split_cold: dict[str, float] = field(default_factory=dict)
    tf_split_warm: dict[str, float] = field(default_factory=dict)
    # the same for torchfuse in max-autotune (its "autotune" seconds and launches "autotuned")
    tf_autotune_split_cold: dict[str, float] = field(default_factory=dict)
    tf_autotune_split_warm: dict[str, float] = field(default_factory=dict)
    tf_warm_cache: str = ""  # why torchfuse's warm process traced captured graphs again, if it did
    tf_compiles_while_timed: int = 0  # compiles torchfuse started during timed steps: must be 0
    kernels: dict[str, int] = field(default_factory=dict)
    peak_mb: dict[str, float] = field(default_factory=dict)
    rel_err: dict[str, float] = field(default_factory=dict)
    error_bound: float = math.nan
    error_against: str = "float64"  # or "eager" where no float64 reference is run
    bytes_moved: int = 0  # memory-bound cases: inputs + outputs, what a perfect kernel moves
    # Worst, over the outputs (a training step: the loss and each gradient), of a backend's error
    # on that output divided by its bound; above 1 is a mismatch.
    error_ratio: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # backend or CASE_STAGES name -> exception
    skipped: str = ""
    tf_graphs: int = 0  # graphs torchfuse compiled for this case (forward, backward, per graph break)
    tf_fallbacks: list[str] = field(default_factory=list)  # graphs torchfuse ran with ATen, and why
    # --profile on a GPU: backend -> bench.profile.StepProfile (wall vs GPU time, launches)
    profiles: dict[str, profile.StepProfile] = field(default_factory=dict)
    # --profile: torchfuse backend -> its generated kernels' bandwidth (bench/bandwidth.py)
    bandwidths: dict[str, list[bandwidth.KernelBandwidth]] = field(default_factory=dict)

    def speedup(self, backend: str) -> float:
        return self.ms["eager"] / self.ms[backend] if {"eager", backend} <= self.ms.keys() else math.nan

    def bandwidth_fraction(self, backend: str, copy_gbs: float) -> float:
        if not self.bytes_moved or backend not in self.ms:
            return math.nan
        return self.bytes_moved / (self.ms[backend] * 1e-3) / 1e9 / copy_gbs

    def accurate(self, backend: str) -> bool:
        if backend in self.error_ratio:
            return self.error_ratio[backend] <= 1.0
        return self.rel_err.get(backend, math.inf) <= self.error_bound

    def problems(self, backend: str = "torchfuse") -> list[str]:
        """What went wrong for ``backend`` (or for the case itself) in this case, for people."""
        found = [f"{what}: {self.errors[what]}" for what in CASE_STAGES if what in self.errors]
        if backend in self.errors:
            found.append(f"{backend} failed: {self.errors[backend]}")
        if backend in self.rel_err and not self.accurate(backend):
            found.append(f"{backend} is outside its error bound ({self.error_ratio.get(backend, math.nan):.2f}x "
                         f"the bound; worst relative error {self.rel_err[backend]:.1e})")
        if backend in self.ms and backend not in self.rel_err:
            found.append(f"{backend}'s output was not checked: there is no reference (eager failed)")
        if backend == "torchfuse" and self.tf_fallbacks:
            found.append(f"torchfuse ran {len(self.tf_fallbacks)} of {self.tf_graphs} graphs with ATen: "
                         + "; ".join(self.tf_fallbacks))
        if backend == "torchfuse" and self.tf_split_warm.get("gpu_compiled"):
            found.append(f"torchfuse's warm process compiled {self.tf_split_warm['gpu_compiled']:.0f} GPU kernel(s): "
                         "the binary cache missed")
        if backend == "torchfuse" and self.tf_autotune_split_warm.get("autotuned"):
            found.append(f"torchfuse's warm max-autotune process timed {self.tf_autotune_split_warm['autotuned']:.0f} "
                         "launch(es) again: the autotune cache missed")
        if backend == "torchfuse" and (self.tf_split_warm.get("aot_misses") or self.tf_warm_cache):
            found.append(f"torchfuse's warm process traced captured graphs with AOTAutograd again "
                         f"({self.tf_split_warm.get('aot_misses', 0):.0f} warm-cache misses"
                         f"{'; ' + self.tf_warm_cache if self.tf_warm_cache else ''})")
        if backend == "torchfuse" and self.tf_compiles_while_timed:
            found.append(f"torchfuse compiled {self.tf_compiles_while_timed} kernel(s) during timed steps, "
                         "after the first call")
        return found


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchfuse bench", description="eager vs Inductor vs torchfuse, side by side")
    p.add_argument("--suite", choices=["micro", "models", "all"], default="all")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--backends", default=",".join(BACKENDS[:3]),
                   help="comma-separated, from " + ",".join(BACKENDS) + " (-ro: mode='reduce-overhead', CUDA graphs; "
                        "-max-autotune: mode='max-autotune', autotuning and CUDA graphs)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all of the suite)")
    p.add_argument("--out", default="bench-out", help="directory for results.json/.md/.png (default: bench-out)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per case (default 30; --quick 3)")
    p.add_argument("--quick", action="store_true", help="tiny inputs and few repeats: a smoke test, not a benchmark")
    p.add_argument("--no-warm", action="store_true", help="skip the second process that times warm compiles")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on a CPU (default: torch's)")
    p.add_argument("--profile", action="store_true",
                   help="GPU: per backend, wall vs summed kernel time per step, launches, host us per launch, top kernels")
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

    env = output.environment(device)
    profiled = args.profile and device.type == "cuda"
    copy_gbs = measure.copy_bandwidth_gbs(device) if profiled or any(c.suite == "micro" for c in cases) else math.nan
    compile_time.warm_up_compilers(backends, device)
    results = run_cases(cases, backends, device, args.quick, repeats, profiled, copy_gbs)
    if not args.no_warm:
        ran = [r.case for r in results if not r.skipped and not r.errors]  # a failing case would end the child
        warm = compile_time.measure_warm(ran, backends, device, args.quick)
        for result in results:
            measured = warm.get(result.case, {})
            result.warm_s.update(measured.get("seconds", {}))
            result.backend_warm_s.update(measured.get("backend_seconds", {}))
            result.tf_split_warm = measured.get("split", {}).get("torchfuse", {})
            result.tf_autotune_split_warm = measured.get("split", {}).get("torchfuse-max-autotune", {})
            result.tf_warm_cache = measured.get("warm_cache", {}).get("torchfuse", "")
    out_dir = Path(args.out)
    output.write_all(results, env, copy_gbs, repeats, args.quick, out_dir)
    bad = [f"{r.case}/{b}" for r in results for b in backends if b in r.rel_err and not r.accurate(b)]
    if bad:
        print(f"outside the error bound: {', '.join(bad)}")
    # Exit 1 when torchfuse failed, mismatched or fell back on a case, or a case could not be built.
    return 1 if any(r.problems("torchfuse") for r in results) else 0


def run_cases(cases: list[Case], backends: list[str], device: torch.device, quick: bool,
              repeats: int, profiled: bool = False, copy_gbs: float = math.nan) -> list[CaseResult]:
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
                task, description=f"{case.name}: {what}"), profiled, copy_gbs)
            console.print(_one_line(result))
            results.append(result)
            progress.advance(task)
    return results


def run_case(case: Case, backends: list[str], device: torch.device, quick: bool, repeats: int,
             status: Any = print, profiled: bool = False, copy_gbs: float = math.nan) -> CaseResult:
    result = CaseResult(case.name, case.suite)
    missing = case.missing()
    if missing:
        result.skipped = f"needs {', '.join(missing)}"
        return result
    try:
        workload = case.build(device, quick)
    except Exception as exc:  # noqa: BLE001 - a case that cannot be built is reported, not fatal
        traceback.print_exc()
        result.errors["build"] = f"{type(exc).__name__}: {exc}"[:500]
        return result
    result.note = workload.note
    graphs_before = _torchfuse_graph_count() if _runs_torchfuse(backends) else 0
    steps = _first_calls(workload, backends, device, result, status)
    status("timing")
    compiles_before = compile_events()
    try:
        result.ms = measure.median_ms(steps, device, repeats)
    except Exception as exc:  # noqa: BLE001 - a step that ran once and then fails loses the timing only
        traceback.print_exc()
        result.errors["timing"] = f"{type(exc).__name__}: {exc}"[:500]
    # Every kernel must be compiled by the end of the first call: none while timing (with the
    # warm-up rounds; other backends compile nothing of ours).
    result.tf_compiles_while_timed = compile_events() - compiles_before
    if profiled and "timing" not in result.errors:
        status("profiling")
        result.profiles = profile.profile_steps(steps, top=400)
        sizes = bandwidth.generated_kernel_bytes(torchfuse.report().graphs[graphs_before:])
        result.bandwidths = {backend: bandwidth.kernel_bandwidths(p.top, sizes, copy_gbs)
                             for backend, p in result.profiles.items() if backend.startswith("torchfuse")}
    del steps
    if _runs_torchfuse(backends):  # after timing too: a recompile while timing counts
        _record_torchfuse_graphs(result, graphs_before)
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
        try:
            reference = workload.reference()
        except Exception as exc:  # noqa: BLE001 - judge against eager instead, and say so
            traceback.print_exc()
            why = f"{type(exc).__name__}: {exc}"
            result.errors["reference"] = f"float64 reference failed, checked against eager: {why}"[:500]
    if reference is None:
        result.error_against = "eager"
    steps = {}
    errors: dict[str, list[float]] = {}  # backend -> relative error of each output
    for backend in backends:
        status(f"compiling with {backend}")
        try:
            step, out, seconds, backend_seconds, split = compile_time.timed_first_call(
                lambda: workload.make_step(compile_time.compiler_for(backend)), device)
            if backend in CUDA_GRAPH_BACKENDS:
                for _ in range(CALLS_UNTIL_REPLAYED - 1):
                    del out
                    out = step()
            if backend != "eager":
                result.cold_s[backend] = seconds
                result.backend_cold_s[backend] = backend_seconds
            if backend == "torchfuse":
                result.tf_split_cold = split
            if backend == "torchfuse-max-autotune":
                result.tf_autotune_split_cold = split
            if reference is None and backend == "eager":  # keep a copy, later steps may reuse memory
                reference = [t.detach().clone() for t in measure.flat_tensors(out)]
            if reference is not None:  # without it (eager failed) nothing is checked: the row says so
                errors[backend] = output_errors(out, reference)
                result.rel_err[backend] = max(errors[backend], default=0.0)
            if workload.memory_bound and backend == "eager":
                result.bytes_moved = measure.tensor_bytes(workload.inputs) + measure.tensor_bytes(out)
            del out
            result.kernels[backend] = measure.count_kernels(step, device)
            result.peak_mb[backend] = measure.peak_memory_mb(step, device)
            steps[backend] = step
        except Exception as exc:  # noqa: BLE001 - one backend failing must not lose the others
            traceback.print_exc()
            result.errors[backend] = f"{type(exc).__name__}: {exc}"[:500]
    _judge(result, errors, workload.dtype)
    return steps


def output_errors(out: Any, reference: Any) -> list[float]:
    """The relative error of each output tensor (inf for all when the counts differ)."""
    got, want = measure.flat_tensors(out), measure.flat_tensors(reference)
    if len(got) != len(want):
        return [math.inf]
    return [measure.relative_error(g, w) for g, w in zip(got, want)]


def _judge(result: CaseResult, errors: dict[str, list[float]], dtype: torch.dtype) -> None:
    """Each output's bound, and each backend's worst error against it (``result.error_ratio``).

    Against float64, each output has its own bound from eager's error on that same output
    (``output_bound``): a gradient that is zero in exact arithmetic (an attention key's bias, a
    bias before a train-mode batch norm) is pure rounding noise in every backend, relative errors
    of 1e12 and more, and would otherwise fail every compiler or, as the case's one bound, accept
    anything. Against eager the bound is flat: rounding differs per op.
    ``result.error_bound`` keeps the one-number bound of the worst output, as before.
    """
    eager = errors.get("eager") if result.error_against == "float64" else None
    result.error_bound = measure.error_bound(max(eager, default=0.0) if eager else None, dtype)
    if result.error_against == "eager":  # compiled vs eager in low precision: rounding differs per op
        result.error_bound = max(result.error_bound, 3e-2 if dtype != torch.float32 else 1e-4)
    for backend, errs in errors.items():
        if eager is not None and len(eager) == len(errs):
            bounds = [output_bound(e, dtype) for e in eager]
        else:
            bounds = [result.error_bound] * len(errs)
        result.error_ratio[backend] = max((e / b if math.isfinite(e) else math.inf for e, b in zip(errs, bounds)),
                                          default=0.0)


NOISY = 0.1  # eager's relative error on an output above which that output is mostly rounding noise


def output_bound(eager_error: float, dtype: torch.dtype) -> float:
    """The error a compiled backend may have on an output on which eager has ``eager_error``
    (both against float64): twice eager's, at least the dtype's rounding noise. Where eager's own
    error exceeds 10% (a gradient that is nearly zero in exact arithmetic, a batch norm over a
    tiny batch) the output is mostly rounding noise, and two correct orders of rounding differ by
    more: four times (measured on a CPU, MobileNetV3's quick training step: Inductor's error on
    such gradients was up to 1.8x eager's; on the quick BERT step's gradients, at most 1.1x)."""
    factor = 4.0 if eager_error >= NOISY else 2.0
    return max(factor * eager_error, measure.error_bound(None, dtype))


def _runs_torchfuse(backends: list[str]) -> bool:
    return any(b.startswith("torchfuse") for b in backends)


def _torchfuse_graph_count() -> int:
    return len(torchfuse.report().graphs)


def _record_torchfuse_graphs(result: CaseResult, before: int) -> None:
    """The graphs torchfuse compiled since ``before``, and those it could not compile and ran with
    ATen (the warning saying so is silenced during the bench, so the row must say it)."""
    graphs = torchfuse.report().graphs[before:]
    result.tf_graphs = len(graphs)
    result.tf_fallbacks = [f"{g.name} ({g.kind}): {g.error}"[:300] for g in graphs if g.error]


def _one_line(result: CaseResult) -> str:
    if result.skipped:
        return f"[yellow]{result.case}: skipped ({result.skipped})[/yellow]"
    parts = [f"{b} {ms:.3f} ms" for b, ms in result.ms.items()]
    failed = [f"[red]{b} failed[/red]" for b in result.errors]
    if result.tf_fallbacks:
        failed.append(f"[red]torchfuse ran {len(result.tf_fallbacks)}/{result.tf_graphs} graphs with ATen[/red]")
    failed += [f"[red]{b} outside its error bound[/red]" for b in result.rel_err if not result.accurate(b)]
    return f"{result.case}: " + ", ".join(parts + failed)
