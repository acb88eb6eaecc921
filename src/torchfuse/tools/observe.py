"""Observe compiled code while it runs and turn Dynamo's events into findings with advice.

Shared by ``torchfuse.explain`` (one call) and ``torchfuse doctor`` (a whole script): an
``Observation`` collects Dynamo's events (``frontend/dynamo_events``) and the graphs torchfuse
compiled, then answers: which graph breaks (where, why, what to do), which recompiles (which
guard failed, what changed), which functions hit the recompile limit, and per function how many
graphs and how much compile time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from torchfuse.diagnostics import report as reports
from torchfuse.diagnostics.model import GraphReport
from torchfuse.frontend import dynamo_events as dyn
from torchfuse.frontend.dynamo_events import FrameCompile, RecompileLimitHit, ShapeChange, UserFrame
from torchfuse.tools.advice import Advice, advise_break, advise_graph_op, recompile_advice


class AtUserLine:
    """A finding's place in the user's code: ``file`` and ``line`` of its ``location``."""

    location: UserFrame | None

    @property
    def file(self) -> str:
        return self.location.filename if self.location else "?"

    @property
    def line(self) -> int:
        return self.location.lineno if self.location else 0


@dataclass(frozen=True)
class BreakInfo(AtUserLine):
    """One graph break: where in user code, Dynamo's reason, the fix, how often it was seen."""

    reason: str
    location: UserFrame | None
    advice: Advice
    count: int = 1
    function: str = ""  # the compiled function it happened in, when known

    @property
    def code(self) -> str:
        return self.location.line if self.location else ""

    def __str__(self) -> str:
        times = f" ({self.count}x)" if self.count > 1 else ""
        return (f"graph break at {self.file}:{self.line}{times}: {self.code}\n"
                f"    reason: {self.reason}\n    {self.advice.title}\n    fix: {self.advice.fix}")


@dataclass(frozen=True)
class RecompileInfo:
    """One recompile: the guard that failed, what changed, and the advice."""

    function: str
    filename: str
    compile_id: str
    guard: str
    change: ShapeChange | None
    where: UserFrame | None  # the user line the guard came from, when Dynamo says
    advice: Advice

    @property
    def what_changed(self) -> str:
        return str(self.change) if self.change else self.guard

    def __str__(self) -> str:
        where = f" (guard from {self.where}: {self.where.line})" if self.where and self.where.line else ""
        return f"recompile of {self.function} [{self.compile_id}]: {self.what_changed}{where}"


@dataclass(frozen=True)
class GraphFinding(AtUserLine):
    """Something inside a captured graph worth knowing (e.g. a captured ``.item()``)."""

    graph: str  # the graph's name or Dynamo compile id
    op: str
    advice: Advice
    location: UserFrame | None = None

    def __str__(self) -> str:
        where = f" at {self.location}: {self.location.line}" if self.location else ""
        return f"{self.op} captured in graph {self.graph}{where}: {self.advice.title}. Fix: {self.advice.fix}"


