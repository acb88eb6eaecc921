"""What `torchfuse bench` shows and writes: a terminal table, results.md, results.json, results.png."""
from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torchfuse.bench.runner import CaseResult

COMPILED = ("inductor", "torchfuse")


def environment(device: torch.device) -> dict[str, str]:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": device.type}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    else:
        from torchfuse.runtime import cpp_build

        env["cpu"] = _cpu_name()
        env["threads"] = str(torch.get_num_threads())
        env["compiler"] = cpp_build.find_compiler() or "none"
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def geomean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _fmt(value: float | int | None, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec) + suffix


def rows(results: list[CaseResult], copy_gbs: float) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows, shared by the terminal and Markdown renderings."""
    header = ["case", "suite", "eager ms", "inductor ms", "torchfuse ms", "inductor x", "torchfuse x",
              "peak MB e/i/t", "kernels e/i/t", "BW % copy i/t", "tf error", "ok"]
    table = []
    for r in results:
        if r.skipped:
            table.append([r.case, r.suite, f"skipped: {r.skipped}"] + [""] * (len(header) - 3))
            continue
        ms = [_fmt(r.ms.get(b), ".3f") if b not in r.errors else "fail" for b in ("eager", *COMPILED)]
        table.append([
            r.case, r.suite, *ms,
            *(_fmt(r.speedup(b), ".2f", "x") for b in COMPILED),
            "/".join(_fmt(r.peak_mb.get(b), ".0f") for b in ("eager", *COMPILED)),
            "/".join(_fmt(r.kernels.get(b), "d") for b in ("eager", *COMPILED)),
            "/".join(_fmt(100 * r.bandwidth_fraction(b, copy_gbs), ".0f") for b in COMPILED),
            _fmt(r.rel_err.get("torchfuse"), ".1e") + ("" if r.error_against == "float64" else " vs eager"),
            "ok" if r.accurate("torchfuse") else ("-" if "torchfuse" not in r.rel_err else "BAD"),
        ])
    return header, table


def compile_rows(results: list[CaseResult]) -> tuple[list[str], list[list[str]]]:
    """The compile-time table: whole first calls, the part inside each backend, torchfuse's warm/cold."""
    header = ["case", "cold s ind/tf", "warm s ind/tf/dyn", "in backend cold s ind/tf",
              "in backend warm s ind/tf", "tf warm/cold: whole, in backend"]
    table = []
    for r in results:
        if r.skipped:
            continue
        table.append([
            r.case,
            "/".join(_fmt(r.cold_s.get(b), ".2f") for b in COMPILED),
            "/".join(_fmt(r.warm_s.get(b), ".2f") for b in (*COMPILED, "dynamo")),
            "/".join(_fmt(r.backend_cold_s.get(b), ".3f") for b in COMPILED),
            "/".join(_fmt(r.backend_warm_s.get(b), ".3f") for b in COMPILED),
            f"{_ratio(r.warm_s, r.cold_s)}, {_ratio(r.backend_warm_s, r.backend_cold_s)}",
        ])
    return header, table


def _ratio(warm: dict[str, float], cold: dict[str, float], backend: str = "torchfuse") -> str:
    if not warm.get(backend) or not cold.get(backend):
        return "-"
    return _fmt(100 * warm[backend] / cold[backend], ".0f", "%")


def summary_lines(results: list[CaseResult], copy_gbs: float) -> list[str]:
    lines = []
    for suite in ("micro", "models"):
        done = [r for r in results if r.suite == suite and not r.skipped]
        if done:
            means = ", ".join(f"{b} {geomean([r.speedup(b) for r in done]):.2f}x" for b in COMPILED)
            lines.append(f"{suite}: geometric-mean speedup over eager: {means}")
    if not math.isnan(copy_gbs):
        lines.append(f"copy bandwidth (read + write) measured in this run: {copy_gbs:.0f} GB/s")
    return lines


def markdown(results: list[CaseResult], env: dict[str, str], copy_gbs: float, repeats: int, quick: bool) -> str:
    header, table = rows(results, copy_gbs)
    where = ", ".join(f"{k} {v}" for k, v in env.items())
    lines = [f"# torchfuse bench", "", f"{where}; median of {repeats} rounds{' (--quick: not a benchmark)' if quick else ''}.",
             "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    notes = {r.case: r.note for r in results if r.note}
    lines += ["", *summary_lines(results, copy_gbs), "", "Compile time:", ""]
    header, table = compile_rows(results)
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    lines += ["", "Cases:"]
    lines += [f"- {case}: {note}" for case, note in notes.items()]
    lines += ["", "x: speedup over eager. cold: first call with empty disk caches (Dynamo, AOTAutograd, the "
                  "backend, its compiler); warm: the same in a later process per backend with the disk caches "
                  "filled; dyn: Dynamo's capture alone (backend=\"eager\"), the floor under any warm time; "
                  "in backend: the part of a first call inside the backend (AOTAutograd and after, "
                  "Dynamo's call_user_compiler timer); work a backend defers to the first run is "
                  "not in it (torchfuse's Triton kernels compile at their first launch). A full "
                  "garbage collection runs before each timed first call. "
                  "peak MB: memory a call allocates beyond what was live before it. BW % copy: "
                  "(inputs + outputs bytes) / time, against a device-to-device copy. err: relative "
                  "Frobenius error of torchfuse's outputs against float64 (or eager where noted)."]
    failures = [f"- {r.case} / {b}: {msg.splitlines()[0] if msg else ''}" for r in results for b, msg in r.errors.items()]
    if failures:
        lines += ["", "Failures:", *failures]
    return "\n".join(lines) + "\n"


def print_table(results: list[CaseResult], copy_gbs: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, Console().width))
    for title, (header, table) in (("torchfuse bench", rows(results, copy_gbs)), ("compile time", compile_rows(results))):
        rich_table = Table(title=title)
        for name in header:
            rich_table.add_column(name, justify="left" if name in ("case", "suite") else "right")
        for row in table:
            rich_table.add_row(*row)
        console.print(rich_table)
    for line in summary_lines(results, copy_gbs):
        console.print(line)


def bar_chart(results: list[CaseResult], path: Path) -> bool:
    """Speedup over eager per case and compiled backend; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in results if not r.skipped]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(done)), 4))
    width = 0.38
    for i, backend in enumerate(COMPILED):
        values = [r.speedup(backend) if not math.isnan(r.speedup(backend)) else 0 for r in done]
        ax.bar([x + (i - 0.5) * width for x in range(len(done))], values, width, label=backend)
    ax.axhline(1.0, color="gray", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(done)), [r.case for r in done], rotation=30, ha="right")
    ax.set_ylabel("speedup over eager")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_all(results: list[CaseResult], env: dict[str, str], copy_gbs: float, repeats: int, quick: bool,
              out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    print_table(results, copy_gbs)
    (out_dir / "results.md").write_text(markdown(results, env, copy_gbs, repeats, quick))
    payload = {"env": env, "copy_gbs": copy_gbs, "repeats": repeats, "quick": quick,
               "results": [asdict(r) for r in results]}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    wrote = ["results.md", "results.json"] + (["results.png"] if bar_chart(results, out_dir / "results.png") else [])
    print(f"wrote {', '.join(str(out_dir / name) for name in wrote)}")
