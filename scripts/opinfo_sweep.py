"""OpInfo sweep: every op of PyTorch's ``op_db`` on its sample inputs, compiled and compared with eager.

    python scripts/opinfo_sweep.py --target cpp --json sweep-cpp.json
    python scripts/opinfo_sweep.py --target triton --ops add,sum,cat
    python scripts/opinfo_sweep.py --backend inductor --json sweep-inductor.json

Each sample's outcome is one of:
  pass      the compiled result matches eager (float64 reference decides the tolerance)
  mismatch  a wrong result (the worst outcome)
  error     the compiler raised (torchfuse's strict mode turns internal errors into exceptions)
  skip      eager itself fails, the op is random/nondeterministic, or it has no samples of the dtype
An op's outcome is its worst sample's (mismatch > error > pass; skip when every sample skipped).

Ops run in a worker process: an op that hangs past ``--timeout`` or crashes the process is recorded
as an error and the worker is restarted, so one op never ends the sweep.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# Run from a checkout without installing: the worktree's src/ comes first.
_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

OUTCOMES = ("pass", "mismatch", "error", "skip")
_SEVERITY = {"mismatch": 3, "error": 2, "pass": 1, "skip": 0}

# Ops whose results are not a function of their inputs (fresh random numbers or uninitialized
# memory). Most random ops are also caught by running eager twice (see ``_is_nondeterministic``);
# this list holds the ones that can repeat by chance (uninitialized memory often does).
NONDETERMINISTIC = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "bernoulli", "normal", "uniform", "multinomial", "randint", "randint_like", "rand_like",
    "randn_like", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "cauchy", "exponential", "geometric", "log_normal", "torch.ops.aten._efficientzerotensor",
}

# Tolerances against the float64 reference, per dtype: |actual - ref| <= atol + rtol * |ref|.
TOLERANCE = {"float32": (1e-5, 1e-4), "float64": (1e-10, 1e-9), "float16": (1e-3, 2e-2), "bfloat16": (1e-2, 3e-2)}


@dataclass
class SampleResult:
    index: int
    outcome: str
    detail: str = ""


@dataclass
class OpResult:
    name: str
    outcome: str
    samples: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def first_detail(self) -> str:
        worst = [s for s in self.samples if s.outcome == self.outcome]
        return worst[0].detail if worst else (self.samples[0].detail if self.samples else "")


# ---------------------------------------------------------------------------------------------
# Comparing results


def compare(actual: Any, expected: Any, reference: Any, dtype_name: str,
            tolerance: tuple[float, float] | None = None) -> str | None:
    """None when ``actual`` matches eager's ``expected``; else why not.

    NaN must appear exactly where eager has NaN; where eager is infinite the compiled value must
    be the same infinity; elsewhere the compiled value must be as close to the float64
    ``reference`` as eager is (twice eager's error), or within the dtype's tolerance of it, or
    within torch.testing's default tolerance of eager. ``tolerance`` (atol, rtol) replaces the
    dtype's against the reference.
    """
    import torch
    from torch.utils._pytree import tree_flatten

    flat_a, spec_a = tree_flatten(actual)
    flat_e, spec_e = tree_flatten(expected)
    flat_r, spec_r = tree_flatten(reference) if reference is not None else (None, None)
    if spec_a != spec_e:
        return f"output structure {spec_a} != eager's {spec_e}"
    if flat_r is None or spec_r != spec_e:
        flat_r = flat_e
    for i, (a, e, r) in enumerate(zip(flat_a, flat_e, flat_r)):
        why = _compare_leaf(a, e, r, dtype_name, tolerance)
        if why:
            return f"output {i}: {why}"
    return None


def _compare_leaf(a: Any, e: Any, r: Any, dtype_name: str, tolerance: tuple[float, float] | None = None) -> str | None:
    import torch

    if not isinstance(e, torch.Tensor):
        if isinstance(a, torch.Tensor):
            return f"tensor where eager has {type(e).__name__}"
        if isinstance(e, float) and isinstance(a, float):
            return None if (math.isnan(a) and math.isnan(e)) or math.isclose(a, e, rel_tol=1e-5, abs_tol=1e-6) else f"{a} != {e}"
        return None if a == e else f"{a!r} != {e!r}"
    if not isinstance(a, torch.Tensor):
        return f"{type(a).__name__} where eager has a tensor"
    if a.shape != e.shape:
        return f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"dtype {a.dtype} != {e.dtype}"
    if a.device != e.device:
        return f"device {a.device} != {e.device}"
    if a.layout != e.layout:
        return f"layout {a.layout} != {e.layout}"
    if e.layout != torch.strided:  # sparse results: compare their dense values
        a, e = a.to_dense(), e.to_dense()
        r = r.to_dense() if isinstance(r, torch.Tensor) and r.layout != torch.strided else r
    a, e = a.detach().cpu(), e.detach().cpu()
    r = r.detach().cpu() if isinstance(r, torch.Tensor) and r.shape == e.shape else e
    if e.is_complex():  # resolve_conj: view_as_real refuses a lazily conjugated tensor
        a, e = (torch.view_as_real(v.resolve_conj()) if v.is_complex() else v for v in (a, e))
        r = torch.view_as_real(r.resolve_conj()) if r.is_complex() else e
        if a.shape != e.shape:
            return "complex where eager is real (or the reverse)"
    if not e.is_floating_point():
        return None if torch.equal(a, e) else f"{_count(a != e)} of {e.numel()} elements differ (exact dtype)"
    return _compare_floats(a, e, r, tolerance or TOLERANCE.get(dtype_name, TOLERANCE["float32"]))


def _compare_floats(a, e, r, tolerance: tuple[float, float]) -> str | None:
    import torch

    a, e, r = a.to(torch.float64), e.to(torch.float64), r.to(torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        return f"NaN where eager has a number at {_count(nan_a & ~nan_e)} elements, number where eager has NaN at {_count(nan_e & ~nan_a)}"
    inf_e = torch.isinf(e)
    if not torch.equal(a[inf_e], e[inf_e]):
        return f"{_count(a[inf_e] != e[inf_e])} elements differ where eager is infinite"
    finite = torch.isfinite(e)
    if not torch.isfinite(a[finite]).all():
        return f"{_count(~torch.isfinite(a[finite]))} infinities where eager is finite"
    ref = torch.where(torch.isfinite(r), r, e)[finite]
    a, e = a[finite], e[finite]
    atol, rtol = tolerance
    allowed = torch.maximum(2 * (e - ref).abs(), atol + rtol * ref.abs())
    near_eager = (a - e).abs() <= 1e-5 + 1.3e-6 * e.abs()
    bad = ((a - ref).abs() > allowed) & ~near_eager
    if bad.any():
        worst = int(((a - ref).abs() - allowed).argmax())
        return (f"{_count(bad)} of {e.numel()} elements out of tolerance, e.g. {a[worst].item():.6g} vs eager "
                f"{e[worst].item():.6g} (float64 {ref[worst].item():.6g})")
    return None


def _count(mask) -> int:
    return int(mask.sum().item())


# ---------------------------------------------------------------------------------------------
# Running one op


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def all_ops() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_key(op): op for op in op_db}


def _split_tensors(args: Any) -> tuple[list, Callable[[list], Any]]:
    """The tensors among ``args`` (graph inputs) and a function putting new tensors in their place."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(args)
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors: list) -> Any:
        new = list(leaves)
        for slot, tensor in zip(slots, tensors):
            new[slot] = tensor
        return tree_unflatten(new, spec)

    return [leaves[i] for i in slots], rebuild


