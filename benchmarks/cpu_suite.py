#!/usr/bin/env python3
"""Eager vs Inductor (torch.compile's CPU backend) vs torchfuse (C++ target) on a CPU.

    python benchmarks/cpu_suite.py [--quick] [--cases a,b] [--repeats N] [--threads N]
    torchfuse bench                  # the same, through the CLI (what the README's main command runs)

Cases, all float32: the foundation's fusion patterns (bias + GELU, layer norm, scaled softmax,
residual add + RMSNorm, cross-entropy forward + backward), an MLP, a small transformer block
and a small convolutional network (inference). In one process, for every case and backend:

- cold compile: the first call's wall time with empty disk caches (Dynamo, AOTAutograd, the
  backend's codegen and its C++ compiler); warm compile: the first call again after every
  in-memory cache is dropped, so only the disk caches help (torchfuse's library cache and
  Inductor's FX-graph and C++ caches);
- the median time per call over ``--repeats`` rounds; backends take turns within each round,
  so a slow phase of the machine hurts all of them alike;
- the error against a float64 run of eager, checked before anything is timed.

Results go to stdout and to $OUT (default ./out) as Markdown and JSON. Only eager, Inductor
and torchfuse are imported: the suite runs on any machine with torch and a C++ compiler.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

# Cold means cold: fresh cache directories for both compilers, set before either is imported.
_CACHE_ROOT = tempfile.mkdtemp(prefix="torchfuse-cpu-suite-")
os.environ.setdefault("TORCHFUSE_CACHE_DIR", os.path.join(_CACHE_ROOT, "torchfuse"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE_ROOT, "inductor"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks import patterns  # noqa: E402

BACKENDS = ("eager", "inductor", "torchfuse")
Step = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    """``make(size)`` returns (fn, inputs, needs_grad); ``fn(*inputs)`` is one step."""

    name: str
    make: Callable[[str], tuple[Callable[..., Any], tuple, bool]]


@dataclass
class Result:
    case: str
    ms: dict[str, float] = field(default_factory=dict)
    cold_s: dict[str, float] = field(default_factory=dict)
    warm_s: dict[str, float] = field(default_factory=dict)
    graphs: dict[str, int] = field(default_factory=dict)
    # torchfuse's own stages (lowering to the loaded library), without Dynamo and AOTAutograd.
    pipeline_s: dict[str, float] = field(default_factory=dict)  # "cold" / "warm"
    rel_err: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    report: str = ""


# -- cases ------------------------------------------------------------------------------------
# (rows, cols) of the pattern inputs: 8 MB float32 activations, past the 2 MB-per-core L2.
SIZES = {"bench": {"rows_cols": (2048, 1024), "tokens_vocab": (1024, 8192), "batch": 64},
         "quick": {"rows_cols": (64, 256), "tokens_vocab": (32, 1000), "batch": 2}}


def _randn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen)


def pattern_case(name: str) -> Case:
    """A foundation pattern (benchmarks/patterns.py) with CPU-sized float32 inputs."""
    pattern = patterns.BY_NAME[name]

    def make(size: str):
        gen = torch.Generator().manual_seed(0)
        rows, cols = SIZES[size]["rows_cols"]
        if name == "bias_gelu":
            inputs = (_randn(rows, cols, gen=gen), _randn(cols, gen=gen))
        elif name == "layer_norm":
            inputs = (_randn(rows, cols, gen=gen), 1 + 0.1 * _randn(cols, gen=gen), 0.1 * _randn(cols, gen=gen))
        elif name == "scaled_softmax":
            inputs = (4 * _randn(rows, cols, gen=gen),)
        elif name == "add_rmsnorm":
            inputs = (_randn(rows, cols, gen=gen), _randn(rows, cols, gen=gen), 1 + 0.1 * _randn(cols, gen=gen))
        else:
            tokens, vocab = SIZES[size]["tokens_vocab"]
            inputs = (_randn(tokens, vocab, gen=gen).requires_grad_(), torch.randint(0, vocab, (tokens,), generator=gen))
        return pattern.fn, inputs, pattern.needs_grad

    return Case(name, make)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm GPT-style block: LN, attention (SDPA), residual, LN, GELU MLP, residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ConvNet(nn.Module):
    """Two conv-BN-ReLU stages with max pooling, global average pooling, a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(stage(3, 32), nn.MaxPool2d(2), stage(32, 64), nn.MaxPool2d(2), stage(64, 64))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _randomize_norms(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Running statistics and affine parameters away from their identity defaults."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=gen))
            module.running_var.copy_(1 + 0.1 * torch.rand(module.num_features, generator=gen))
    return model.eval()


def model_case(name: str) -> Case:
    def make(size: str):
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        batch = SIZES[size]["batch"]
        if name == "mlp":
            model, x = MLP(512, 2048), _randn(4 * batch, 512, gen=gen)
        elif name == "transformer_block":
            model, x = TransformerBlock(256, 4), _randn(max(1, batch // 8), 128, 256, gen=gen)
        else:
            model, x = ConvNet(), _randn(max(1, batch // 4), 3, 64, 64, gen=gen)
        model = _randomize_norms(model.eval(), gen)

        def fn(x: torch.Tensor, model: nn.Module = model) -> torch.Tensor:
            return model(x)

        fn.model = model  # for the float64 reference
        return fn, (x,), False

    return Case(name, make)


CASES = [pattern_case(p.name) for p in patterns.PATTERNS] + [model_case(n) for n in ("mlp", "transformer_block",
                                                                                     "convnet")]


# -- running ----------------------------------------------------------------------------------
def compiler_for(backend: str) -> Callable[[Callable], Callable]:
    if backend == "eager":
        return lambda fn: fn
    if backend == "inductor":
        return lambda fn: torch.compile(fn)
    import torchfuse

    return lambda fn: torchfuse.compile(fn)


def make_step(fn: Callable, inputs: tuple, needs_grad: bool) -> Step:
    """One call: inference under no_grad, or the pattern's own forward + backward."""
    if needs_grad:
        return lambda: fn(*inputs)

    def step() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    return step


def reference(fn: Callable, inputs: tuple, needs_grad: bool) -> Any:
    """The case in float64 (model parameters and floating inputs upcast)."""
    model = getattr(fn, "model", None)
    inputs64 = patterns.to_reference(inputs)
    if model is not None:
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            return model64(*inputs64)
    return make_step(fn, inputs64, needs_grad)()


def flat_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in flat_tensors(item)]


def rel_error(out: Any, ref: Any) -> float:
    worst = 0.0
    for got, want in zip(flat_tensors(out), flat_tensors(ref), strict=True):
        got64, want64 = got.detach().double(), want.detach().double()
        if not torch.isfinite(got64).all():
            return math.inf
        worst = max(worst, ((got64 - want64).norm() / want64.norm().clamp_min(1e-300)).item())
    return worst


def reset_compilers(drop_memory_caches: bool) -> None:
    """Forget compiled graphs; with ``drop_memory_caches`` also every in-process cache."""
    import torchfuse
    from torchfuse.runtime import cpp_build

    torch._dynamo.reset()
    torchfuse.reset()
    if drop_memory_caches:
        cpp_build.clear_memory_cache()


def pipeline_seconds() -> float:
    import torchfuse

    return sum(sum(g.stage_seconds.values()) for g in torchfuse.report().graphs)


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def first_call(backend: str, fn: Callable, inputs: tuple, needs_grad: bool) -> tuple[Step, Any, float, int]:
    """Compile ``fn`` with ``backend`` and run it once: (step, output, seconds, graphs)."""
    before = dynamo_graphs()
    step = make_step(compiler_for(backend)(fn), inputs, needs_grad)
    start = time.perf_counter()
    out = step()
    return step, out, time.perf_counter() - start, dynamo_graphs() - before


def time_steps(steps: dict[str, Step], repeats: int) -> dict[str, float]:
    """Median ms per call of each step; backends take turns within each round."""
    inner: dict[str, int] = {}
    for name, step in steps.items():
        once = []
        for _ in range(5):  # warm-up, and an estimate of one call
            start = time.perf_counter()
            step()
            once.append(time.perf_counter() - start)
        inner[name] = max(1, min(200, int(0.02 / max(statistics.median(once), 1e-6))))  # ~20 ms per sample
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(inner[name]):
                step()
            samples[name].append((time.perf_counter() - start) * 1e3 / inner[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def run_case(case: Case, size: str, backends: list[str], repeats: int) -> Result:
    import torchfuse

    result = Result(case.name)
    print(f"== {case.name}", flush=True)
    fn, inputs, needs_grad = case.make(size)
    ref = reference(fn, inputs, needs_grad)
    steps: dict[str, Step] = {}
    for backend in backends:
        try:
            reset_compilers(drop_memory_caches=False)
            step, out, seconds, graphs = first_call(backend, fn, inputs, needs_grad)
            result.rel_err[backend] = rel_error(out, ref)
            if backend != "eager":
                result.cold_s[backend], result.graphs[backend] = seconds, graphs
                if backend == "torchfuse":
                    result.report = str(torchfuse.report())
                    result.pipeline_s["cold"] = pipeline_seconds()
                # Warm: the same compile again with only the disk caches to help.
                reset_compilers(drop_memory_caches=True)
                step, out, result.warm_s[backend], _ = first_call(backend, fn, inputs, needs_grad)
                if backend == "torchfuse":
                    result.pipeline_s["warm"] = pipeline_seconds()
            steps[backend] = step
        except Exception as exc:  # one backend failing must not lose the others' numbers
            traceback.print_exc()
            result.errors[backend] = f"{type(exc).__name__}: {exc}"[:500]
    result.ms = time_steps(steps, repeats)
    for backend in backends:
        if backend in result.ms:
            cold = f"cold {result.cold_s[backend]:.2f} s, warm {result.warm_s[backend]:.2f} s" \
                if backend in result.cold_s else ""
            print(f"   {backend:9s} {result.ms[backend]:8.3f} ms  rel err {result.rel_err[backend]:.1e}  {cold}",
                  flush=True)
    reset_compilers(drop_memory_caches=False)
    return result


def accuracy_ok(result: Result) -> bool:
    """torchfuse's error against float64 is at most twice eager's (or float32 noise)."""
    tf, eager = result.rel_err.get("torchfuse"), result.rel_err.get("eager")
    return tf is not None and eager is not None and tf <= max(2 * eager, 1e-5)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def markdown(results: list[Result], header: str) -> str:
    def ms(r: Result, b: str) -> str:
        return f"{r.ms[b]:.3f}" if b in r.ms else ("fail" if b in r.errors else "-")

    def speedup(r: Result, b: str) -> str:
        return f"{r.ms['eager'] / r.ms[b]:.2f}x" if "eager" in r.ms and b in r.ms else "-"

    def secs(d: dict[str, float], b: str) -> str:
        return f"{d[b]:.2f}" if b in d else "-"

    lines = [header, "",
             "| case | eager ms | inductor ms | torchfuse ms | inductor speedup | torchfuse speedup "
             "| graphs | cold compile s (inductor / torchfuse) | warm compile s (inductor / torchfuse) "
             "| torchfuse pipeline ms (cold / warm) | rel err eager / inductor / torchfuse | accuracy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        errs = " / ".join(f"{r.rel_err[b]:.1e}" if b in r.rel_err else "-" for b in BACKENDS)
        lines.append(f"| {r.case} | {ms(r, 'eager')} | {ms(r, 'inductor')} | {ms(r, 'torchfuse')} "
                     f"| {speedup(r, 'inductor')} | {speedup(r, 'torchfuse')} | {r.graphs.get('torchfuse', '-')} "
                     f"| {secs(r.cold_s, 'inductor')} / {secs(r.cold_s, 'torchfuse')} "
                     f"| {secs(r.warm_s, 'inductor')} / {secs(r.warm_s, 'torchfuse')} "
                     f"| {1e3 * r.pipeline_s.get('cold', math.nan):.0f} / {1e3 * r.pipeline_s.get('warm', math.nan):.0f} "
                     f"| {errs} "
                     f"| {'ok' if accuracy_ok(r) else 'BAD'} |")
    means = {b: geomean([r.ms["eager"] / r.ms[b] for r in results if "eager" in r.ms and b in r.ms])
             for b in ("inductor", "torchfuse")}
    shown = [f"{b} {m:.2f}x" for b, m in means.items() if not math.isnan(m)]
    if shown:
        lines += ["", f"Geometric-mean speedup over eager: {', '.join(shown)}."]
    lines += ["", "Compile times are the first call's wall time (Dynamo, AOTAutograd and the backend); cold: "
                  "empty disk caches, warm: every in-memory cache dropped, disk caches kept. The pipeline "
                  "column is torchfuse's own part of it (lowering to the loaded library)."]
    failures = [f"- {r.case} / {b}: {msg.splitlines()[0] if msg else ''}" for r in results for b, msg in r.errors.items()]
    if failures:
        lines += ["", "Failures:", *failures]
    return "\n".join(lines) + "\n"


def environment(threads: int) -> dict[str, str]:
    import platform

    from torchfuse.runtime import cpp_build

    compiler = cpp_build.find_compiler() or "none"
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": _cpu_name(),
            "threads": str(threads), "compiler": compiler}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny inputs and few repeats (a smoke test)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per case (default 25; quick: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = "quick" if args.quick else "bench"
    repeats = args.repeats or (3 if args.quick else 25)
    backends = [b for b in args.backends.split(",") if b]
    wanted = set(filter(None, args.cases.split(",")))
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; cases: {', '.join(c.name for c in CASES)}")
    warnings.filterwarnings("ignore", category=UserWarning)
    env = environment(torch.get_num_threads())
    print(json.dumps(env), flush=True)

    results = [run_case(case, size, backends, repeats) for case in CASES if not wanted or case.name in wanted]
    table = markdown(results, f"torch {env['torch']}, {env['cpu']}, {env['threads']} threads, float32, "
                              f"size {size}; median ms per call over {repeats} rounds")
    print("\n" + table)
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cpu_suite.md").write_text(table)
    payload = {"env": env, "size": size, "repeats": repeats, "results": [asdict(r) for r in results]}
    (out_dir / "cpu_suite.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {out_dir / 'cpu_suite.md'} and {out_dir / 'cpu_suite.json'}")
    bad = [r.case for r in results if "torchfuse" in backends and not accuracy_ok(r)]
    if bad:
        print(f"torchfuse is less accurate than eager on: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
