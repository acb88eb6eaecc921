"""One OpInfo op on its samples, in this process: eager, a float64 reference, and each backend.

The judge (``compare``) and the runner (``run_op_side_by_side``) of ``scripts/opinfo_sweep.py``.
Every backend runs on the same sample objects: eager and the reference are computed once per
sample, and each backend gets its own fresh copy of the sample's tensors (ops may write them).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

OUTCOMES = ("pass", "mismatch", "error", "skip")
_SEVERITY = {"mismatch": 3, "error": 2, "pass": 1, "skip": 0}

# Ops whose results are not a function of their inputs (fresh random numbers or uninitialized
# memory). Most random ops are also caught by running eager twice (see ``run_sample``); this list
# holds the ones that can repeat by chance (uninitialized memory often does).
NONDETERMINISTIC = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "bernoulli", "normal", "uniform", "multinomial", "randint", "randint_like", "rand_like",
    "randn_like", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "cauchy", "exponential", "geometric", "log_normal", "torch.ops.aten._efficientzerotensor",
}

# Tolerances against the float64 reference, per dtype: |actual - ref| <= atol + rtol * |ref|.
TOLERANCE = {"float32": (1e-5, 1e-4), "float64": (1e-10, 1e-9), "float16": (1e-3, 2e-2), "bfloat16": (1e-2, 3e-2)}

# Substrings of errors after which a CUDA context is unusable (the worker must be restarted).
_CUDA_FATAL = ("illegal memory access", "device-side assert", "unspecified launch failure", "CUDA error: an illegal")


@dataclass
class SampleResult:
    index: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0  # this backend's compile and run of the sample
    sample: str = ""  # the sample's inputs, for a mismatch or an error (to reproduce it)


@dataclass
class OpResult:
    """One backend's results on one op's samples."""

    name: str
    outcome: str
    samples: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def first_detail(self) -> str:
        worst = [s for s in self.samples if s.outcome == self.outcome]
        return worst[0].detail if worst else (self.samples[0].detail if self.samples else "")

    @property
    def first_bad(self) -> SampleResult | None:
        return next((s for s in self.samples if s.outcome == self.outcome), None)


def worst_outcome(samples: list[SampleResult]) -> str:
    return max((s.outcome for s in samples), key=_SEVERITY.__getitem__, default="skip")


@dataclass(frozen=True)
class Backend:
    """A compiler to compare with eager: torchfuse with a target, or Inductor."""

    name: str  # "torchfuse" or "inductor"
    target: str = "cpp"  # torchfuse's target; unused for Inductor

    @property
    def label(self) -> str:
        return "inductor" if self.name == "inductor" else f"torchfuse {self.target}"

    def compiler(self) -> Callable[[Callable], Callable]:
        import torch

        if self.name == "inductor":
            return lambda fn: torch.compile(fn, backend="inductor", dynamic=False)
        import torchfuse

        target = self.target
        return lambda fn: torchfuse.compile(fn, dynamic=False, options={"strict": True, "target": target})


# ---------------------------------------------------------------------------------------------
# Comparing results


def compare(actual: Any, expected: Any, reference: Any, dtype_name: str,
            tolerance: tuple[float, float] | None = None) -> str | None:
    """None when ``actual`` matches eager's ``expected``; else why not.

    NaN must appear exactly where eager has NaN; where eager is infinite the compiled value must
    be the same infinity; elsewhere the compiled value must be as close to the float64
    ``reference`` as eager is (twice eager's error), or within the dtype's tolerance of it, or
    within torch.testing's float32 default of eager. ``tolerance`` (atol, rtol) replaces the
    dtype's against the reference.
    """
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
        differ = a != e
        if not differ.any():
            return None
        at = _first(differ)
        return (f"{_count(differ)} of {e.numel()} elements differ (exact dtype), first at {at}: "
                f"{a[at].item()} vs eager {e[at].item()}")
    return _compare_floats(a, e, r, tolerance or TOLERANCE.get(dtype_name, TOLERANCE["float32"]))


def _compare_floats(a, e, r, tolerance: tuple[float, float]) -> str | None:
    """Element by element (see ``compare``); a failure names the worst element's index and values."""
    import torch

    a, e, r = a.to(torch.float64), e.to(torch.float64), r.to(torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        parts = []
        if (nan_a & ~nan_e).any():
            at = _first(nan_a & ~nan_e)
            parts.append(f"NaN where eager has a number at {_count(nan_a & ~nan_e)} elements "
                         f"(first {at}: eager {e[at].item():.6g})")
        if (nan_e & ~nan_a).any():
            at = _first(nan_e & ~nan_a)
            parts.append(f"a number where eager has NaN at {_count(nan_e & ~nan_a)} elements "
                         f"(first {at}: {a[at].item():.6g})")
        return "; ".join(parts)
    inf_e = torch.isinf(e)
    wrong_inf = inf_e & (a != e)
    if wrong_inf.any():
        at = _first(wrong_inf)
        return (f"{_count(wrong_inf)} elements differ where eager is infinite "
                f"(first {at}: {a[at].item():.6g} vs eager {e[at].item():.6g})")
    finite = torch.isfinite(e)
    extra_inf = finite & ~torch.isfinite(a)
    if extra_inf.any():
        at = _first(extra_inf)
        return (f"{_count(extra_inf)} infinities where eager is finite "
                f"(first {at}: {a[at].item():.6g} vs eager {e[at].item():.6g})")
    ref = torch.where(torch.isfinite(r), r, e)
    atol, rtol = tolerance
    error = (a - ref).abs()
    allowed = torch.maximum(2 * (e - ref).abs(), atol + rtol * ref.abs())
    near_eager = (a - e).abs() <= 1e-5 + 1.3e-6 * e.abs()
    bad = finite & (error > allowed) & ~near_eager
    if not bad.any():
        return None
    excess = torch.where(bad, error - allowed, torch.full_like(error, -math.inf))
    at = _index(int(excess.argmax()), e.shape)
    return (f"{_count(bad)} of {e.numel()} elements out of tolerance, worst at {at}: {a[at].item():.8g} vs eager "
            f"{e[at].item():.8g}, float64 {ref[at].item():.8g} "
            f"(|diff| {error[at].item():.3g}, allowed {allowed[at].item():.3g})")


def _count(mask) -> int:
    return int(mask.sum().item())


def _first(mask) -> tuple[int, ...]:
    """The index of the first true element of a boolean tensor."""
    import torch

    return _index(int(mask.reshape(-1).to(torch.uint8).argmax()), mask.shape)


def _index(flat: int, shape) -> tuple[int, ...]:
    """The multi-dimensional index of a flat (row-major) position."""
    index = []
    for size in reversed(tuple(shape)):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


# ---------------------------------------------------------------------------------------------
# Samples


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


def describe(sample) -> str:
    """The sample's arguments in a line: tensors as dtype[shape] with strides and offset when unusual."""
    import torch

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            text = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
            if value.layout == torch.strided and not value.is_contiguous():
                text += f" stride {value.stride()}"
            if value.layout == torch.strided and value.storage_offset():
                text += f" offset {value.storage_offset()}"
            return text if value.layout == torch.strided else f"{text} {value.layout}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(one(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}={one(v)}" for k, v in value.items()) + "}"
        return repr(value)

    parts = [one(sample.input)] + [one(a) for a in sample.args] + [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)[:400]


def _samples(op, device: str, dtype, max_samples: int | None) -> Iterator[Any]:
    """The op's first ``max_samples`` samples; an exception building one is yielded, then stops."""
    try:
        for index, sample in enumerate(op.sample_inputs(device, dtype, requires_grad=False)):
            if max_samples is not None and index >= max_samples:
                return
            yield sample
    except Exception as error:  # noqa: BLE001 - OpInfo's sample generator failed
        yield error


# ---------------------------------------------------------------------------------------------
# Running


# notify(label, index, None) before a backend compiles a sample; notify(label, index, result) with
# each result.
Notify = Callable[[str, int, "SampleResult | None"], None]


class CudaContextLost(RuntimeError):
    """A kernel broke the CUDA context: nothing more can run in this process.

    ``results`` holds what the sample's backends got before (by label), the failing one included.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.results: dict[str, SampleResult] = {}


def run_sample(op, sample, index: int, backends: list[Backend], dtype_name: str, has_float64: bool,
               notify: Notify | None = None) -> dict[str, SampleResult]:
    """One sample: eager (twice, to catch randomness), a float64 reference, then each backend."""
    import torch

    tensors, rebuild = _split_tensors((sample.input, sample.args, sample.kwargs))

    def fn(*inputs):
        first, args, kwargs = rebuild(list(inputs))
        return op.op(first, *args, **kwargs)

    def everyone(outcome: str, detail: str) -> dict[str, SampleResult]:
        return {b.label: SampleResult(index, outcome, detail) for b in backends}

    try:
        expected = fn(*_clone(tensors))
        again = fn(*_clone(tensors))
    except Exception as error:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        _check_cuda(error)
        return everyone("skip", f"eager fails: {_first_line(error)}")
    if compare(again, expected, None, dtype_name) is not None:
        return everyone("skip", "nondeterministic (eager differs between two runs)")
    reference = None
    if has_float64:
        try:
            reference = fn(*_clone(tensors, torch.float64))
        except Exception as error:  # noqa: BLE001 - no float64 reference: eager's result is the reference
            _check_cuda(error)
            reference = None
    results: dict[str, SampleResult] = {}
    for backend in backends:
        if notify:
            notify(backend.label, index, None)
        try:
            results[backend.label] = _run_backend(backend, fn, tensors, expected, reference, index, dtype_name)
        except CudaContextLost as lost:
            lost.results = {**results, backend.label: lost.results[""]}
            lost.results[backend.label].sample = describe(sample)
            raise
        if results[backend.label].outcome in ("mismatch", "error"):
            results[backend.label].sample = describe(sample)
        if notify:
            notify(backend.label, index, results[backend.label])
    return results


def _run_backend(backend: Backend, fn: Callable, tensors: list, expected: Any, reference: Any, index: int,
                 dtype_name: str) -> SampleResult:
    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    try:
        actual = backend.compiler()(fn)(*_clone(tensors))
        _synchronize()  # a failing kernel reports here, as this backend's error
    except Exception as error:  # noqa: BLE001 - the compiler failed: an error, not a crash of the sweep
        result = SampleResult(index, "error", f"{type(error).__name__}: {_first_line(error)}", _since(start))
        try:
            _check_cuda(error)
        except CudaContextLost as lost:
            lost.results[""] = result
            raise
        return result
    seconds = _since(start)
    try:
        why = compare(actual, expected, reference, dtype_name)
    except Exception as error:  # noqa: BLE001 - the sweep's own failure: never a pass
        return SampleResult(index, "error", f"sweep: comparing: {type(error).__name__}: {_first_line(error)}", seconds)
    if why:
        return SampleResult(index, "mismatch", why, seconds)
    # A pass where Dynamo captured no graph (the op ran eagerly) tested nothing of ours: say so.
    compiled_none = counters["stats"]["unique_graphs"] == graphs_before
    return SampleResult(index, "pass", "no graph compiled (ran eagerly)" if compiled_none else "", seconds)


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _check_cuda(error: BaseException) -> None:
    """Raise ``CudaContextLost`` when ``error`` left the CUDA context unusable."""
    import torch

    fatal = any(marker in str(error) for marker in _CUDA_FATAL)
    if not fatal and torch.cuda.is_initialized():
        try:  # a sticky error makes every later CUDA call fail: try one
            torch.ones(1, device="cuda").add_(1).item()
        except Exception:  # noqa: BLE001 - any failure here means the context is gone
            fatal = True
    if fatal:
        raise CudaContextLost(_first_line(error)) from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    # Dynamo wraps backend errors; the useful line is the innermost one it quotes.
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        if "Error" in line and "BackendCompilerFailed" not in line and "backend=" not in line:
            return line.strip()[:300]
    return (lines[0] if lines else repr(error))[:300]


def run_op_side_by_side(name: str, backends: list[Backend], dtype_name: str, max_samples: int | None,
                        device: str = "cpu", notify: Notify | None = None) -> dict[str, OpResult]:
    """Every sample of one op through every backend; Dynamo's caches are reset before and after.

    Returns each backend's results by its label. ``notify(label, index, None)`` is called before
    a backend compiles a sample and ``notify(label, index, result)`` with each result (a worker
    tells its parent, which then knows whom to blame for a hang or a crash, and keeps the results
    so far).
    Raises ``CudaContextLost`` (with the results so far in its ``op_results``) when a kernel broke
    the CUDA context.
    """
    import torch
    import torch._dynamo

    op = all_ops()[name]
    dtype = getattr(torch, dtype_name)
    device_type = torch.device(device).type
    samples: dict[str, list[SampleResult]] = {b.label: [] for b in backends}

    def finish() -> dict[str, OpResult]:  # a backend's seconds: its compiles and runs, not eager's
        return {label: OpResult(name, worst_outcome(s), s, round(sum(r.seconds for r in s), 3))
                for label, s in samples.items()}

    def everyone(index: int, detail: str, outcome: str = "skip") -> dict[str, OpResult]:
        for label in samples:
            samples[label].append(SampleResult(index, outcome, detail))
        return finish()

    torch._dynamo.reset()
    if name in NONDETERMINISTIC or op.name in NONDETERMINISTIC:
        return everyone(0, "random or nondeterministic op")
    if dtype not in op.supported_dtypes(device_type):
        return everyone(0, f"no {dtype_name} samples on {device_type}")
    has_float64 = torch.float64 in op.supported_dtypes(device_type)
    told: set[tuple[str, int]] = set()

    def tell(label: str, index: int, result: SampleResult | None) -> None:
        if result is not None:
            told.add((label, index))
        if notify:
            notify(label, index, result)

    torch.manual_seed(0)  # the samples' values depend only on the op: a rerun of one op remakes them
    try:
        for index, sample in enumerate(_samples(op, device, dtype, max_samples)):
            if isinstance(sample, Exception):  # OpInfo could not build the sample: nothing to compare
                everyone(index, f"samples fail: {_first_line(sample)}")
                break
            torch.manual_seed(index)
            try:
                results = run_sample(op, sample, index, backends, dtype_name, has_float64, tell)
            except CudaContextLost:
                raise
            except Exception as error:  # noqa: BLE001 - the sweep's own failure (e.g. comparing): never a pass
                _check_cuda(error)
                detail = f"sweep: {type(error).__name__}: {_first_line(error)}"
                results = {b.label: SampleResult(index, "error", detail) for b in backends}
            for label, result in results.items():
                samples[label].append(result)
                if (label, index) not in told:  # a result for every backend (eager failed, say)
                    tell(label, index, result)
    except CudaContextLost as lost:  # the sample's results so far; its other backends did not run
        for label in samples:
            not_run = SampleResult(index, "skip", f"not run: CUDA context lost ({lost})")
            samples[label].append(lost.results.get(label) or not_run)
        lost.op_results = finish()  # type: ignore[attr-defined]
        raise
    finally:
        torch._dynamo.reset()
    return finish()


def run_op(name: str, target: str, backend: str, dtype_name: str, max_samples: int | None,
           device: str = "cpu") -> OpResult:
    """One backend's results on one op (what the tests run)."""
    chosen = Backend(backend, target)
    return run_op_side_by_side(name, [chosen], dtype_name, max_samples, device)[chosen.label]


def configure_dynamo() -> None:
    """Settings for a process that compiles thousands of one-sample functions."""
    import warnings

    import torch._dynamo

    warnings.filterwarnings("ignore")
    # Every sample compiles a new closure of the same code object: Dynamo counts those as
    # recompiles of one frame, and the default limit (8) would fall back to eager silently.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 100000)
    torch._dynamo.config.suppress_errors = False

