#!/usr/bin/env python3
"""Eager vs Inductor vs torchfuse on the foundation's patterns and a LLaMA block, on one CUDA GPU.

Meant for the H200 machine (torch 2.11, Triton 3.6, no network); needs no install:

    python benchmarks/gpu_foundation.py [--size bench|small] [--cases a,b] [--backends eager,torchfuse]

For every case and backend, in one process: the first call's wall time (compiling included), the
error against a float64 reference, the median time from triton.testing.do_bench, and the number of
CUDA kernels one call launches (torch.profiler). A backend that fails on a case is reported with its
traceback and the run goes on. Results go to stdout and to $OUT (default ./out) as Markdown and JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
# The repo root for benchmarks.patterns, src/ for torchfuse itself: the GPU machine has no install.
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.patterns import PATTERNS, to_reference  # noqa: E402

BACKENDS = ("eager", "inductor", "torchfuse")
Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
Step = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    """build(compiler) returns a zero-argument step; reference() returns its outputs in float64."""

    name: str
    build: Callable[[Compiler], Step]
    reference: Callable[[], Any]


@dataclass
class Result:
    case: str
    ms: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    rel_err: dict[str, float] = field(default_factory=dict)  # ||out - ref|| / ||ref||, worst output
    first_call_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    report: str = ""  # str(torchfuse.report()) after the torchfuse run


def compiler_for(backend: str) -> Compiler:
    if backend == "eager":
        return lambda fn: fn
    if backend == "inductor":
        return lambda fn: torch.compile(fn)  # Inductor, default mode
    if backend == "torchfuse":
        import torchfuse

        return lambda fn: torchfuse.compile(fn)
    raise ValueError(f"unknown backend {backend!r}")


def flat_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in flat_tensors(item)]


def rel_error(out: Any, ref: Any) -> float:
    """Worst relative Frobenius error over the outputs; inf when an output is not finite."""
    worst = 0.0
    for got, want in zip(flat_tensors(out), flat_tensors(ref), strict=True):
        got64, want64 = got.detach().double(), want.detach().double()
        if not torch.isfinite(got64).all():
            return math.inf
        worst = max(worst, ((got64 - want64).norm() / want64.norm().clamp_min(1e-300)).item())
    return worst


def count_kernels(step: Step) -> int:
    """CUDA kernels launched by one call (copies and memsets are not kernels)."""
    # One profiling cycle is all we want; silence the profiler's note about cycles.
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def pattern_cases(size: str) -> list[Case]:
    cases = []
    for pat in PATTERNS:
        inputs = pat.make_inputs("cuda", torch.bfloat16, size)

        def build(compiler: Compiler, fn: Callable[..., Any] = pat.fn, args: tuple = inputs) -> Step:
            compiled = compiler(fn)
            return lambda: compiled(*args)

        def reference(fn: Callable[..., Any] = pat.fn, args: tuple = inputs) -> Any:
            return fn(*to_reference(args))

        cases.append(Case(pat.name, build, reference))
    return cases


def llama_cases(size: str) -> list[Case]:
    """The block forward (inference) and forward + backward (gradients of input and weights)."""
    from torchfuse.models import make_llama_block

    model, x = make_llama_block("cuda", torch.bfloat16, size)
    x.requires_grad_()
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x)
    wrt = [x, *model.parameters()]

    def build_fwd(compiler: Compiler) -> Step:
        compiled = compiler(model)

        def step() -> Any:
            with torch.no_grad():
                return compiled(x)
        return step

    def build_fwd_bwd(compiler: Compiler) -> Step:
        compiled = compiler(model)

        def step() -> Any:
            out = compiled(x)
            return (out.detach(), *torch.autograd.grad(out, wrt, grad_out))
        return step

    def reference(with_grads: bool) -> Any:
        # The same bf16 weights, upcast: measures the compiler's rounding, not bf16's storage.
        model64 = copy.deepcopy(model).double()
        x64 = x.detach().double().requires_grad_()
        out = model64(x64)
        if not with_grads:
            return out.detach()
        return (out.detach(), *torch.autograd.grad(out, [x64, *model64.parameters()], grad_out.double()))

    return [Case("llama_block_fwd", build_fwd, lambda: reference(False)),
            Case("llama_block_fwd_bwd", build_fwd_bwd, lambda: reference(True))]


def run_backend(case: Case, backend: str, ref: Any, result: Result) -> None:
    from triton.testing import do_bench

    torch._dynamo.reset()  # no compiled code or cache entries carried over from another backend
    if backend == "torchfuse":
        import torchfuse

        torchfuse.reset()
    step = case.build(compiler_for(backend))
    start = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    result.first_call_s[backend] = time.perf_counter() - start
    if ref is not None:
        result.rel_err[backend] = rel_error(out, ref)
    del out
    result.ms[backend] = do_bench(step, return_mode="median")
    result.kernels[backend] = count_kernels(step)
    if backend == "torchfuse":
        result.report = str(torchfuse.report())


def run_case(case: Case, backends: list[str]) -> Result:
    result = Result(case.name)
    print(f"== {case.name}", flush=True)
    try:
        ref = case.reference()
    except Exception:
        traceback.print_exc()
        result.errors["reference"] = traceback.format_exc(limit=3)
        ref = None
    for backend in backends:
        try:
            run_backend(case, backend, ref, result)
            print(f"   {backend:9s} {result.ms[backend]:8.3f} ms  {result.kernels[backend]:4d} kernels  "
                  f"rel err {result.rel_err.get(backend, math.nan):.2e}", flush=True)
        except Exception as exc:  # one backend failing must not lose the others' numbers
            traceback.print_exc()
            result.errors[backend] = f"{type(exc).__name__}: {exc}"[:500]
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return result


def accuracy_ok(result: Result) -> str:
    """'ok' when torchfuse's error is at most twice eager's (or below bf16-noise level 5e-3)."""
    tf, eager = result.rel_err.get("torchfuse"), result.rel_err.get("eager")
    if tf is None:
        return "-"
    bound = max(2 * eager, 5e-3) if eager is not None else 5e-3
    return "ok" if tf <= bound else "BAD"


def markdown(results: list[Result], header: str) -> str:
    def ms(r: Result, b: str) -> str:
        return f"{r.ms[b]:.3f}" if b in r.ms else ("fail" if b in r.errors else "-")

    def num(d: dict[str, Any], b: str, fmt: str) -> str:
        return format(d[b], fmt) if b in d else "-"

    lines = [header, "",
             "| case | eager ms | inductor ms | torchfuse ms | torchfuse/eager speedup "
             "| kernels eager/inductor/torchfuse | rel err eager/inductor/torchfuse | accuracy |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        speed = f"{r.ms['eager'] / r.ms['torchfuse']:.2f}x" if {"eager", "torchfuse"} <= r.ms.keys() else "-"
        kernels = "/".join(num(r.kernels, b, "d") for b in BACKENDS)
        errs = "/".join(num(r.rel_err, b, ".1e") for b in BACKENDS)
        lines.append(f"| {r.case} | {ms(r, 'eager')} | {ms(r, 'inductor')} | {ms(r, 'torchfuse')} "
                     f"| {speed} | {kernels} | {errs} | {accuracy_ok(r)} |")
    failures = [f"- {r.case} / {b}: {msg.splitlines()[0] if msg else ''}"
                for r in results for b, msg in r.errors.items()]
    if failures:
        lines += ["", "Failures:", *failures]
    return "\n".join(lines) + "\n"


def environment() -> dict[str, str]:
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name(), "cuda": str(torch.version.cuda)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["bench", "small"], default="bench")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_foundation.py needs a CUDA GPU", file=sys.stderr)
        return 2
    backends = [b for b in args.backends.split(",") if b]
    wanted = set(filter(None, args.cases.split(",")))
    env = environment()
    print(json.dumps(env), flush=True)

    results = []
    for make in (pattern_cases, llama_cases):
        try:
            cases = make(args.size)
        except Exception:  # e.g. torchfuse.models failing to import: keep the other group's numbers
            traceback.print_exc()
            continue
        for case in cases:
            if not wanted or case.name in wanted:
                results.append(run_case(case, backends))
    table = markdown(results, f"torch {env['torch']}, triton {env['triton']}, {env['gpu']}, "
                              f"bfloat16, size {args.size}; times are do_bench medians")
    print("\n" + table)

    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_foundation.md").write_text(table)
    payload = {"env": env, "size": args.size, "results": [asdict(r) for r in results]}
    (out_dir / "gpu_foundation.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {out_dir / 'gpu_foundation.md'} and {out_dir / 'gpu_foundation.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