def _clone(tensors: list, dtype=None) -> list:
    """Fresh copies (ops may write their inputs), keeping strides; floats cast to ``dtype`` if given."""
    import torch

    out = []
    for t in tensors:
        c = _exact_copy(t)
        if dtype is not None and c.is_floating_point():
            c = c.to(dtype)
        out.append(c)
    return out


def _exact_copy(t):
    """A copy with t's storage, offset and strides (overlapping and offset views stay so)."""
    import torch

    if t.layout != torch.strided or t.device.type == "meta":
        return t.clone()
    copy = torch.empty(0, dtype=t.dtype, device=t.device)
    return copy.set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())


def make_compiler(target: str, backend: str) -> Callable[[Callable], Callable]:
    import torch

    if backend == "inductor":
        return lambda fn: torch.compile(fn, backend="inductor", dynamic=False)
    import torchfuse

    return lambda fn: torchfuse.compile(fn, dynamic=False, options={"strict": True, "target": target})


def run_sample(op, sample, index: int, compiler: Callable[[Callable], Callable], dtype_name: str,
               has_float64: bool) -> SampleResult:
    """One sample: eager (twice, to catch randomness), a float64 reference, and the compiled op."""
    import torch

    tensors, rebuild = _split_tensors((sample.input, sample.args, sample.kwargs))

    def fn(*inputs):
        first, args, kwargs = rebuild(list(inputs))
        return op.op(first, *args, **kwargs)

    try:
        expected = fn(*_clone(tensors))
        again = fn(*_clone(tensors))
    except Exception as error:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return SampleResult(index, "skip", f"eager fails: {_first_line(error)}")
    if compare(again, expected, None, dtype_name) is not None:
        return SampleResult(index, "skip", "nondeterministic (eager differs between two runs)")
    reference = None
    if has_float64:
        try:
            reference = fn(*_clone(tensors, torch.float64))
        except Exception:  # noqa: BLE001 - no float64 reference: eager's result is the reference
            reference = None
    graphs_before = _torchfuse_graphs()
    try:
        actual = compiler(fn)(*_clone(tensors))
    except Exception as error:  # noqa: BLE001 - the compiler failed: an error, not a crash of the sweep
        return SampleResult(index, "error", f"{type(error).__name__}: {_first_line(error)}")
    why = compare(actual, expected, reference, dtype_name)
    if why:
        return SampleResult(index, "mismatch", why)
    # A pass where Dynamo captured no graph (the op ran eagerly) tested nothing of ours: say so.
    compiled_none = graphs_before is not None and _torchfuse_graphs() == graphs_before
    return SampleResult(index, "pass", "no graph compiled (ran eagerly)" if compiled_none else "")


