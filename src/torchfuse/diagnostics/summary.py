"""One line about many graphs: kernels and bytes against eager, fusions made and refused.

A pure function of the data model (``model.py``), shared by ``torchfuse.explain``, the doctor and
the HTML report.
"""
from __future__ import annotations

from dataclasses import dataclass

from torchfuse.diagnostics.model import GraphReport


@dataclass(frozen=True)
class FusionSummary:
    generated_kernels: int
    extern_calls: int
    eager_kernels: int  # kernels eager launches for the same graphs (ATen ops that are not views)
    fusions: int  # fusions made
    refused: list[str]  # refused fusions with their reasons
    bytes_moved: int | None
    eager_bytes: int | None
    unfused_graphs: int  # graphs run as captured (CPU without a C++ compiler)

    def __str__(self) -> str:
        if self.unfused_graphs and not (self.generated_kernels or self.extern_calls):
            return (f"{self.unfused_graphs} graph(s) ran as captured, unfused ({self.eager_kernels} eager kernels): "
                    "CPU graphs run unfused when no C++ compiler is found (install g++ or set CXX)")
        text = (f"{self.generated_kernels} generated kernels + {self.extern_calls} ATen calls replace "
                f"{self.eager_kernels} eager kernels; {self.fusions} fusions made, {len(self.refused)} refused")
        if self.bytes_moved is not None and self.eager_bytes:
            text += f"; {format_bytes(self.bytes_moved)} moved vs {format_bytes(self.eager_bytes)} eager"
        return text


def summarize(graphs: list[GraphReport]) -> FusionSummary:
    """Kernels, fusions and bytes of the graphs, against eager."""
    compiled = [g for g in graphs if g.kind != "eager"]
    moved = [g.bytes_moved for g in compiled]
    eager = [g.eager_bytes for g in compiled]
    return FusionSummary(
        generated_kernels=sum(len(g.generated_kernels) for g in compiled),
        extern_calls=sum(len(g.kernels) - len(g.generated_kernels) for g in compiled),
        eager_kernels=sum(g.eager_kernel_count for g in graphs),
        fusions=sum(len(g.fusions) for g in compiled),
        refused=[f"{g.name}: {d}" for g in compiled for d in g.decisions],
        bytes_moved=None if not compiled or None in moved else sum(moved),  # type: ignore[arg-type]
        eager_bytes=None if not compiled or None in eager else sum(eager),  # type: ignore[arg-type]
        unfused_graphs=len(graphs) - len(compiled),
    )


def format_bytes(count: int | None) -> str:
    if count is None:
        return "?"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
