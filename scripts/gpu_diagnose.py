"""Diagnose a model's torchfuse step on the GPU: where the host time goes, and the slow kernels' source.

    python3 scripts/gpu_diagnose.py --cases efficientnet_b0_infer,vit_b16_train --out $OUT/diag

Per case: compiles with torchfuse (kernel sources kept), runs 3 warm-up steps, then
- cProfile over ``--steps`` steps (top functions by own time and by cumulative time), to find
  per-call Python work on the host;
- torch.profiler over the same steps: the top torchfuse kernels by GPU time, each written with its
  generated source so a slow one can be read without a GPU;
- ``torchfuse.report()``'s text (graphs that ran with ATen and why, fallbacks) and the wrappers.
Writes ``<case>.txt`` under ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench.bandwidth import kernel_function_name  # noqa: E402
from torchfuse.bench.compile_time import compiler_for, use_fresh_caches  # noqa: E402
from torchfuse.bench.profile import _kernel_times  # noqa: E402
from torchfuse.bench.suites import select  # noqa: E402
from torchfuse.runtime import launch  # noqa: E402


def host_profile(step, steps: int) -> str:
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(45)
    return text.getvalue()


def kernel_sources() -> dict[str, str]:
    """Generated kernel function name -> its source, from every graph of the report."""
    found = {}
    for graph in torchfuse.report().graphs:
        for kernel in graph.kernels:
            name = kernel_function_name(kernel.source)
            if name is not None:  # the kernel itself, without the helpers (_add, ...) before it
                body = kernel.source[kernel.source.index(f"def {name}("):]
                found[name] = f"# graph {graph.name}, kernel {kernel.name}\n{body}"
    return found


@contextlib.contextmanager
def launch_configs() -> Iterator[dict[str, set]]:
    """Kernel name -> the (xnumel, rnumel, config) of its launches inside the block: the grid,
    block sizes and warps a slow kernel ran with (only during warm-up: it costs per launch)."""
    seen: dict[str, set] = defaultdict(set)
    original = launch.Launcher.__call__

    def recording(self, xnumel, rnumel, *args):
        config = self.config(xnumel, rnumel)
        name = getattr(self.fn, "__name__", str(self.fn))
        seen[name].add((xnumel, rnumel, f"grid {config.grid}, {dict(zip(config.names, config.constexprs))}, "
                                         f"{config.num_warps} warps, outer={self.outer}, tile={self.tile}"))
        return original(self, xnumel, rnumel, *args)

    launch.Launcher.__call__ = recording
    try:
        yield seen
    finally:
        launch.Launcher.__call__ = original


def diagnose(case, steps: int, top: int) -> str:
    workload = case.build(torch.device("cuda"), False)
    step = workload.make_step(compiler_for("torchfuse"))
    with launch_configs() as configs:
        for _ in range(3):
            step()
    parts = [f"# {case.name}\n", host_profile(step, steps)]
    times = sorted(_kernel_times(step, steps).values(), key=lambda k: -k.ms)
    sources = kernel_sources()
    parts.append("\n# top kernels (ms per step, calls per step)\n")
    for kernel in times[:top]:
        parts.append(f"{kernel.ms:9.3f} ms x{kernel.calls:g}  {kernel.name}\n")
    for kernel in times[:top]:
        name = kernel.name.split("(")[0]
        if name in sources:
            launches = "\n".join(f"# launched over xnumel {x}, rnumel {r}: {c}" for x, r, c in sorted(configs.get(name, ())))
            parts.append(f"\n## {name}: {kernel.ms:.3f} ms, {kernel.calls:g} calls\n{launches}\n{sources[name]}\n")
    report = torchfuse.report()
    # The report's own text says which graphs ran with ATen and why, and each fallback's reason.
    parts.append(f"\n# report\n{report}\n")
    parts.append("\n# wrapper sources\n")
    for graph in report.graphs:
        parts.append(f"\n## graph {graph.name}\n{getattr(graph, 'wrapper_source', '')}\n")
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default="out/diag")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    use_fresh_caches()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in select("models", torch.device("cuda"), set(args.cases.split(","))):
        torchfuse.reset()
        torch._dynamo.reset()
        try:
            text = diagnose(case, args.steps, args.top)
        except Exception as error:  # noqa: BLE001 - one case failing must not lose the others
            text = f"# {case.name} failed: {error!r}\n"
        (out / f"{case.name}.txt").write_text(text)
        print(f"wrote {out / case.name}.txt", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