@dataclass
class FunctionStats:
    """One compiled function: calls, graphs, recompiles, compile time and run time."""

    name: str
    filename: str
    lineno: int
    calls: int = 0
    wall_s: float = 0.0  # inside calls of the compiled function, compiling included
    compile_in_calls_s: float = 0.0
    compiles: list[FrameCompile] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)
    recompiles: list[RecompileInfo] = field(default_factory=list)
    limit_hits: list[RecompileLimitHit] = field(default_factory=list)
    eager_s_per_call: float | None = None  # from a baseline run, when there was one

    @property
    def compile_s(self) -> float:
        """Dynamo's frame compile times; they include the backend's (and aot_autograd's backward)."""
        return sum(c.seconds for c in self.compiles)

    @property
    def run_s(self) -> float:
        return max(self.wall_s - self.compile_in_calls_s, 0.0)

    @property
    def graph_count(self) -> int:
        return sum(1 for c in self.compiles if c.is_forward and not c.fail_type and (c.op_count or 0) > 0)

    @property
    def location(self) -> str:
        return f"{self.filename}:{self.lineno}" if self.filename else "?"

    def verdict(self) -> tuple[bool | None, str]:
        """Did compiling pay off? (True, False or None for unknown, and a sentence saying why)."""
        if self.limit_hits:
            return False, ("compiling did not pay off: the function hit the recompile limit and ran in eager "
                           "mode after that")
        if self.eager_s_per_call is not None and self.calls:
            saved = self.eager_s_per_call * self.calls - self.run_s
            paid = saved > self.compile_s
            per_call = self.run_s / self.calls
            return paid, (f"compiling {'paid off' if paid else 'did not pay off'}: eager takes "
                          f"{self.eager_s_per_call * 1e3:.2f} ms/call, compiled {per_call * 1e3:.2f} ms/call; "
                          f"{saved:.3f} s saved against {self.compile_s:.3f} s compiling")
        fused = [g for g in self.graphs if g.kind != "eager"]
        if self.graphs and not fused:
            return False, ("compiling did not pay off: its graphs ran unfused (CPU without a C++ compiler), "
                           f"so compiled code is no faster than eager and the {self.compile_s:.2f} s of compiling "
                           "is pure overhead")
        if self.run_s <= 0 or self.compile_s >= self.run_s * 10:
            return False, (f"compiling did not pay off: it took {self.compile_s:.2f} s, over 10x all compiled calls "
                           f"together ({self.run_s:.3f} s), which no speedup can win back in this run")
        needed = 1 + self.compile_s / self.run_s
        return None, (f"compiling pays off only if compiled code is {needed:.2f}x faster than eager "
                      f"({self.compile_s:.2f} s compiling, {self.run_s:.2f} s in compiled calls); "
                      "run doctor with --baseline to measure eager")


