"""``torchfuse.explain(fn, *args, **kwargs)``: run once under compilation and say what happened.

The result lists the graphs, every graph break (Dynamo's reason, the user's file and line, the line
itself and a fix), the ATen ops that ran without a lowering, and what was fused. ``str()`` of it is
a readable report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torchfuse.api import make_backend
from torchfuse.diagnostics.model import GraphReport
from torchfuse.diagnostics.summary import FusionSummary, summarize
from torchfuse.frontend import dynamo_events as dyn
from torchfuse.options import Options
from torchfuse.tools.advice import advise_break
from torchfuse.tools.observe import BreakInfo, GraphFinding, Observation, RecompileInfo


@dataclass
class ExplainResult:
    graphs: list[GraphReport]
    graph_breaks: list[BreakInfo]
    fallbacks: list[str]  # ATen ops run without a lowering
    fusion: FusionSummary
    recompiles: list[RecompileInfo] = field(default_factory=list)
    findings: list[GraphFinding] = field(default_factory=list)
    error: BaseException | None = None  # what a fullgraph=True compile raised, if it did
    output: Any = None

    @property
    def graph_count(self) -> int:
        return sum(1 for g in self.graphs if g.kind != "backward")

    @property
    def break_count(self) -> int:
        return sum(b.count for b in self.graph_breaks)

    def __str__(self) -> str:
        lines = [f"torchfuse.explain: {self.graph_count} graph(s), {self.break_count} graph break(s)"]
        if self.error is not None:
            lines.append(f"  compiling raised {type(self.error).__name__} (fullgraph=True): see the break below")
        for number, info in enumerate(self.graph_breaks, 1):
            where = f"{info.file}:{info.line}"
            lines += [f"  break {number}: {where}" + (f" ({info.count}x)" if info.count > 1 else ""),
                      f"      {info.code}", f"      reason: {info.reason}",
                      f"      {info.advice.title}", f"      fix: {info.advice.fix}"]
        for finding in self.findings:
            lines.append(f"  {finding}")
        for recompile in self.recompiles:
            lines.append(f"  {recompile}")
        lines.append(f"  fusion: {self.fusion}")
        if self.fallbacks:
            lines.append(f"  no lowering (ran as ATen): {', '.join(self.fallbacks)}")
        for graph in self.graphs:
            lines += ["  " + line for line in str(graph).splitlines()]
        return "\n".join(lines)


def explain(fn_or_model: Callable, *args: Any, **kwargs: Any) -> ExplainResult:
    """Run ``fn_or_model(*args, **kwargs)`` once under compilation and explain the result.

    Args:
        fn_or_model: a function or ``nn.Module``, or what ``torchfuse.compile`` / ``torch.compile``
            returned (to explain it with its own options, e.g. ``fullgraph=True``).
        *args, **kwargs: the inputs of one call.
    Returns:
        An ``ExplainResult``. Dynamo's caches are reset first (as ``torch._dynamo.explain`` does),
        so everything is compiled afresh and seen.
    """
    observed = Observation()
    compiled = fn_or_model
    if not dyn.is_compiled(fn_or_model):
        compiled = torch.compile(fn_or_model, backend=observed.wrap_backend(make_backend(Options.from_user(None))))
    dyn.reset_dynamo()
    error: BaseException | None = None
    output = None
    with observed:
        try:
            output = compiled(*args, **kwargs)
        except dyn.unsupported_error_types() as raised:
            error = raised
    breaks = observed.breaks()
    if error is not None:
        breaks = _with_error_break(breaks, error)
    graphs = observed.graphs()
    return ExplainResult(graphs, breaks, sorted({op for g in graphs for op in g.fallbacks}), summarize(graphs),
                         observed.recompiles(), observed.graph_findings(), error, output)


def break_from_error(error: BaseException) -> BreakInfo:
    """A ``fullgraph=True`` error as a graph break (its location, reason and fix)."""
    frames = dyn.error_user_frames(error)
    location = dyn.innermost_user_frame(frames)
    message = str(error)
    code = location.line if location else ""
    return BreakInfo(dyn.short_reason(message.split("from user code:")[0]), location, advise_break(message, code))


def _with_error_break(breaks: list[BreakInfo], error: BaseException) -> list[BreakInfo]:
    info = break_from_error(error)
    if any(b.file == info.file and b.line == info.line for b in breaks):
        return breaks
    return breaks + [info]
