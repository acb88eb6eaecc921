"""Helpers for the op-level correctness tests (elementwise, views, reductions).

``check_outputs`` compiles a function that returns a tuple of named results and compares
every result with eager, reporting all mismatches at once so a grouped test stays readable.
Floats are compared element by element against a float64 reference: the compiled value
must be as close to float64 as eager is (twice eager's error), or within the dtype's
relative tolerance. Integers and bools must equal eager exactly. NaN and +-inf must appear
exactly where eager has them.
"""
from __future__ import annotations

import math

import torch

import torchfuse
from conftest import DEVICE, compile_strict, to_float64

NAN, INF = math.nan, math.inf
# Relative tolerance per dtype (a few ulps of the compute precision).
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6, torch.float64: 1e-12}
ATOL = {torch.float16: 1e-5, torch.bfloat16: 1e-4, torch.float32: 1e-7, torch.float64: 1e-14}

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_DTYPES = [torch.int32, torch.int64]
ALL_DTYPES = [torch.bool, *INT_DTYPES, *FLOAT_DTYPES]

# Values that exercise IEEE edge cases; appended to random inputs.
SPECIALS = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.0]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def floats(shape, dtype, low=-4.0, high=4.0, specials=SPECIALS, seed=0) -> torch.Tensor:
    """Uniform values in [low, high) with ``specials`` written over the first elements."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low
    flat = x.view(-1)
    count = min(len(specials), flat.numel())
    flat[:count] = torch.tensor(specials[:count], dtype=torch.float64)
    return x.to(dtype).to(DEVICE)


def ints(shape, dtype, low=-20, high=20, seed=0, nonzero=False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return (torch.randint(0, 2, shape, generator=gen) == 1).to(DEVICE)
    x = torch.randint(low, high, shape, generator=gen, dtype=torch.int64)
    if nonzero:
        x = torch.where(x == 0, torch.ones_like(x), x)
    return x.to(dtype).to(DEVICE)


def values(shape, dtype, seed=0, **kwargs) -> torch.Tensor:
    if dtype.is_floating_point:
        return floats(shape, dtype, seed=seed, **kwargs)
    return ints(shape, dtype, seed=seed, **{k: v for k, v in kwargs.items() if k in ("low", "high", "nonzero")})


def compare(actual, expected, reference=None, name: str = "result", check_strides: bool = False,
            scale_tol: bool = False) -> list[str]:
    """Mismatches between one compiled result and eager (empty when they agree)."""
    if not isinstance(expected, torch.Tensor):
        if isinstance(expected, float) and math.isnan(expected):
            return [] if isinstance(actual, float) and math.isnan(actual) else [f"{name}: {actual} != nan"]
        return [] if actual == expected else [f"{name}: {actual!r} != {expected!r}"]
    if not isinstance(actual, torch.Tensor):
        return [f"{name}: got {type(actual).__name__}, eager gives a tensor"]
    if actual.shape != expected.shape:
        return [f"{name}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"]
    if actual.dtype != expected.dtype:
        return [f"{name}: dtype {actual.dtype} != eager {expected.dtype}"]
    problems = []
    if check_strides and actual.numel() > 1 and _strides(actual) != _strides(expected):
        problems.append(f"{name}: strides {actual.stride()} != eager {expected.stride()}")
    actual, expected = actual.cpu(), expected.cpu()
    if not expected.is_floating_point():
        if not torch.equal(actual, expected):
            bad = (actual != expected).nonzero()[:5].tolist()
            problems.append(f"{name}: differs from eager at {bad}: got {actual[tuple(zip(*bad))].tolist() if bad else ''}"
                            f" expected {expected[tuple(zip(*bad))].tolist() if bad else ''}")
        return problems
    a, e = actual.double(), expected.double()
    ref = e if reference is None else reference.cpu().double()
    nan_e, nan_a = torch.isnan(e), torch.isnan(a)
    if not torch.equal(nan_a, nan_e):
        where = (nan_a != nan_e).nonzero()[:5].tolist()
        problems.append(f"{name}: NaN pattern differs from eager at {where} "
                        f"(got {a[nan_a != nan_e][:5].tolist()}, eager {e[nan_a != nan_e][:5].tolist()})")
        return problems
    inf_e = torch.isinf(e)
    if not torch.equal(a[inf_e], e[inf_e]) or torch.isinf(a[~inf_e & ~nan_e]).any():
        where = ((torch.isinf(a) | inf_e) & (a != e)).nonzero()[:5].tolist()
        problems.append(f"{name}: +-inf differs from eager at {where}")
        return problems
    finite = ~nan_e & ~inf_e
    if not torch.isfinite(ref[finite]).all():  # eager finite where float64 is not: compare to eager
        ref = torch.where(torch.isfinite(ref), ref, e)
    dtype = expected.dtype
    err = (a - ref).abs()
    eager_err = (e - ref).abs()
    allowed = torch.maximum(2 * eager_err, ATOL[dtype] + RTOL[dtype] * ref.abs())
    if scale_tol and finite.any():  # a sum's error scales with its terms: use eager's worst
        allowed = torch.maximum(allowed + RTOL[dtype] * ref[finite].abs().max(), 4 * eager_err[finite].max())
    bad = finite & (err > allowed)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        sel = tuple(zip(*idx))
        problems.append(f"{name}: {int(bad.sum())} values off at {idx}: got {a[sel].tolist()}, "
                        f"eager {e[sel].tolist()}, float64 {ref[sel].tolist()}")
    return problems


def _strides(t: torch.Tensor) -> tuple:
    """Strides that matter: those of dims longer than 1 (others never change an address)."""
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def check_outputs(fn, *args, names=None, reference=True, check_strides=False, dynamic=None, compiled=None,
                  scale_tol=False):
    """Compile ``fn`` (Triton, strict), run it on ``args`` and compare every output with eager.

    Returns the compiled outputs. ``reference=False`` skips the float64 run (for ops whose
    float64 version means something else, such as casts). ``scale_tol`` also allows the
    dtype's relative tolerance of the output's largest value, and 4x eager's largest error
    anywhere in the output (for sums, whose rounding error scales with their terms and
    summation order, not with the result).
    """
    compiled = compiled or compile_strict(fn, dynamic=dynamic)
    actual = compiled(*args)
    expected = fn(*args)
    ref = fn(*to_float64(args)) if reference else None
    single = not isinstance(expected, (tuple, list))
    expected_l = [expected] if single else list(expected)
    names = names or [f"output{k}" for k in range(len(expected_l))]
    if single:
        actual, expected, ref = (actual,), (expected,), (ref,) if ref is not None else None
    problems = []
    for n, a, e, r in _flatten(names, actual, expected, ref):
        if isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) and r.shape != e.shape:
            r = None
        problems += compare(a, e, r, n, check_strides, scale_tol)
    assert not problems, "\n".join(problems)
    return actual


def _flatten(names, actual, expected, ref):
    """(name, actual, expected, reference) per tensor, through nested tuples (max.dim, var_mean)."""
    assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), \
        f"{len(actual) if isinstance(actual, (tuple, list)) else 1} outputs, eager has {len(expected)}"
    refs = list(ref) if ref is not None else [None] * len(expected)
    for n, a, e, r in zip(names, actual, expected, refs):
        if isinstance(e, (tuple, list)):
            inner = [f"{n}[{k}]" for k in range(len(e))]
            yield from _flatten(inner, a, e, r)
        else:
            yield n, a, e, r


def fallbacks() -> list[str]:
    """ATen ops that ran without a lowering in the graphs compiled since the last reset."""
    return [op for g in torchfuse.report().graphs for op in g.fallbacks]


def compile_errors() -> list[str]:
    return [g.error for g in torchfuse.report().graphs if g.error]
