"""``torchfuse doctor SCRIPT [ARGS...]``: run a user's script unchanged and say what compiling did.

Every ``torch.compile`` (and so every ``torchfuse.compile``) in the script is observed: the object
it returns is timed per call, and the Dynamo frames compiled during those calls are attributed to
it. At the end the doctor prints, with rich: the compiled functions (calls, graphs, recompiles,
compile time against run time, whether compiling paid off), every graph break with file:line and a
fix, every recompile with the failed guard and what changed, a loud warning for functions that hit
the recompile limit, and kernels per graph against the eager kernels they replaced.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from rich.console import Console

from torchfuse.api import backend as torchfuse_backend
from torchfuse.diagnostics import report as reports
from torchfuse.diagnostics.compile_times import CompileTimes, snapshot
from torchfuse.diagnostics.html import render_report
from torchfuse.diagnostics.model import GraphReport
from torchfuse.frontend import dynamo_events as dyn
from torchfuse.frontend.dynamo_events import RecompileLimitHit
from torchfuse.tools.doctor_html import doctor_sections
from torchfuse.tools.doctor_render import render
from torchfuse.tools.explain import break_from_error
from torchfuse.tools.observe import (BreakInfo, FunctionStats, GraphFinding, Observation, RecompileInfo,
                                     function_key)


@dataclass
class DoctorResult:
    script: str
    argv: list[str]
    exit_code: int
    wall_s: float
    functions: list[FunctionStats] = field(default_factory=list)
    breaks: list[BreakInfo] = field(default_factory=list)
    recompiles: list[RecompileInfo] = field(default_factory=list)
    limit_hits: list[RecompileLimitHit] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)
    findings: list[GraphFinding] = field(default_factory=list)
    error: str | None = None  # the script's traceback, if it raised
    html_path: str | None = None
    compile_times: CompileTimes | None = None  # where the script's compile time went

    def text(self, width: int = 120) -> str:
        """The report as plain text (what ``render`` prints, without colors)."""
        buffer = io.StringIO()
        self.render(Console(file=buffer, width=width, force_terminal=False, color_system=None))
        return buffer.getvalue()

    def render(self, console: Any = None) -> None:
        render(self, console)


# -- observing the script ---------------------------------------------------------------------------
class _EntryPoints:
    """Wraps what ``torch.compile`` returns so each call is timed and the frames Dynamo compiles
    during it are attributed to it."""

    def __init__(self, observation: Observation, compile_: bool = True) -> None:
        self.observation = observation
        self.compile = compile_
        self.stats: dict[str, FunctionStats] = {}
        self.durations: dict[str, list[float]] = {}
        self._stack: list[tuple[str, float, int]] = []

    def begin(self, key: str) -> None:
        self._stack.append((key, time.perf_counter(), self.observation.events.compile_count()))

    def end(self, key: str) -> None:
        while self._stack and self._stack[-1][0] != key:  # a call that raised left its frame
            self._stack.pop()
        if not self._stack:
            return
        _, started, first = self._stack.pop()
        elapsed = time.perf_counter() - started
        stats = self.stats[key]
        stats.calls += 1
        stats.wall_s += elapsed
        new = self.observation.events.compiles_from(first)
        stats.compile_in_calls_s += sum(c.seconds for c in new)
        for compile_ in new:
            self.observation.claimed.setdefault(compile_.frame_id, key)
        self.durations.setdefault(key, []).append(elapsed)

    def wrap(self, compiled: Any, original: Any) -> Any:
        name, filename, lineno = describe(original)
        key = function_key(name, filename)
        self.stats.setdefault(key, FunctionStats(name, filename, lineno))
        if isinstance(compiled, torch.nn.Module):
            compiled.register_forward_pre_hook(lambda *_: self.begin(key))
            compiled.register_forward_hook(lambda *_: self.end(key))
            return compiled

        @functools.wraps(original if callable(original) else compiled)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.begin(key)
            try:
                return compiled(*args, **kwargs)
            finally:
                self.end(key)

        return timed


def describe(obj: Any) -> tuple[str, str, int]:
    """A compiled object's user-facing name and where it is defined."""
    target = type(obj) if isinstance(obj, torch.nn.Module) else obj
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(obj).__name__
    try:
        filename = inspect.getsourcefile(target) or ""
        lineno = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        code = getattr(target, "__code__", None)
        filename, lineno = (code.co_filename, code.co_firstlineno) if code else ("", 0)
    return name, os.path.abspath(filename) if filename else "", lineno


