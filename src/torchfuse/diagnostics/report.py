"""``torchfuse.report()``: the graphs compiled in this process, as one ``Report``.

The pipeline records each ``GraphReport`` here once its graph is compiled (``record``); the
report reads as text (``str``) or as one HTML page (``to_html``, drawn by ``html.py``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from torchfuse.diagnostics.compile_times import CompileTimes, snapshot
from torchfuse.diagnostics.html import render_report
from torchfuse.diagnostics.model import GraphReport, KernelReport
from torchfuse.frontend import aot_cache, linear_groups
from torchfuse.frontend.dynamo_events import current_compile_id
from torchfuse.runtime import aot_store, launch


@dataclass
class Report:
    graphs: list[GraphReport]

    def __str__(self) -> str:
        if not self.graphs:
            return "torchfuse: nothing compiled yet"
        launches = launch.stats.summary()
        return "\n".join([*(str(g) for g in self.graphs), str(self.compile_times),
                          *filter(None, [launches, linear_groups.summary()]), self.warm_cache])

    @property
    def warm_cache(self) -> str:
        """What the warm cache did in this process, with every reason a graph was not cached."""
        damaged = f"; {aot_store.stats.damaged} damaged entries deleted" if aot_store.stats.damaged else ""
        return str(aot_cache.stats) + damaged

    @property
    def compile_times(self) -> CompileTimes:
        """Where this process's compile time went (Dynamo, AOTAutograd, torchfuse, compilers)."""
        return snapshot(self.graphs)

    @property
    def kernels(self) -> list[KernelReport]:
        return [k for g in self.graphs for k in g.kernels]

    def to_html(self, path: str | None = None, title: str = "torchfuse fusion report") -> str:
        """Write one self-contained HTML page (no scripts or styles from elsewhere) with, for
        each graph, its kernels drawn as a graph, bytes moved, refused fusions and kernel
        sources. Returns the HTML; writes it to ``path`` when given."""
        page = render_report(self.graphs, title=title)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
        return page


_graphs: list[GraphReport] = []
_lock = threading.Lock()


def record(graph: GraphReport) -> None:
    """Add a compiled graph, stamped with the id of the Dynamo compile it belongs to."""
    if graph.compile_id is None:
        graph.compile_id = current_compile_id()
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