def _torchfuse_graphs() -> int | None:
    """How many graphs torchfuse has compiled in this process (None when torchfuse is not loaded)."""
    if "torchfuse" not in sys.modules:
        return None
    import torchfuse

    return len(torchfuse.report().graphs)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    # Dynamo wraps backend errors; the useful line is the innermost one it quotes.
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        if "Error" in line and "BackendCompilerFailed" not in line and "backend=" not in line:
            return line.strip()[:300]
    return (lines[0] if lines else repr(error))[:300]


def _samples(op, dtype, max_samples: int | None):
    """The op's first ``max_samples`` samples; an exception building one is yielded, then stops."""
    try:
        for index, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            if max_samples is not None and index >= max_samples:
                return
            yield sample
    except Exception as error:  # noqa: BLE001 - OpInfo's sample generator failed
        yield error


def run_op(name: str, target: str, backend: str, dtype_name: str, max_samples: int | None) -> OpResult:
    """Every sample of one op; Dynamo's caches are reset before and after."""
    import torch
    import torch._dynamo

    op = all_ops()[name]
    dtype = getattr(torch, dtype_name)
    start = time.perf_counter()
    torch._dynamo.reset()
    if name in NONDETERMINISTIC or op.name in NONDETERMINISTIC:
        return OpResult(name, "skip", [SampleResult(0, "skip", "random or nondeterministic op")])
    if dtype not in op.supported_dtypes("cpu"):
        return OpResult(name, "skip", [SampleResult(0, "skip", f"no {dtype_name} samples")])
    has_float64 = torch.float64 in op.supported_dtypes("cpu")
    compiler = make_compiler(target, backend)
    results = []
    for index, sample in enumerate(_samples(op, dtype, max_samples)):
        if isinstance(sample, Exception):  # OpInfo could not build the sample: nothing to compare
            results.append(SampleResult(index, "skip", f"samples fail: {_first_line(sample)}"))
            break
        torch.manual_seed(index)
        try:
            results.append(run_sample(op, sample, index, compiler, dtype_name, has_float64))
        except Exception as error:  # noqa: BLE001 - the sweep's own failure (e.g. comparing): never a pass
            results.append(SampleResult(index, "error", f"sweep: {type(error).__name__}: {_first_line(error)}"))
    torch._dynamo.reset()
    outcome = max((r.outcome for r in results), key=_SEVERITY.__getitem__, default="skip")
    return OpResult(name, outcome, results, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# The worker process (crash and timeout isolation)


def _configure_worker() -> None:
    import warnings

    import torch
    import torch._dynamo

    warnings.filterwarnings("ignore")
    # Every sample compiles a new closure of the same code object: Dynamo counts those as
    # recompiles of one frame, and the default limit (8) would fall back to eager silently.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 100000)
    torch._dynamo.config.suppress_errors = False


def _worker(conn, target: str, backend: str, dtype_name: str, max_samples: int | None) -> None:
    _configure_worker()
    while True:
        name = conn.recv()
        if name is None:
            return
        try:
            result = run_op(name, target, backend, dtype_name, max_samples)
        except BaseException as error:  # noqa: BLE001 - report, keep the worker alive
            result = OpResult(name, "error", [SampleResult(0, "error", f"sweep: {type(error).__name__}: {_first_line(error)}"
                                                           f" {traceback.format_exc(limit=2)[-200:]}")])
        conn.send(asdict(result))


class Worker:
    """A process running ops one at a time; restarted after a crash or a timeout."""

    def __init__(self, target: str, backend: str, dtype_name: str, max_samples: int | None) -> None:
        self.config = (target, backend, dtype_name, max_samples)
        self.process = None
        self.conn = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, *self.config), daemon=True)
        self.process.start()

    def run(self, name: str, timeout: float) -> OpResult:
        if self.process is None or not self.process.is_alive():
            self._start()
        self.conn.send(name)
        if self.conn.poll(timeout):
            try:
                return _from_dict(self.conn.recv())
            except EOFError:
                pass
        else:
            self.stop(kill=True)
            return OpResult(name, "error", [SampleResult(0, "error", f"timeout after {timeout:.0f} s")], timeout)
        code = self.process.exitcode if self.process else None
        self.stop(kill=True)
        return OpResult(name, "error", [SampleResult(0, "error", f"worker crashed (exit code {code})")])

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.process.join(10)
        self.process = None


