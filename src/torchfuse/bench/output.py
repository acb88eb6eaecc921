"""What `torchfuse bench` shows and writes: a terminal table, results.md, results.json, results.png."""
from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from torchfuse.bench.bandwidth import format_bandwidths
from torchfuse.bench.profile import StepProfile, format_profiles
from torchfuse.runtime import cpp_build

if TYPE_CHECKING:
    from torchfuse.bench.runner import CaseResult

COMPILED = ("inductor", "torchfuse")
# Other modes of both compilers, columns of their own when run: CUDA graphs
# (mode="reduce-overhead"), autotuning with CUDA graphs (mode="max-autotune").
MODES = ("inductor-ro", "torchfuse-ro", "inductor-max-autotune", "torchfuse-max-autotune")


def mode_backends(results: list[CaseResult]) -> list[str]:
    return [b for b in MODES if any(b in r.ms or b in r.errors for r in results)]


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
    extra = mode_backends(results)
    header = ["case", "suite", "eager ms", "inductor ms", "torchfuse ms", "inductor x", "torchfuse x",
              *(f"{b} {unit}" for b in extra for unit in ("ms", "x")),
              "peak MB e/i/t", "kernels e/i/t", "BW % copy i/t", "tf error", "ok"]
    table = []
    for r in results:
        if r.skipped or "build" in r.errors:
            why = f"skipped: {r.skipped}" if r.skipped else f"FAILED to build: {r.errors['build']}"
            table.append([r.case, r.suite, why[:120]] + [""] * (len(header) - 4) + ["" if r.skipped else "FAIL"])
            continue
        ms = [_fmt(r.ms.get(b), ".3f") if b not in r.errors else "fail" for b in ("eager", *COMPILED)]
        table.append([
            r.case, r.suite, *ms,
            *(_fmt(r.speedup(b), ".2f", "x") for b in COMPILED),
            *(text for b in extra for text in (_fmt(r.ms.get(b), ".3f") if b not in r.errors else "fail",
                                                _fmt(r.speedup(b), ".2f", "x"))),
            "/".join(_fmt(r.peak_mb.get(b), ".0f") for b in ("eager", *COMPILED)),
            "/".join(_fmt(r.kernels.get(b), "d") for b in ("eager", *COMPILED)),
            "/".join(_fmt(100 * r.bandwidth_fraction(b, copy_gbs), ".0f") for b in COMPILED),
            _fmt(r.rel_err.get("torchfuse"), ".1e") + ("" if r.error_against == "float64" else " vs eager"),
            torchfuse_status(r),
        ])
    return header, table


def torchfuse_status(r: CaseResult) -> str:
    """The ok column: FAIL (raised), ATEN n/m (n of its m graphs ran with ATen), BAD (outside
    the bound, with how far), unchecked (no reference), ok (with the worst output's share of its
    bound), or - (torchfuse was not run)."""
    if "torchfuse" in r.errors:
        return "FAIL"
    flags = [f"ATEN {len(r.tf_fallbacks)}/{r.tf_graphs}"] if r.tf_fallbacks else []
    ratio = _fmt(r.error_ratio.get("torchfuse"), ".2f")
    if "torchfuse" in r.rel_err:
        flags.append(f"ok {ratio}" if r.accurate("torchfuse") else f"BAD {ratio}")
    elif "torchfuse" in r.ms:
        flags.append("unchecked")
    return " ".join(flags) or "-"


def problem_lines(results: list[CaseResult]) -> list[str]:
    """Every failure, mismatch and ATen fallback of the run, one line each, for every backend."""
    lines = []
    for r in results:
        backends = ["torchfuse", *(b for b in ("eager", "inductor") if b in r.errors or b in r.rel_err)]
        seen = set()
        for backend in backends:
            for problem in r.problems(backend):
                if problem not in seen:
                    seen.add(problem)
                    lines.append(f"{r.case}: {problem.splitlines()[0] if problem else ''}")
    return lines


