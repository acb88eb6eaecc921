"""``torchfuse.warmup(compiled, example_inputs_list)``: compile ahead for a list of input shapes.

Each example is run once through the compiled function (in the current grad mode, so the graphs
are the ones the real steps will use); the report says, per example, what was compiled, which
guard made it compile again, and what was reused, so the first real step pays nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from torchfuse.frontend import dynamo_events as dyn
from torchfuse.ir.printer import dtype_name
from torchfuse.tools.observe import Observation


@dataclass(frozen=True)
class WarmupEntry:
    inputs: str  # the example's shapes, e.g. "(f32[2, 64, 8], f32[8, 8])"
    seconds: float
    frames_compiled: int  # Dynamo frame compiles this example caused (0: fully reused)
    graphs: list[str] = field(default_factory=list)  # torchfuse graphs compiled for it
    reasons: list[str] = field(default_factory=list)  # why it recompiled (what changed)

    @property
    def reused(self) -> bool:
        return self.frames_compiled == 0


@dataclass
class WarmupReport:
    entries: list[WarmupEntry]

    @property
    def compiled(self) -> int:
        return sum(1 for e in self.entries if not e.reused)

    def __str__(self) -> str:
        lines = [f"torchfuse.warmup: {len(self.entries)} example(s), {self.compiled} compiled, "
                 f"{len(self.entries) - self.compiled} reused a graph already compiled"]
        for entry in self.entries:
            if entry.reused:
                lines.append(f"  {entry.inputs}: reused ({entry.seconds * 1e3:.1f} ms)")
                continue
            graphs = f" -> {', '.join(entry.graphs)}" if entry.graphs else ""
            why = f"; {'; '.join(entry.reasons)}" if entry.reasons else ""
            lines.append(f"  {entry.inputs}: compiled {entry.frames_compiled} frame(s){graphs} "
                         f"in {entry.seconds:.2f} s{why}")
        return "\n".join(lines)


def warmup(compiled: Callable, example_inputs_list: Sequence[Any], backward: bool = False) -> WarmupReport:
    """Run ``compiled`` on each example so that its graphs are compiled before the real steps.

    Args:
        compiled: what ``torchfuse.compile`` (or ``torch.compile``) returned.
        example_inputs_list: one entry per shape to prepare: a tuple/list of positional arguments,
            a dict of keyword arguments, or a single tensor.
        backward: also compile the backward graphs, by differentiating the outputs that require grad
            (with ``torch.autograd.grad``, so no ``.grad`` is touched).
    Returns:
        A ``WarmupReport``; ``str()`` of it is readable.
    """
    entries = []
    for example in example_inputs_list:
        args, kwargs = _split(example)
        with Observation() as observed:
            started = time.perf_counter()
            output = compiled(*args, **kwargs)
            if backward:
                _differentiate(compiled, output, args)
            seconds = time.perf_counter() - started
        compiles = observed.compiles()
        reasons = [r.what_changed for r in observed.recompiles()]
        entries.append(WarmupEntry(_describe(args, kwargs), seconds, sum(1 for c in compiles if c.function),
                                   [g.name for g in observed.graphs()], reasons))
    return WarmupReport(entries)


def _split(example: Any) -> tuple[tuple, dict]:
    if isinstance(example, dict):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    return (example,), {}


def _differentiate(compiled: Callable, output: Any, args: tuple) -> None:
    outputs = [t for t in _tensors(output) if t.requires_grad]
    if not outputs:
        return
    original = dyn.original_of(compiled)
    leaves = list(original.parameters()) if isinstance(original, torch.nn.Module) else []
    leaves += [t for t in _tensors(args) if t.requires_grad and t.is_leaf]
    leaves = [t for t in leaves if t.requires_grad]
    if leaves:
        torch.autograd.grad(sum(o.float().sum() for o in outputs), leaves, allow_unused=True)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _describe(args: tuple, kwargs: dict) -> str:
    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{dtype_name(value.dtype)}[{', '.join(str(s) for s in value.shape)}]"
        return repr(value) if isinstance(value, (int, float, bool, str)) else type(value).__name__

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"