def _from_dict(data: dict) -> OpResult:
    return OpResult(data["name"], data["outcome"], [SampleResult(**s) for s in data["samples"]], data["seconds"])


# ---------------------------------------------------------------------------------------------
# The command line


def summarize(results: list[OpResult]) -> dict[str, Any]:
    ops = {o: sorted(r.name for r in results if r.outcome == o) for o in OUTCOMES}
    samples = {o: sum(1 for r in results for s in r.samples if s.outcome == o) for o in OUTCOMES}
    eager_only = sum(1 for r in results for s in r.samples if s.outcome == "pass" and s.detail.startswith("no graph"))
    return {"op_counts": {o: len(ops[o]) for o in OUTCOMES}, "sample_counts": samples,
            "passes_without_a_graph": eager_only, "ops": ops}


def print_summary(results: list[OpResult], label: str) -> None:
    summary = summarize(results)
    print(f"\n== {label}: {len(results)} ops")
    print("ops:     " + "  ".join(f"{o} {n}" for o, n in summary["op_counts"].items()))
    print("samples: " + "  ".join(f"{o} {n}" for o, n in summary["sample_counts"].items())
          + f"  (passes where no graph was compiled: {summary['passes_without_a_graph']})")
    by_name = {r.name: r for r in results}
    for outcome in ("mismatch", "error", "skip", "pass"):
        names = summary["ops"][outcome]
        if not names:
            continue
        print(f"\n-- {outcome} ({len(names)})")
        for name in names:
            detail = by_name[name].first_detail if outcome != "pass" else ""
            print(f"  {name}" + (f": {detail}" if detail else ""))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="", help="comma-separated op names (op_db names, e.g. add,sum,nn.functional.pad)")
    parser.add_argument("--target", default="cpp", choices=["cpp", "triton", "aten"], help="torchfuse target")
    parser.add_argument("--backend", default="torchfuse", choices=["torchfuse", "inductor"])
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    parser.add_argument("--limit", type=int, default=None, help="at most this many ops")
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many samples per op")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per op before the worker is killed")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--table", nargs="+", default=None, metavar="JSON",
                        help="print counts of several --json files side by side on the samples all of them ran")
    parser.add_argument("--update", default=None, help="a --json file: run the --ops again and replace their "
                        "results in it (after a fix), keeping the other ops")
    parser.add_argument("--resume", default=None, help="a --json file of an interrupted sweep: keep its ops "
                        "(samples beyond --max-samples dropped) and run only the others")
    return parser.parse_args(argv)


