"""The HTML fusion report: one self-contained page (inline CSS and SVG; no scripts, no CDN).

For each graph: a drawing of its kernels as a graph (laid out here in layers: inputs on top, each
kernel one layer below the lowest kernel it reads from), which ATen ops each kernel runs, the
buffers between kernels with their sizes, bytes each kernel reads and writes against what eager
moves for the same ops, every refused fusion with its reason, and each kernel's generated source.
A pure function of the data model, so ``Report.to_html`` can call it without reaching up to the
tools; a tool puts its own findings at the top of the page (``preface``, e.g. the doctor's).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from torchfuse.diagnostics.model import GraphReport, KernelReport
from torchfuse.diagnostics.summary import format_bytes, summarize

BOX_W, LINE_H, GAP_X, GAP_Y, MARGIN, MAX_OPS = 270, 15, 36, 56, 20, 5
FILLS = {"pointwise": "#cfe3ff", "reduction": "#ffe08a", "scatter": "#ffc9a8", "extern": "#e2e4e8", "input": "#c8f2d4", "output": "#fbd3e9"}

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #d0d7de; padding: 3px 8px; }
th { background: #f6f8fa; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px/1.4 ui-monospace, monospace; } pre { background: #f6f8fa; padding: 8px; overflow: auto; }
.warn { border: 2px solid #cf222e; background: #ffebe9; padding: 8px 12px; font-weight: 600; }
.fix { color: #1a7f37; } .muted { color: #656d76; } .drawing { overflow: auto; border: 1px solid #d0d7de; }
svg text { font: 11px ui-monospace, monospace; } svg text.title { font-weight: 700; font-size: 12px; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_report(graphs: list[GraphReport], title: str = "torchfuse fusion report", preface: str = "") -> str:
    """The whole page as a string; ``preface`` (HTML) goes between the summary and the graphs."""
    summary = summarize(graphs)
    parts = [f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
             f"<p class='summary'>{len(graphs)} graph(s). {esc(summary)}.</p>"]
    if preface:
        parts.append(preface)
    if graphs:
        parts.append("<ul class='toc'>" + "".join(
            f"<li><a href='#{esc(g.name)}'>{esc(g.name)}</a> ({esc(g.kind)}, {len(g.kernels)} kernels)</li>"
            for g in graphs) + "</ul>")
    parts += [_graph_section(g) for g in graphs]
    parts.append("</body></html>\n")
    return "\n".join(parts)


# -- one graph ---------------------------------------------------------------------------------------
def _graph_section(graph: GraphReport) -> str:
    head = (f"<section class='graph' id='{esc(graph.name)}'>"
            f"<h2>{esc(graph.name)} ({esc(graph.kind)}, target {esc(graph.target)})</h2>")
    if graph.kind == "eager" or not graph.kernels:
        ops = "".join(f"<li><code>{esc(op)}</code></li>" for op in graph.aten_ops)
        note = ("ran as captured, unfused (CPU without a C++ compiler; install g++ or set CXX to fuse it)"
                if graph.kind == "eager" else "no kernels")
        error = f"<p class='warn'>Fell back to ATen: {esc(graph.error)}</p>" if graph.error else ""
        return f"{head}{error}<p>{esc(note)}: {graph.eager_kernel_count} eager kernels.</p><ol>{ops}</ol></section>"
    moved, eager = graph.bytes_moved, graph.eager_bytes
    lines = [head, f"<p>{len(graph.generated_kernels)} generated kernels and "
                   f"{len(graph.kernels) - len(graph.generated_kernels)} ATen calls replace "
                   f"{graph.eager_kernel_count} eager kernels; they move {format_bytes(moved)} where eager moves "
                   f"{format_bytes(eager)}.</p>"]
    if graph.error:
        lines.append(f"<p class='warn'>Fell back to ATen: {esc(graph.error)}</p>")
    lines.append(f"<div class='drawing'>{draw_graph(graph)}</div>")
    lines.append(_kernel_table(graph))
    lines.append(_decisions(graph))
    if graph.fallbacks:
        lines.append(f"<p>No lowering (ran as ATen): <code>{esc(', '.join(sorted(set(graph.fallbacks))))}</code></p>")
        for op, reason in sorted(graph.fallback_reasons.items()):
            lines.append(f"<p><code>{esc(op)}</code>: {esc(reason)}</p>")
    for kernel in graph.kernels:
        if kernel.source:
            lines.append(f"<details class='source'><summary>{esc(kernel.name)} source</summary>"
                         f"<pre><code>{esc(kernel.source)}</code></pre></details>")
    lines.append("</section>")
    return "\n".join(lines)


def _kernel_table(graph: GraphReport) -> str:
    rows = ["<table class='kernels'><tr><th>kernel</th><th>kind</th><th>ATen ops</th><th>reads</th>"
            "<th>writes</th><th>bytes read</th><th>bytes written</th><th>eager bytes</th></tr>"]
    for k in graph.kernels:
        reads = ", ".join(f"{a.name} {a.shape}" for a in k.reads)
        writes = ", ".join(f"{a.name} {a.shape}" for a in k.writes)
        rows.append(f"<tr><td><a href='#{esc(graph.name)}-{esc(k.name)}'>{esc(k.name)}</a></td><td>{esc(k.label)}</td>"
                    f"<td><code>{esc(', '.join(k.ops))}</code></td><td><code>{esc(reads)}</code></td>"
                    f"<td><code>{esc(writes)}</code></td><td class='num'>{format_bytes(k.bytes_read)}</td>"
                    f"<td class='num'>{format_bytes(k.bytes_written)}</td>"
                    f"<td class='num'>{format_bytes(k.eager_bytes)}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _decisions(graph: GraphReport) -> str:
    if not graph.decisions:
        return "<p>Refused fusions: none.</p>"
    items = "".join(f"<li><code>{esc(d.node)}</code> not fused into <code>{esc(d.kernel)}</code>: {esc(d.reason)}</li>"
                    for d in graph.decisions)
    return f"<h3>Refused fusions ({len(graph.decisions)})</h3><ul class='refused'>{items}</ul>"


# -- the drawing ---------------------------------------------------------------------------------------
@dataclass
class _Box:
    key: str
    kind: str  # a kernel kind, "input" or "output"
    lines: list[str]
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    preds: list[str] = field(default_factory=list)
    anchor: str = ""

    @property
    def height(self) -> float:
        return 10 + LINE_H * len(self.lines)


def _kernel_lines(kernel: KernelReport) -> list[str]:
    ops = [op.removeprefix("aten.").removesuffix(".default") for op in kernel.ops]
    shown = ops[:MAX_OPS] + ([f"+{len(ops) - MAX_OPS} more"] if len(ops) > MAX_OPS else [])
    traffic = f"R {format_bytes(kernel.bytes_read)} W {format_bytes(kernel.bytes_written)}"
    return [f"{kernel.name} ({kernel.label})", *shown, f"{traffic} | eager {format_bytes(kernel.eager_bytes)}"]


def _boxes(graph: GraphReport) -> tuple[dict[str, _Box], list[tuple[str, str, str]]]:
    """Boxes (inputs, kernels, outputs) and edges (from, to, label)."""
    boxes: dict[str, _Box] = {}
    producer: dict[str, str] = {}
    sizes: dict[str, str] = {}
    for kernel in graph.kernels:
        for access in kernel.writes:
            producer[access.name] = kernel.name
            sizes[access.name] = format_bytes(access.bytes)
    edges: list[tuple[str, str, str]] = []
    for kernel in graph.kernels:
        box = _Box(kernel.name, kernel.label, _kernel_lines(kernel), anchor=f"{graph.name}-{kernel.name}")
        boxes[kernel.name] = box
        for access in kernel.reads:
            source = producer.get(access.name)
            if source is None:
                source = f"in:{access.name}"
                if source not in boxes:
                    boxes[source] = _Box(source, "input", [access.name, f"{access.shape} {format_bytes(access.bytes)}"])
            box.preds.append(source)
            edges.append((source, kernel.name, f"{access.name} {format_bytes(access.bytes)}"))
    for name in dict.fromkeys(graph.output_buffers):
        source = producer.get(name)  # outputs that are inputs passed through (saved for backward) are not drawn
        if source is not None:
            lines = [f"output {name}", sizes.get(name, "")]
            boxes[f"out:{name}"] = _Box(f"out:{name}", "output", lines, preds=[source])
            edges.append((source, f"out:{name}", ""))
    return boxes, edges


def _layout(boxes: dict[str, _Box]) -> tuple[float, float]:
    """Layers by longest path from the inputs; within a layer, order by the mean x of predecessors."""
    for box in boxes.values():  # boxes are in dependency order: kernels come topologically sorted
        box.layer = 1 + max((boxes[p].layer for p in box.preds if p in boxes), default=-1)
    for box in boxes.values():  # an input sits right above its first reader, not all on top
        if box.kind == "input":
            readers = [b.layer for b in boxes.values() if box.key in b.preds]
            box.layer = max(min(readers, default=1) - 1, 0)
    layers: dict[int, list[_Box]] = {}
    for box in boxes.values():
        layers.setdefault(box.layer, []).append(box)
    y = float(MARGIN)
    width = 0.0
    for number in sorted(layers):
        row = layers[number]
        if number > 0:
            row.sort(key=lambda b: sum(boxes[p].x for p in b.preds) / max(len(b.preds), 1))
        for position, box in enumerate(row):
            box.x, box.y = MARGIN + position * (BOX_W + GAP_X), y
        width = max(width, MARGIN * 2 + len(row) * (BOX_W + GAP_X) - GAP_X)
        y += max(b.height for b in row) + GAP_Y
    return width, y - GAP_Y + MARGIN


def draw_graph(graph: GraphReport) -> str:
    """An inline SVG of the graph's kernels and the buffers between them."""
    boxes, edges = _boxes(graph)
    width, height = _layout(boxes)
    parts = [f"<svg class='kernel-graph' xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
             f"viewBox='0 0 {width:.0f} {height:.0f}' role='img' aria-label='kernels of {esc(graph.name)}'>",
             "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
             "orient='auto-start-reverse'><path d='M 0 0 L 10 5 L 0 10 z' fill='#57606a'/></marker></defs>"]
    for source, target, label in edges:
        a, b = boxes[source], boxes[target]
        x1, y1, x2, y2 = a.x + BOX_W / 2, a.y + a.height, b.x + BOX_W / 2, b.y
        middle = (y1 + y2) / 2
        parts.append(f"<path class='edge' d='M {x1:.0f} {y1:.0f} C {x1:.0f} {middle:.0f}, {x2:.0f} {middle:.0f}, "
                     f"{x2:.0f} {y2 - 2:.0f}' fill='none' stroke='#57606a' stroke-width='1.3' "
                     "marker-end='url(#arrow)'/>")
        if label:
            parts.append(f"<text class='edge-label' x='{(x1 + x2) / 2 + 4:.0f}' y='{middle:.0f}' "
                         f"fill='#57606a'>{esc(label)}</text>")
    for box in boxes.values():
        css = "kernel" if box.kind not in ("input", "output") else box.kind
        shape = (f"<rect class='{css} {esc(box.kind)}' x='{box.x:.0f}' y='{box.y:.0f}' width='{BOX_W}' "
                 f"height='{box.height:.0f}' rx='6' fill='{FILLS.get(box.kind, '#eeeeee')}' stroke='#444c56'/>")
        texts = [f"<text class='{'title' if i == 0 else 'line'}' x='{box.x + 8:.0f}' "
                 f"y='{box.y + 2 + LINE_H * (i + 1):.0f}'>{esc(_clip(line))}</text>"
                 for i, line in enumerate(box.lines)]
        group = f"<g id='{esc(box.anchor)}'>" if box.anchor else "<g>"
        parts.append(group + f"<title>{esc(chr(10).join(box.lines))}</title>" + shape + "".join(texts) + "</g>")
    parts.append("</svg>")
    return "".join(parts)


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