class Observation:
    """Collects, while active, what Dynamo and torchfuse did (``with Observation() as obs:``)."""

    def __init__(self) -> None:
        self.events = dyn.DynamoEvents()
        self._graphs_before = 0
        self.started = 0.0
        self.claimed: dict[str, str] = {}  # frame id -> function key (set by doctor's entry points)
        self.captures: list[dyn.GraphCapture] = []  # graphs seen by wrapped backends

    def wrap_backend(self, backend: Any) -> Any:
        """A callable backend that records each graph Dynamo hands it, then compiles it."""
        return dyn.observing_backend(backend, self.captures.append)

    def __enter__(self) -> "Observation":
        self._graphs_before = len(reports.report().graphs)
        self.started = time.perf_counter()
        self.events.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.events.__exit__(*exc)

    # -- findings -----------------------------------------------------------------------------
    def graphs(self) -> list[GraphReport]:
        return reports.report().graphs[self._graphs_before:]

    def compiles(self) -> list[FrameCompile]:
        return self.events.compiles()

    def breaks(self) -> list[BreakInfo]:
        """Graph breaks, one per place and kind, with how often each was seen."""
        names = {c.frame_id: dyn.root_function(c.function) for c in self.compiles() if c.function}
        found: dict[tuple, BreakInfo] = {}
        for event in self.events.breaks:
            code = event.location.line if event.location else ""
            advice = advise_break(event.detail, code)
            key = (event.location.filename if event.location else "", event.location.lineno if event.location else 0,
                   advice.key)
            if key in found:
                previous = found[key]
                found[key] = BreakInfo(previous.reason, previous.location, previous.advice, previous.count + 1,
                                       previous.function)
            else:
                found[key] = BreakInfo(event.reason, event.location, advice, 1,
                                       names.get(dyn.frame_of(event.compile_id), ""))
        return list(found.values())

    def recompiles(self, dynamic: bool = False) -> list[RecompileInfo]:
        compiles = self.compiles()
        files = sorted({c.filename for c in compiles if c.filename})
        names = {c.frame_id: c for c in compiles if c.function}
        result = []
        for compile_ in compiles:
            if not compile_.recompile_reason or compile_.fail_type:
                continue
            where = dyn.guard_user_frame(compile_.recompile_reason, files)
            guard = dyn.guard_text(compile_.recompile_reason)
            first = names.get(compile_.frame_id, compile_)
            result.append(RecompileInfo(
                dyn.root_function(first.function), first.filename, compile_.compile_id, guard,
                dyn.parse_shape_change(compile_.recompile_reason), where,
                recompile_advice(guard, where.line if where else "", dynamic)))
        return result

    def limit_hits(self) -> list[RecompileLimitHit]:
        hits = list(self.events.limit_hits)
        if not hits:  # the warning was not seen: read the failed compile's record instead
            limit_name, limit = dyn.recompile_limit()
            names = {c.frame_id: c for c in self.compiles() if c.function}
            for compile_ in self.compiles():
                if compile_.fail_reason and "recompile limit" in compile_.fail_reason.lower():
                    first = names.get(compile_.frame_id, compile_)
                    hits.append(RecompileLimitHit(first.function, first.filename, first.firstlineno,
                                                  limit_name, limit, compile_.recompile_reason or ""))
        return hits

    def graph_findings(self) -> list[GraphFinding]:
        """Host syncs captured inside graphs, with their user line when a wrapped backend saw them."""
        found: dict[tuple, GraphFinding] = {}
        for capture in self.captures:
            for site in capture.ops:
                advice = advise_graph_op(site.op)
                key = (site.location.filename, site.location.lineno) if site.location else (capture.compile_id, site.op)
                if advice and key not in found:
                    found[key] = GraphFinding(capture.compile_id or "?", site.op, advice, site.location)
        if self.captures:
            return list(found.values())
        result = []
        for graph in self.graphs():
            for op in dict.fromkeys(graph.aten_ops):
                advice = advise_graph_op(op)
                if advice:
                    result.append(GraphFinding(graph.name, op, advice))
        return result

    def functions(self, entries: dict[str, FunctionStats] | None = None) -> list[FunctionStats]:
        """Per-function statistics: the doctor's entry points (``entries``, keyed by function key)
        when given, plus one group per root function for frames no entry point claimed."""
        stats: dict[str, FunctionStats] = dict(entries or {})
        first_of_frame: dict[str, FrameCompile] = {}
        for compile_ in self.compiles():
            if compile_.function and compile_.frame_id not in first_of_frame:
                first_of_frame[compile_.frame_id] = compile_
        for compile_ in self.compiles():
            key = self._key_of(compile_.frame_id, first_of_frame)
            if key not in stats:
                first = first_of_frame.get(compile_.frame_id, compile_)
                stats[key] = FunctionStats(dyn.root_function(first.function) or "?", first.filename, first.firstlineno)
            stats[key].compiles.append(compile_)
        for graph in self.graphs():
            key = self._key_of(dyn.frame_of(graph.compile_id), first_of_frame)
            if key in stats:
                stats[key].graphs.append(graph)
        for recompile in self.recompiles():
            key = self._key_of(dyn.frame_of(recompile.compile_id), first_of_frame)
            if key in stats:
                stats[key].recompiles.append(recompile)
        for hit in self.limit_hits():
            for key, stat in stats.items():
                if any(c.function == hit.function and c.filename == hit.filename for c in stat.compiles):
                    stat.limit_hits.append(hit)
                    break
        return [s for s in stats.values() if s.compiles or s.calls]

    def _key_of(self, frame_id: str, first_of_frame: dict[str, FrameCompile]) -> str:
        if frame_id in self.claimed:
            return self.claimed[frame_id]
        first = first_of_frame.get(frame_id)
        if first is None:
            return f"frame {frame_id}"
        return function_key(dyn.root_function(first.function), first.filename)


def function_key(name: str, filename: str) -> str:
    return f"{name}@{filename}"