def print_table(paths: list[str]) -> None:
    """Sample and op counts of several runs, restricted to the (op, sample) pairs every run has."""
    runs = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        runs.append((data["label"], {(r["name"], s["index"]): s["outcome"] for r in data["results"] for s in r["samples"]}))
    common = set.intersection(*(set(outcomes) for _, outcomes in runs))
    print(f"{len(common)} samples of {len({op for op, _ in common})} ops ran in every run")
    print(f"{'run':28} " + " ".join(f"{o:>9}" for o in OUTCOMES) + "   ops: " + " ".join(f"{o:>8}" for o in OUTCOMES))
    for label, outcomes in runs:
        samples = {o: sum(1 for key in common if outcomes[key] == o) for o in OUTCOMES}
        per_op: dict[str, str] = {}
        for (op, _), outcome in ((key, outcomes[key]) for key in common):
            per_op[op] = max(per_op.get(op, "skip"), outcome, key=_SEVERITY.__getitem__)
        ops = {o: sum(1 for v in per_op.values() if v == o) for o in OUTCOMES}
        print(f"{label:28} " + " ".join(f"{samples[o]:>9}" for o in OUTCOMES) + "        "
              + " ".join(f"{ops[o]:>8}" for o in OUTCOMES))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print_table(args.table)
        return 0
    names = sorted(all_ops())
    if args.ops:
        wanted = [n.strip() for n in args.ops.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"unknown ops: {unknown}", file=sys.stderr)
            return 2
        names = wanted
    names = names[: args.limit] if args.limit else names
    label = "inductor" if args.backend == "inductor" else f"torchfuse {args.target}"
    worker = Worker(args.target, args.backend, args.dtype, args.max_samples)
    results, start = load_results(args.resume, args.max_samples) if args.resume else [], time.perf_counter()
    done = {r.name for r in results}
    if args.update:
        results = [r for r in load_results(args.update, args.max_samples) if r.name not in names]
        done = set()
    try:
        for i, name in enumerate(names):
            if name in done:
                continue
            result = worker.run(name, args.timeout)
            results.append(result)
            note = f": {result.first_detail[:160]}" if result.outcome in ("mismatch", "error") else ""
            print(f"[{i + 1}/{len(names)}] {name}: {result.outcome} ({len(result.samples)} samples, "
                  f"{result.seconds:.1f} s){note}", flush=True)
            if args.json and (i % 20 == 19):
                _write_json(args, label, results, time.perf_counter() - start)
    finally:
        worker.stop()
    elapsed = time.perf_counter() - start
    print_summary(results, f"{label} ({args.dtype}, {elapsed:.0f} s)")
    if args.json:
        _write_json(args, label, results, elapsed)
    return 0


def load_results(path: str, max_samples: int | None) -> list[OpResult]:
    """The ops of an earlier run, cut to the first ``max_samples`` samples (so counts stay comparable)."""
    with open(path) as f:
        data = json.load(f)
    results = []
    for raw in data["results"]:
        result = _from_dict(raw)
        if max_samples is not None and len(result.samples) > max_samples:
            result.samples = result.samples[:max_samples]
            result.outcome = max((s.outcome for s in result.samples), key=_SEVERITY.__getitem__)
        results.append(result)
    return results


def _write_json(args: argparse.Namespace, label: str, results: list[OpResult], elapsed: float) -> None:
    data = {"label": label, "target": args.target, "backend": args.backend, "dtype": args.dtype,
            "seconds": round(elapsed, 1), **summarize(results), "results": [asdict(r) for r in results]}
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
