"""``torchfuse.report()``: what was compiled in this process, fused how, and why not more."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from torchfuse.scheduler.decisions import FusionDecision


@dataclass
class KernelReport:
    name: str
    kind: str  # "pointwise", "reduction" or "extern"
    ops: list[str]  # ATen ops this kernel runs
    source: str | None = None


@dataclass
class GraphReport:
    name: str
    kind: str  # "forward", "backward" or "inference"
    target: str
    kernels: list[KernelReport] = field(default_factory=list)
    decisions: list[FusionDecision] = field(default_factory=list)  # refused fusions
    fusions: list[FusionDecision] = field(default_factory=list)  # fusions made
    fallbacks: list[str] = field(default_factory=list)  # ATen ops run without a lowering
    error: str | None = None  # set when compiling failed and the graph runs with ATen
    stage_seconds: dict[str, float] = field(default_factory=dict)
    aten_ops: list[str] = field(default_factory=list)  # ops of the input graph, in order
    ir_text: str = ""
    wrapper_source: str = ""

    @property
    def generated_kernels(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.kind != "extern"]

    def __str__(self) -> str:
        if self.kind == "eager":
            return (f"{self.name} (CPU): {len(self.aten_ops)} ops run as captured, unfused "
                    "(the C++ target is not built yet; options={'target': 'triton'} runs Triton's interpreter)")
        lines = [f"{self.name} ({self.kind}, target={self.target}): {len(self.generated_kernels)} generated kernels, "
                 f"{len(self.kernels) - len(self.generated_kernels)} ATen calls, from {len(self.aten_ops)} ATen ops"]
        if self.error:
            lines.append(f"  FELL BACK TO ATEN: {self.error}")
        for kernel in self.kernels:
            lines.append(f"  {kernel.name:<10} {kernel.kind:<10} {', '.join(kernel.ops)}")
        for decision in self.decisions:
            lines.append(f"  not fused: {decision}")
        if self.fallbacks:
            lines.append(f"  no lowering (ran as ATen): {', '.join(sorted(set(self.fallbacks)))}")
        if self.stage_seconds:
            times = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.stage_seconds.items())
            lines.append(f"  compile time: {times}")
        return "\n".join(lines)


@dataclass
class Report:
    graphs: list[GraphReport]

    def __str__(self) -> str:
        if not self.graphs:
            return "torchfuse: nothing compiled yet"
        return "\n".join(str(g) for g in self.graphs)

    @property
    def kernels(self) -> list[KernelReport]:
        return [k for g in self.graphs for k in g.kernels]


_graphs: list[GraphReport] = []
_lock = threading.Lock()


def record(graph: GraphReport) -> None:
    with _lock:
        _graphs.append(graph)


def next_graph_name() -> str:
    with _lock:
        return f"graph{len(_graphs)}"


def report() -> Report:
    """The graphs compiled in this process so far."""
    with _lock:
        return Report(list(_graphs))


def clear() -> None:
    with _lock:
        _graphs.clear()
