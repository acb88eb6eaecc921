"""The `torchfuse` command line (also `python -m torchfuse`).

Subcommands:
    demo   compile a LLaMA-style block, check it against eager, print the report and timings.
    doctor run a script unchanged with every torch.compile observed; report pitfalls and fixes.
    bench  the benchmark suites: eager vs Inductor vs torchfuse (torchfuse.bench).

Each subcommand is an `_add_<name>` function that registers its parser and sets `func`; a new
subcommand is one more such function and one line in `build_parser`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

import torchfuse
from torchfuse.bench.runner import main as bench_main
from torchfuse.models import make_llama_block
from torchfuse.tools.doctor import run_script

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Largest accepted max|torchfuse - eager| / max|eager|. Fused kernels keep intermediates in float32
# where eager rounds after every op, so the two legitimately differ by a few ulps of the dtype.
TOLERANCE: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@dataclass(frozen=True)
class Comparison:
    """How far the compiled output is from eager's."""

    max_abs: float
    max_rel: float  # max |out - ref| / max |ref|: scale-free, and stable where ref is near zero
    finite: bool
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.finite and self.max_rel <= self.tolerance


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchfuse", description="torchfuse: a fusion compiler for torch.compile")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_doctor(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of `python -m torchfuse`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # everything after `bench` belongs to the suite's own parser
        return run_bench(argparse.Namespace(bench_args=argv[1:]))
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


# ---------------------------------------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="compile a LLaMA-style block; check against eager; time both",
                       description="Compile a LLaMA-style transformer block with torchfuse, check its "
                                   "output against eager PyTorch, print the fusion report and timings.")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto picks cuda when available (default: auto)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--size", choices=["auto", "small", "bench"], default="auto",
                   help="model/input preset; auto: bench on cuda, small on cpu")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="timed runs per backend, after warm-up (default: 20 on cuda, 10 on cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and input (default: 0)")
    p.add_argument("--no-bench", action="store_true",
                   help="on a CPU, skip the CPU benchmark suite that follows the demo")
    p.set_defaults(func=run_demo)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run_demo(args: argparse.Namespace) -> int:
    """Eager vs torchfuse on one LLaMA block: correctness first, then the report, then timings."""
    device = _resolve_device(args.device)
    if device is None:
        print("torchfuse demo: --device cuda asked for, but CUDA is not available", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    size = args.size if args.size != "auto" else ("bench" if device.type == "cuda" else "small")
    steps = args.steps or (20 if device.type == "cuda" else 10)

    model, x = make_llama_block(device, dtype, size, seed=args.seed)
    print(f"LLaMA block ({size}): input {tuple(x.shape)} {str(dtype).removeprefix('torch.')} on {device}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, torch {torch.__version__}")

    torchfuse.reset()
    compiled = torchfuse.compile(model)
    # Inference only: no_grad gives aot_autograd a forward graph with nothing saved for backward.
    with torch.no_grad():
        ref = model(x)
        start = time.perf_counter()
        out = compiled(x)
        _sync(device)
        print(f"first compiled call (includes compiling): {time.perf_counter() - start:.2f} s")
        cmp = compare(out, ref, dtype)
        _print_comparison(cmp)

        print()
        print(torchfuse.report())
        print()
        if not cmp.ok:
            return 1  # no point timing a wrong answer
        eager_ms = median_ms(lambda: model(x), device, steps)
        fused_ms = median_ms(lambda: compiled(x), device, steps)
    _print_timings(eager_ms, fused_ms, device, steps)
    if device.type == "cpu" and not getattr(args, "no_bench", False):
        print("\nNo GPU here: the CPU benchmark suite follows (`torchfuse bench`; --no-bench skips it).\n", flush=True)
        return run_bench(argparse.Namespace(bench_args=["--device", "cpu"]))
    return 0


def _resolve_device(name: str) -> torch.device | None:
    """cuda when asked for or when auto finds it; None when cuda is asked for but missing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        return None
    return torch.device(name)


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> Comparison:
    """Compare in float64 so the measurement adds no rounding of its own."""
    if out.shape != ref.shape:
        raise ValueError(f"compiled output has shape {tuple(out.shape)}, eager {tuple(ref.shape)}")
    diff = (out.double() - ref.double()).abs()
    scale = ref.double().abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    max_abs = diff.max().item()
    return Comparison(max_abs=max_abs, max_rel=max_abs / scale.item(),
                      finite=bool(torch.isfinite(out).all().item()),
                      tolerance=TOLERANCE.get(dtype, 1e-4))


def _print_comparison(cmp: Comparison) -> None:
    verdict = "OK" if cmp.ok else "MISMATCH"
    nan_note = "" if cmp.finite else " (output has NaN or Inf)"
    print(f"torchfuse vs eager: max abs err {cmp.max_abs:.3e}, max rel err {cmp.max_rel:.3e} "
          f"(tolerance {cmp.tolerance:.0e}): {verdict}{nan_note}")


# -------------------------------------------------------------------------------------------- doctor


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="run a script with every torch.compile observed; report pitfalls",
                       description="Run SCRIPT unchanged with every torch.compile / torchfuse.compile in it "
                                   "observed, then report graph breaks, recompiles, the recompile limit, "
                                   "compile time against run time, and kernels per graph, with fixes.")
    p.add_argument("--html", metavar="PATH", help="also write the HTML fusion report to PATH")
    p.add_argument("--backend", choices=["torchfuse"], default=None,
                   help="compile plain torch.compile calls with this backend too")
    p.add_argument("--baseline", action="store_true",
                   help="run the script once more without compiling, to measure eager time per call")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    result = run_script(args.script, args.args, html=args.html, backend=args.backend, baseline=args.baseline)
    result.render()
    return result.exit_code


# --------------------------------------------------------------------------------------------- bench


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark suites: eager vs Inductor vs torchfuse, side by side",
                       description="Run the benchmark suites (torchfuse.bench): every case with every backend "
                                   "in one process; arguments after `bench` go to it (see `torchfuse bench -h`).")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    return bench_main(list(args.bench_args))


# -------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, steps: int, warmup: int = 3) -> float:
    """Median wall time of fn in milliseconds, after warm-up runs.

    On CUDA each run is bracketed by events, which time the GPU work rather than the (asynchronous)
    launch; on CPU perf_counter is the clock. The median ignores the odd slow run (GC, another process).
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(start.elapsed_time(end) for start, end in pairs)
    times = []
    for _ in range(steps):
        start_s = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(times)


def _print_timings(eager_ms: float, fused_ms: float, device: torch.device, steps: int) -> None:
    clock = "CUDA events" if device.type == "cuda" else "perf_counter"
    table = Table(title=f"median of {steps} runs ({clock})")
    table.add_column("backend")
    table.add_column("median ms", justify="right")
    table.add_column("speedup vs eager", justify="right")
    table.add_row("eager", f"{eager_ms:.3f}", "1.00x")
    table.add_row("torchfuse", f"{fused_ms:.3f}", f"{eager_ms / fused_ms:.2f}x")
    Console().print(table)
