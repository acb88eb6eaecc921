"""The doctor's findings as HTML sections, put at the top of the fusion report's page.

``diagnostics/html.py`` draws the graphs; these sections (functions, graph breaks, recompiles,
findings inside the captured graphs) are the doctor's own, so they live with the doctor.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchfuse.diagnostics.html import esc

if TYPE_CHECKING:
    from torchfuse.tools.doctor import DoctorResult


def doctor_sections(result: "DoctorResult") -> str:
    """Script status, recompile-limit hits, compiled functions, breaks, recompiles and findings."""
    parts = [f"<p>Script <code>{esc(result.script)}</code> exited with status {result.exit_code} "
             f"after {result.wall_s:.2f} s.</p>"]
    for hit in result.limit_hits:
        parts.append(f"<p class='warn'>RECOMPILE LIMIT HIT: {esc(hit.function)} ({esc(hit.filename)}:{hit.lineno}) "
                     f"hit torch._dynamo.config.{esc(hit.limit_name)} ({hit.limit}) and now runs in EAGER mode.</p>")
    if result.functions:
        rows = "".join(
            f"<tr><td>{esc(s.name)}</td><td><code>{esc(s.location)}</code></td><td class='num'>{s.calls}</td>"
            f"<td class='num'>{s.graph_count}</td><td class='num'>{len(s.recompiles)}</td>"
            f"<td class='num'>{s.compile_s:.3f}</td><td class='num'>{s.run_s:.3f}</td>"
            f"<td>{esc(s.verdict()[1])}</td></tr>"
            for s in result.functions)
        parts.append("<h2>Compiled functions</h2><table><tr><th>function</th><th>where</th><th>calls</th>"
                     "<th>graphs</th><th>recompiles</th><th>compile s</th><th>run s</th><th>paid off?</th></tr>"
                     f"{rows}</table>")
    if result.breaks:
        items = "".join(f"<li><code>{esc(b.file)}:{b.line}</code> <code>{esc(b.code)}</code><br>{esc(b.reason)}<br>"
                        f"<span class='fix'>fix: {esc(b.advice.fix)}</span></li>" for b in result.breaks)
        parts.append(f"<h2>Graph breaks ({len(result.breaks)})</h2><ul class='breaks'>{items}</ul>")
    if result.recompiles:
        advised: set[tuple[str, str]] = set()
        items = ""
        for r in result.recompiles:
            where = f" (from <code>{esc(r.where)}</code>: <code>{esc(r.where.line)}</code>)" if r.where else ""
            items += f"<li>{esc(r.function)} [{esc(r.compile_id)}]: {esc(r.what_changed)}{where}"
            if (r.function, r.advice.key) not in advised:
                advised.add((r.function, r.advice.key))
                items += f"<br>{esc(r.advice.title)}<br><span class='fix'>fix: {esc(r.advice.fix)}</span>"
            items += "</li>"
        parts.append(f"<h2>Recompiles ({len(result.recompiles)})</h2><ul class='recompiles'>{items}</ul>")
    if result.findings:
        items = "".join(f"<li>{esc(f)}</li>" for f in result.findings)
        parts.append(f"<h2>Inside the captured graphs</h2><ul>{items}</ul>")
    return "\n".join(parts)