@contextlib.contextmanager
def _patched_compile(entries: _EntryPoints, backend: str | None) -> Iterator[None]:
    """Replace ``torch.compile`` (which ``torchfuse.compile`` calls) by an observing one."""
    original = torch.compile

    def observed_compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(...)
            return lambda fn: observed_compile(fn, *args, **kwargs)
        if not entries.compile:  # the eager baseline: time the original, compile nothing
            return entries.wrap(model, model) if not isinstance(model, torch.nn.Module) else _hooked(entries, model)
        if backend and "backend" not in kwargs and not args:
            kwargs["backend"] = _backend_named(backend)
        if "backend" in kwargs:
            kwargs["backend"] = entries.observation.wrap_backend(kwargs["backend"])
        return entries.wrap(original(model, *args, **kwargs), model)

    torch.compile = observed_compile  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = original  # type: ignore[assignment]


def _hooked(entries: _EntryPoints, module: torch.nn.Module) -> torch.nn.Module:
    return entries.wrap(module, module)


def _backend_named(name: str) -> Any:
    return torchfuse_backend if name == "torchfuse" else name


def run_script(script: str, argv: list[str] | None = None, *, html: str | None = None,
               backend: str | None = None, baseline: bool = False) -> DoctorResult:
    """Run ``script`` as ``__main__`` with ``argv``, observed, and return the findings.

    Args:
        script: path of a Python script.
        argv: its arguments (``sys.argv[1:]`` as it will see them).
        html: write the HTML report there too.
        backend: route plain ``torch.compile`` calls to this backend (e.g. "torchfuse").
        baseline: run the script once more without compiling, to measure eager time per call.
    Returns:
        A ``DoctorResult``; ``render()`` prints it.
    """
    argv = list(argv or [])
    path = os.path.abspath(script)
    eager = _run_baseline(path, argv) if baseline else {}
    observation = Observation()
    entries = _EntryPoints(observation)
    started = time.perf_counter()
    compiled_before = snapshot(reports.report().graphs)
    exit_code, error, error_break = _execute(path, argv, observation, entries, backend)
    wall = time.perf_counter() - started
    compile_times = snapshot(reports.report().graphs).minus(compiled_before)
    for key, seconds in eager.items():
        if key in entries.stats:
            entries.stats[key].eager_s_per_call = seconds
    breaks = observation.breaks()
    if error_break is not None and not any(b.file == error_break.file and b.line == error_break.line for b in breaks):
        breaks.append(error_break)
    result = DoctorResult(
        script=path, argv=argv, exit_code=exit_code, wall_s=wall, functions=observation.functions(entries.stats),
        breaks=breaks, recompiles=observation.recompiles(), limit_hits=observation.limit_hits(),
        graphs=observation.graphs(), findings=observation.graph_findings(), error=error,
        compile_times=compile_times)
    if html:
        title = f"torchfuse doctor: {os.path.basename(path)}"
        with open(html, "w", encoding="utf-8") as handle:
            handle.write(render_report(result.graphs, title=title, preface=doctor_sections(result)))
        result.html_path = os.path.abspath(html)
    return result


def _execute(path: str, argv: list[str], observation: Observation, entries: _EntryPoints,
             backend: str | None) -> tuple[int, str | None, BreakInfo | None]:
    """Run the script; its exit status, its traceback if it raised, and a fullgraph break if any."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    exit_code, error, error_break = 0, None, None
    try:
        with observation, _patched_compile(entries, backend):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        exit_code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except dyn.unsupported_error_types() as raised:
        exit_code, error, error_break = 1, traceback.format_exc(), break_from_error(raised)
    except Exception:  # noqa: BLE001 - the script's own error is part of the report
        exit_code, error = 1, traceback.format_exc()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return exit_code, error, error_break


# -- the eager baseline -------------------------------------------------------------------------------
def _run_baseline(path: str, argv: list[str]) -> dict[str, float]:
    """Mean seconds per call of each would-be-compiled function, from a run that compiles nothing."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    # The child imports this torchfuse, installed or not (a source checkout on PYTHONPATH).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    try:
        subprocess.run([sys.executable, "-m", "torchfuse.tools.doctor", out, path, *argv], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=3600)
        with open(out, encoding="utf-8") as result:
            return json.load(result)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(out)


def _baseline_main(out: str, path: str, argv: list[str]) -> None:
    observation = Observation()
    entries = _EntryPoints(observation, compile_=False)
    with contextlib.suppress(BaseException):
        _execute(path, argv, observation, entries, None)
    means = {key: sum(times) / len(times) for key, times in entries.durations.items() if times}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(means, handle)


if __name__ == "__main__":  # the baseline run: python -m torchfuse.tools.doctor OUT SCRIPT ARGS...
    _baseline_main(sys.argv[1], sys.argv[2], sys.argv[3:])