def compile_rows(results: list[CaseResult]) -> tuple[list[str], list[list[str]]]:
    """The compile-time table: whole first calls, the part inside each backend, torchfuse's warm/cold;
    then cold/warm first calls of the other modes run, and torchfuse's autotuning in max-autotune."""
    extra = mode_backends(results)
    autotuned = "torchfuse-max-autotune" in extra
    header = ["case", "cold s ind/tf", "warm s ind/tf/dyn", "in backend cold s ind/tf",
              "in backend warm s ind/tf", "tf warm/cold: whole, in backend", "tf cold: " + SPLIT_TITLE,
              "tf warm: " + SPLIT_TITLE, *(f"{b} cold/warm s" for b in extra),
              *(["tf max-autotune: autotune s (launches timed) cold/warm"] if autotuned else [])]
    table = []
    for r in results:
        if r.skipped or "build" in r.errors:
            continue
        modes = ["/".join(_fmt(seconds.get(b), ".2f") for seconds in (r.cold_s, r.warm_s)) for b in extra]
        if autotuned:
            modes.append(" / ".join(_autotune_split(split) for split in (r.tf_autotune_split_cold,
                                                                         r.tf_autotune_split_warm)))
        table.append([
            r.case,
            "/".join(_fmt(r.cold_s.get(b), ".2f") for b in COMPILED),
            "/".join(_fmt(r.warm_s.get(b), ".2f") for b in (*COMPILED, "dynamo")),
            "/".join(_fmt(r.backend_cold_s.get(b), ".3f") for b in COMPILED),
            "/".join(_fmt(r.backend_warm_s.get(b), ".3f") for b in COMPILED),
            f"{_ratio(r.warm_s, r.cold_s)}, {_ratio(r.backend_warm_s, r.backend_cold_s)}",
            _split(r.tf_split_cold), _split(r.tf_split_warm), *modes,
        ])
    return header, table


def _autotune_split(split: dict[str, float]) -> str:
    if not split:
        return "-"
    return f"{_fmt(split.get('autotune'), '.2f')} ({split.get('autotuned', 0):.0f})"


# torchfuse's first call, split (diagnostics/compile_times.py): Dynamo's capture, AOTAutograd, our
# stages, the C++ compiler, first launches waiting for GPU compiles; then Triton's compiles in the
# workers (summed, beside the rest; the number of jobs), launches through Triton's JIT, the
# garbage collector's seconds during the call (inside the parts above) and the warm cache's hits
# and misses (captured graphs served without AOTAutograd's tracing / traced).
SPLIT_PARTS = ("capture", "aot", "ours", "cpp", "gpu_wait")
SPLIT_TITLE = "capture/aot/ours/c++/gpu wait s; workers s (jobs); jit; gc s; warm hit/miss"


def _split(split: dict[str, float]) -> str:
    if not split:
        return "-"
    return ("/".join(_fmt(split.get(part), ".2f") for part in SPLIT_PARTS)
            + f"; {_fmt(split.get('gpu_workers'), '.1f')} ({split.get('gpu_compiled', 0):.0f}); "
            f"{split.get('gpu_jit_launches', 0):.0f}; {_fmt(split.get('gc'), '.2f')}; "
            f"{split.get('aot_hits', 0):.0f}/{split.get('aot_misses', 0):.0f}")


def _ratio(warm: dict[str, float], cold: dict[str, float], backend: str = "torchfuse") -> str:
    if not warm.get(backend) or not cold.get(backend):
        return "-"
    return _fmt(100 * warm[backend] / cold[backend], ".0f", "%")


