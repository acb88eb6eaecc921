"""What is alive at a model step's memory peak on the GPU, eager against torchfuse (issue 16: peak
memory at most eager's).

    python3 scripts/memory_peak.py --cases vit_b16_train,swin_t_train --out $OUT/memory

Per case and backend: after three settling steps, one step runs under torch's allocator history
(``torch.cuda.memory._record_memory_history``). Replaying its allocations and frees gives the
bytes alive beyond what was alive before the step, their peak, and the blocks alive at that
peak grouped by where they were allocated: a line of a torchfuse wrapper (its source text,
from the report) or the first frame outside torch (a model's line). Prints the top sites a
backend and writes memory_<case>.txt.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench.compile_time import compiler_for, use_fresh_caches, warm_up_compilers  # noqa: E402
from torchfuse.bench.suites import select  # noqa: E402

WRAPPER_FILE = "<torchfuse wrapper "
TORCH_DIRS = (os.sep + "torch" + os.sep, os.sep + "torchfuse" + os.sep, "<frozen", "<string>")


def wrapper_lines() -> dict[str, list[str]]:
    """Wrapper source lines by graph name, to name an allocation made in a wrapper."""
    return {g.name: g.wrapper_source.splitlines() for g in torchfuse.report().graphs if g.wrapper_source}


def site(frames: list[dict], wrappers: dict[str, list[str]]) -> str:
    """Where a block was allocated: a wrapper's line (its text) or the first frame outside torch."""
    for frame in frames:
        filename = frame.get("filename", "")
        if filename.startswith(WRAPPER_FILE):
            graph = filename[len(WRAPPER_FILE):].rstrip(">")
            lines = wrappers.get(graph, [])
            line = frame.get("line", 0)
            text = lines[line - 1].strip() if 0 < line <= len(lines) else "?"
            return f"{graph}:{line}: {text[:110]}"
    for frame in frames:
        filename = frame.get("filename", "")
        if not any(part in filename for part in TORCH_DIRS):
            return f"{os.path.basename(filename)}:{frame.get('line')} {frame.get('name')}"
    return "(torch internals)"


def peak_sites(trace: list[dict], wrappers: dict[str, list[str]]) -> tuple[int, Counter, Counter]:
    """Replay one step's trace: (peak bytes beyond the start, bytes by site alive at the peak,
    blocks by site alive at the peak)."""
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in trace:
        action, addr, size = event.get("action"), event.get("addr"), event.get("size", 0)
        if action == "alloc":
            live[addr] = (size, site(event.get("frames", []), wrappers))
            current += size
            if current > peak:
                peak, at_peak = current, dict(live)
        elif action == "free_completed" and addr in live:
            current -= live.pop(addr)[0]
    sizes, counts = Counter(), Counter()
    for size, where in at_peak.values():
        sizes[where] += size
        counts[where] += 1
    return peak, sizes, counts


def one_step_trace(step) -> tuple[list[dict], float]:
    """The allocator events of one step, and torch's own peak beyond the start (MB)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=500_000)
    out = step()
    torch.cuda.synchronize()
    del out
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak_mb = (torch.cuda.max_memory_allocated() - before) / 2**20
    traces = snapshot.get("device_traces", [[]])
    return (traces[torch.cuda.current_device()] if traces else []), peak_mb


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--backends", default="eager,torchfuse")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default="out/memory")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    use_fresh_caches()
    device = torch.device("cuda")
    backends = args.backends.split(",")
    warm_up_compilers(backends, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in select("models", device, set(args.cases.split(","))):
        if case.missing():
            continue
        workload = case.build(device, False)
        text = []
        for backend in backends:
            step = workload.make_step(compiler_for(backend))
            for _ in range(3):
                step()
            trace, peak_mb = one_step_trace(step)
            peak, sizes, counts = peak_sites(trace, wrapper_lines())
            text.append(f"{case.name} {backend}: peak {peak_mb:.0f} MB beyond the start (trace: {peak / 2**20:.0f} MB "
                        f"over {len(trace)} events); alive at the peak by site:")
            for where, size in sizes.most_common(args.top):
                text.append(f"  {size / 2**20:9.1f} MB in {counts[where]:4d} blocks  {where}")
            del step
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        (out / f"memory_{case.name}.txt").write_text("\n".join(text) + "\n")
        print("\n".join(text), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
