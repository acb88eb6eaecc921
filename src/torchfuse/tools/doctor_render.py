"""The doctor's terminal report, printed with rich.

Sections: compiled functions (with compile time against run time and a verdict), graph breaks,
recompiles, recompile-limit warnings, captured-graph findings, kernels per graph. User text (code
lines, paths, reasons) is escaped so that rich never reads ``x[:, 0]`` as markup, and prose lines do
not wrap so that ``file:line`` stays on one line.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from torchfuse.diagnostics.summary import format_bytes
from torchfuse.tools.advice import recompile_limit_advice

if TYPE_CHECKING:
    from torchfuse.tools.doctor import DoctorResult


def render(result: "DoctorResult", console: Any = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or logged: wide enough that tables stay readable
            console = Console(width=max(console.width, 120))
    out = _Printer(console)
    console.rule(f"torchfuse doctor: {escape(os.path.basename(result.script))}")
    status = "finished" if result.exit_code == 0 and not result.error else f"exited with status {result.exit_code}"
    out.line(f"script {escape(result.script)} {status} in {result.wall_s:.2f} s")
    _functions(result, console, out)
    if result.compile_times is not None and result.functions:
        out.line(escape(str(result.compile_times)))
    _breaks(result, out)
    _recompiles(result, out)
    _limit_hits(result, console)
    _findings(result, out)
    _kernels(result, console, out)
    _cuda_graphs(result, out)
    if result.error:
        out.heading("The script raised")
        out.line(escape(result.error.rstrip().splitlines()[-1]))
    if result.html_path:
        out.line(f"\nHTML report: {escape(result.html_path)}")


class _Printer:
    def __init__(self, console: Any) -> None:
        self.console = console

    def heading(self, text: str) -> None:
        self.console.print(f"\n[bold]{text}[/bold]", soft_wrap=True)

    def line(self, text: str) -> None:
        self.console.print(text, soft_wrap=True, highlight=False)


def _where(filename: str, lineno: int) -> str:
    return escape(f"{filename}:{lineno}")


def _functions(result: "DoctorResult", console: Any, out: _Printer) -> None:
    if not result.functions:
        out.heading("No compiled function ran.")
        return
    table = Table(title="Compiled functions", title_justify="left")
    for column in ("function", "calls", "graphs", "recompiles", "compile s", "run s", "paid off"):
        table.add_column(column, justify="left" if column == "function" else "right")
    for stats in result.functions:
        paid, _ = stats.verdict()
        mark = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "?"}[paid]
        table.add_row(escape(stats.name), str(stats.calls), str(stats.graph_count), str(len(stats.recompiles)),
                      f"{stats.compile_s:.3f}", f"{stats.run_s:.3f}", mark)
    console.print(table)
    for stats in result.functions:
        _, why = stats.verdict()
        out.line(f"  {escape(stats.name)} ({_where(stats.filename, stats.lineno)}): "
                 f"{stats.graph_count} graph(s) over {len(stats.compiles)} compile(s); {escape(why)}")


def _breaks(result: "DoctorResult", out: _Printer) -> None:
    if not result.breaks:
        out.heading("Graph breaks: none")
        return
    out.heading(f"Graph breaks: {len(result.breaks)} (the code after each runs eagerly, outside the graph)")
    for info in result.breaks:
        times = f" ({info.count}x)" if info.count > 1 else ""
        inside = f" in {escape(info.function)}" if info.function else ""
        out.line(f"  [bold]{_where(info.file, info.line)}[/bold]{inside}{times}: {escape(info.code)}")
        out.line(f"      reason: {escape(info.reason)}")
        out.line(f"      {escape(info.advice.title)}")
        out.line(f"      [green]fix:[/green] {escape(info.advice.fix)}")


def _recompiles(result: "DoctorResult", out: _Printer) -> None:
    if not result.recompiles:
        out.heading("Recompiles: none")
        return
    out.heading(f"Recompiles: {len(result.recompiles)}")
    advised: set[tuple[str, str]] = set()
    by_function: dict[str, list] = {}
    for recompile in result.recompiles:
        by_function.setdefault(recompile.function, []).append(recompile)
    for function, recompiles in by_function.items():
        out.line(f"  {escape(function)} ({escape(recompiles[0].filename)}): {len(recompiles)} recompile(s)")
        for recompile in recompiles:
            where = ""
            if recompile.where is not None:
                at = _where(recompile.where.filename, recompile.where.lineno)
                where = f"  (from {at}: {escape(recompile.where.line)})"
            out.line(f"    [{escape(recompile.compile_id)}] guard failed: {escape(recompile.guard)}")
            if recompile.change is not None:
                out.line(f"        changed: {escape(str(recompile.change))}{where}")
            elif where:
                out.line(f"       {where}")
        for recompile in recompiles:
            if (function, recompile.advice.key) not in advised:
                advised.add((function, recompile.advice.key))
                out.line(f"    {escape(recompile.advice.title)}")
                out.line(f"    [green]fix:[/green] {escape(recompile.advice.fix)}")


def _limit_hits(result: "DoctorResult", console: Any) -> None:
    for hit in result.limit_hits:
        advice = recompile_limit_advice(hit.limit_name, hit.limit)
        text = (f"[bold]RECOMPILE LIMIT HIT: {escape(hit.function)} ({_where(hit.filename, hit.lineno)})[/bold]\n"
                f"It was compiled {hit.limit} times, hit torch._dynamo.config.{hit.limit_name} ({hit.limit}) and now "
                "RUNS IN EAGER MODE: no compiled code, no speedup.\n"
                f"Last failed guard: {escape(hit.last_reason)}\n"
                f"[green]fix:[/green] {escape(advice.fix)}")
        console.print(Panel(text, title="WARNING", border_style="red"))


def _findings(result: "DoctorResult", out: _Printer) -> None:
    if result.findings:
        out.heading("Inside the captured graphs")
        for finding in result.findings:
            where = (f"[bold]{_where(finding.file, finding.line)}[/bold]: {escape(finding.location.line)}"
                     if finding.location else f"graph {escape(finding.graph)}")
            out.line(f"  {where}")
            out.line(f"      `{escape(finding.op)}` in the graph: {escape(finding.advice.title)}")
            out.line(f"      [green]fix:[/green] {escape(finding.advice.fix)}")


def _kernels(result: "DoctorResult", console: Any, out: _Printer) -> None:
    if not result.graphs:
        return
    function_of = {id(g): s.name for s in result.functions for g in s.graphs}
    fused = [g for g in result.graphs if g.kind != "eager"]
    unfused = [g for g in result.graphs if g.kind == "eager"]
    if fused:
        table = Table(title="Kernels per graph", title_justify="left")
        for column in ("graph", "function", "kind", "kernels", "ATen calls", "replace eager kernels",
                       "bytes moved", "eager bytes"):
            table.add_column(column, justify="left" if column in ("graph", "function", "kind") else "right")
        for graph in fused:
            generated = len(graph.generated_kernels)
            table.add_row(graph.name, escape(function_of.get(id(graph), "?")), graph.kind, str(generated),
                          str(len(graph.kernels) - generated), str(graph.eager_kernel_count),
                          format_bytes(graph.bytes_moved), format_bytes(graph.eager_bytes))
        console.print(table)
    if unfused:
        out.heading("Graphs run unfused")
        by_function: dict[str, list] = {}
        for graph in unfused:
            by_function.setdefault(function_of.get(id(graph), "?"), []).append(graph)
        for function, graphs in by_function.items():
            counts = ", ".join(f"{g.name}: {g.eager_kernel_count}" for g in graphs)
            out.line(f"  {escape(function)}: {len(graphs)} graph(s) ran as captured, eager kernels each ({counts})")
        out.line("  CPU graphs run as captured when no C++ compiler is found (install g++ or set CXX); "
                 "options={'target': 'triton'} fuses them in Triton's interpreter")


# What a user can do about each reason a call ran without its CUDA graph (mode="reduce-overhead").
CUDA_GRAPH_FIXES = {
    "warm-up": "expected: each input shape runs once without a graph before it is recorded",
    "too many input shapes": "pad inputs to a few fixed shapes (each shape is recorded separately)",
    "outputs of the previous call": "run backward before the next forward, or use mode='default' for this model",
    "a static input moved": "keep inputs that do not change at one address (update them in place with copy_)",
    "recording failed": "move the sync (.item(), .tolist(), data-dependent shapes) out of the compiled code",
    "an input is a": "move every input of the compiled code to the GPU",
    "the graph does not run on a CUDA device": "CUDA graphs need CUDA tensors",
    "part of the graph runs on the CPU": "create the small tensors the code makes on the GPU (device=...)",
}


def _cuda_graphs(result: "DoctorResult", out: _Printer) -> None:
    graphs = [g for g in result.graphs if g.cudagraphs]
    if not graphs:
        return
    out.heading("CUDA graphs (mode='reduce-overhead')")
    for graph in graphs:
        counts = graph.cudagraphs
        out.line(f"  {escape(graph.name)} ({graph.kind}): {counts.get('replayed', 0)} call(s) replayed, "
                 f"{counts.get('recorded', 0)} recording(s)")
        for reason, calls in counts.items():
            if reason in ("replayed", "recorded"):
                continue
            fix = next((text for start, text in CUDA_GRAPH_FIXES.items() if start in reason), "")
            out.line(f"      {calls} x {escape(reason)}" + (f"  [green]fix:[/green] {escape(fix)}" if fix else ""))
