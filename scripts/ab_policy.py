"""A/B a tiling or split policy constant on micro cases, in one process (GPU).

A launch configuration can be swept on a saved kernel source (time_kernels.py); a policy that
changes the kernel itself (a split's chunk count, which rows share a program) cannot. This
compiles each case once per variant, with the constant replaced, compares the result with
eager's (BAD past 3e-2 relative, bf16), and prints each variant's median step time and its
kernels' GPU times (profiler; the step time of a training case is mostly host time).

    python3 scripts/ab_policy.py --cases bn_relu_backward_channels_last \\
        --variant chunks2048=torchfuse.codegen.triton.split:POLICY.max_chunks=2048 \\
        --variant rows1=torchfuse.runtime.launch_configs:LOOPED_ROWS_TILE=(1,1024)

A variant is LABEL=MODULE:NAME=VALUE (NAME may be ATTR.FIELD of a frozen dataclass; VALUE a
Python literal); several assignments of one variant are separated by ';'. The baseline
("default") runs first and last, so drift within the process shows.

``--plan`` needs no GPU: it prints, per variant, each kernel's launch at the case's size (grid,
block, warps; ``fake_cuda_graphs.py``'s fake CUDA trace) and the bytes it reads, so that what a
variant changes is known before device time is spent on it, and its timing can be explained.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import os
import statistics
import sys
from contextlib import contextmanager
from typing import Any, Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
os.environ["TORCHFUSE_GRAPH_CACHE"] = "0"  # a cached graph would ignore the replaced constant

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench import measure  # noqa: E402
from torchfuse.bench.patterns import BY_NAME, MODEL_SIZED  # noqa: E402


EAGER_BOUND = 3e-2  # relative error against eager's bf16 result, as `torchfuse bench` allows
CASES = {**BY_NAME, **MODEL_SIZED}


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, Any]]]:
    label, _, rest = text.partition("=")
    assignments = []
    for part in rest.split(";"):
        module, _, assignment = part.partition(":")
        name, _, value = assignment.partition("=")
        assignments.append((module, name, ast.literal_eval(value)))
    return label, assignments


@contextmanager
def replaced(assignments: list[tuple[str, str, Any]]) -> Iterator[None]:
    """The module constants replaced for the block (a dataclass field through dataclasses.replace)."""
    saved = []
    for module_name, name, value in assignments:
        module = importlib.import_module(module_name)
        attr, _, field = name.partition(".")
        old = getattr(module, attr)
        saved.append((module, attr, old))
        setattr(module, attr, dataclasses.replace(old, **{field: value}) if field else value)
    try:
        yield
    finally:
        for module, attr, old in reversed(saved):
            setattr(module, attr, old)


def kernel_times(step: Any) -> list[tuple[str, float]]:
    """GPU us of each kernel of one step (median of 5 profiled steps)."""
    if not torch.cuda.is_available():
        return []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name, []).append(event.device_time)
    return sorted(((name[:40], statistics.median(t)) for name, t in times.items()), key=lambda kv: -kv[1])


def run_case(case: str, variants: list[tuple[str, list]], repeats: int, device: torch.device, size: str) -> None:
    pattern = CASES[case]
    inputs = pattern.make_inputs(device, torch.bfloat16, size)
    expected = pattern.fn(*inputs)
    print(f"== {case}")
    for label, assignments in variants:
        torch._dynamo.reset()
        with replaced(assignments):
            fn = torchfuse.compile(pattern.fn)
            out = fn(*inputs)  # compiles with the constant replaced
        error = measure.relative_error(out, expected)
        step = lambda: fn(*inputs)  # noqa: E731
        ms = measure.median_ms({label: step}, device, repeats)[label]
        kernels = kernel_times(step)
        top = ", ".join(f"{name} {us:.1f}" for name, us in kernels[:4])
        flag = "" if error <= EAGER_BOUND else "  BAD: differs from eager"
        print(f"{label:>14}: {ms * 1000:8.1f} us  (error {error:.2e}{flag})  {top}", flush=True)


def plan_case(case: str, variants: list[tuple[str, list]], size: str) -> None:
    """Each variant's kernels and their default launches for ``case`` on fake CUDA."""
    import fake_cuda_graphs
    from torchfuse.diagnostics.report import report
    from torchfuse.options import Options
    from torchfuse.pipeline import compile_graph

    pattern = CASES[case]
    inputs = pattern.make_inputs("cpu", torch.bfloat16, size)
    torch._dynamo.reset()  # a case after the first would hit Dynamo's cache, or recompile shape-generic
    graphs = fake_cuda_graphs.capture_step(lambda backend: lambda: torch.compile(pattern.fn, backend=backend)(*inputs))
    configs = fake_cuda_graphs.record_launch_configs()
    options = Options.from_user({"strict": True}, "default")
    print(f"== {case}")
    for label, assignments in variants[:-1]:  # the baseline once
        launches = []
        with replaced(assignments):
            for kind, gm, example_inputs in graphs:
                configs.clear()  # kernel names repeat between graphs
                compile_graph(*fake_cuda_graphs.on_fake_cuda(gm, example_inputs), kind, options)
                launches += [f"{configs[k.name]} {(k.bytes_read or 0) / 1e6:.0f} MB"
                             for k in report().graphs[-1].kernels if k.name in configs]
        print(f"{label:>14}: {'; '.join(launches)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True)
    parser.add_argument("--variant", action="append", default=[], help="LABEL=MODULE:NAME=VALUE[;...]")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="bench", help="the patterns' size (small: a CPU smoke test)")
    parser.add_argument("--plan", action="store_true", help="print each variant's launches (fake CUDA, no GPU)")
    args = parser.parse_args()
    variants = [("default", [])] + [parse_variant(v) for v in args.variant] + [("default", [])]
    for case in args.cases.split(","):
        if args.plan:
            plan_case(case, variants, args.size)
        else:
            run_case(case, variants, args.repeats, torch.device(args.device), args.size)


if __name__ == "__main__":
    main()