def summary_lines(results: list[CaseResult], copy_gbs: float) -> list[str]:
    lines = []
    for suite in ("micro", "models"):
        done = [r for r in results if r.suite == suite and not r.skipped and "build" not in r.errors]
        if done:
            means = ", ".join(f"{b} {geomean([r.speedup(b) for r in done]):.2f}x"
                              for b in (*COMPILED, *mode_backends(results)))
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
    lines += ["", "x: speedup over eager. -ro: mode=\"reduce-overhead\" (CUDA graphs); -max-autotune: "
                  "mode=\"max-autotune\" (Inductor: its kernel and GEMM autotuning; torchfuse: block sizes of "
                  "its Triton kernels timed at first launches, kept on disk; both with CUDA graphs); their "
                  "outputs are checked on the third call (a replay). cold: first call with empty disk caches (Dynamo, AOTAutograd, the "
                  "backend, its compiler); warm: the same in a later process per backend with the disk caches "
                  "filled; dyn: Dynamo's capture alone (backend=\"eager\"), the floor under any warm time; "
                  "in backend: the part of a first call inside the backend (AOTAutograd and after, "
                  "Dynamo's call_user_compiler timer); work a backend defers to the first run is "
                  "not in it (torchfuse's Triton kernels compile in worker processes from the end of "
                  "each graph's compile, and its first launches wait for them). tf cold/warm split: "
                  "Dynamo's capture / AOTAutograd / torchfuse's stages / the C++ compiler / first "
                  "launches waiting for GPU compiles, seconds; then the workers' compile seconds "
                  "(summed over workers) with the number of GPU compile jobs (0 in a warm process); "
                  "launches through Triton's JIT; the garbage collector's seconds during the call (part of "
                  "the above); the warm cache's hits/misses (captured graphs compiled without / with "
                  "AOTAutograd's tracing: a warm process should have no misses). tf max-autotune: the "
                  "seconds its first launches spent choosing block sizes (compiling or waiting for "
                  "candidates, timing them) and how many launches were timed (none in a warm process: "
                  "the choices come from disk). A full "
                  "garbage collection runs before each timed first call. "
                  "peak MB: memory a call allocates beyond what was live before it. BW % copy: "
                  "(inputs + outputs bytes) / time, against a device-to-device copy. tf error: the worst "
                  "relative Frobenius error of torchfuse's outputs (a training step's outputs are the loss "
                  "and every gradient) against float64 (or eager where noted); a gradient that is zero in "
                  "exact arithmetic shows a huge one in every backend. ok: the worst output's error as a "
                  "share of its bound (against float64: twice eager's error on that output, four times where "
                  "eager's own passes 10%, at least the dtype's rounding noise; against eager: 3e-2 in "
                  "bf16); BAD above 1; FAIL: torchfuse raised; "
                  "ATEN n/m: n of the m graphs torchfuse compiled ran with ATen because it could not "
                  "compile them."]
    profiled = profile_rows(results)
    if profiled:
        lines += ["", "Profile per step (--profile): wall ms (synchronized), GPU ms (summed kernel time), "
                      "host ms until the step's Python returns, and that over the kernel launches:", "",
                  "```", format_profiles(profiled), "```"]
        lines += [f"- {case} / {backend}: top kernels " + "; ".join(f"{k.name} {k.ms:.3f} ms x{k.calls:.0f}"
                                                              for k in p.top[:5]) for case, backend, p in profiled]
        lines += [f"- {line}" for line in bandwidth_lines(results, copy_gbs)]
    problems = problem_lines(results)
    if problems:
        lines += ["", "Problems:", *(f"- {line}" for line in problems)]
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
    profiled = profile_rows(results)
    if profiled:
        console.print(format_profiles(profiled), highlight=False)
        for line in bandwidth_lines(results, copy_gbs):
            console.print(line, highlight=False)
    problems = problem_lines(results)
    if problems:
        from rich.markup import escape

        console.print("[red]Problems:[/red]")
        for line in problems:  # messages quote shapes like [2, 3]: not markup
            console.print(f"[red]- {escape(line)}[/red]", highlight=False)


def bandwidth_lines(results: list[CaseResult], copy_gbs: float) -> list[str]:
    """Per profiled case and torchfuse backend: its worst generated kernels of 64 MB or more
    against the copy bandwidth (bench/bandwidth.py)."""
    return [f"{format_bandwidths(f'{r.case} / {backend}', rows)} (copy {copy_gbs:.0f} GB/s)"
            for r in results for backend, rows in r.bandwidths.items()]


def profile_rows(results: list[CaseResult]) -> list[tuple[str, str, StepProfile]]:
    """(case, backend, profile) of every case run with --profile."""
    return [(r.case, backend, p) for r in results for backend, p in r.profiles.items()]


def bar_chart(results: list[CaseResult], path: Path) -> bool:
    """Speedup over eager per case and compiled backend; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in results if not r.skipped and "build" not in r.errors]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(done)), 4))
    backends = [*COMPILED, *mode_backends(results)]
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        values = [r.speedup(backend) if not math.isnan(r.speedup(backend)) else 0 for r in done]
        ax.bar([x + (i - (len(backends) - 1) / 2) * width for x in range(len(done))], values, width, label=backend)
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
