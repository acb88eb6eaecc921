"""Random-program fuzzing: small programs of pointwise ops, reductions, views, broadcasts, casts
and gathers, compiled with torchfuse and compared with eager (float64 reference). Inputs are odd,
zero-sized, one-element, transposed, strided, broadcast (stride 0) or offset, and hold NaN, +-inf
and signed zeros.

CI runs a few dozen programs; `TORCHFUSE_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py` runs more.
A failure is shrunk by hypothesis to a minimal program: add it to REGRESSIONS below.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchfuse
from conftest import DEVICE, TOLERANCE, assert_close, compile_strict, to_float64
from scripts.opinfo_sweep import compare

EXAMPLES = int(os.environ.get("TORCHFUSE_FUZZ_EXAMPLES", "25"))

UNARY = {
    "exp": lambda x: torch.exp(x.clamp(max=20)),
    "tanh": torch.tanh,
    "abs": torch.abs,
    "neg": torch.neg,
    "sigmoid": torch.sigmoid,
    "sqrt_abs": lambda x: torch.sqrt(x.abs()),
    "log1p_abs": lambda x: torch.log1p(x.abs()),
    "log_abs": lambda x: torch.log(x.abs()),  # -inf at 0
    "relu": torch.relu,
    "square": lambda x: x * x,
    "reciprocal": torch.reciprocal,  # inf at 0
    # Bounded: sin of exp(20) ~ 5e8 (ulp 32) is noise that no two implementations agree on.
    "sin": lambda x: torch.sin(x.clamp(-100, 100)),
    "erf": torch.erf,
    "floor": lambda x: torch.floor(x * 4),
    "sign": torch.sign,
    "nan_to_num": lambda x: torch.nan_to_num(x, 0.0, 100.0, -100.0),
    "isnan_where": lambda x: torch.where(torch.isnan(x), torch.zeros_like(x), x),
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where_pos": lambda a, b: torch.where(a > 0, a, b),
    "atan2": torch.atan2,
    "pow_abs": lambda a, b: torch.pow(a.abs(), b.clamp(-3, 3)),
    "remainder": torch.remainder,
    "eq": lambda a, b: (a == b).to(a.dtype) + a,
}
REDUCTIONS = ["sum", "amax", "amin", "mean", "var", "prod", "softmax", "log_softmax", "logsumexp", "argmax", "all_sum"]
VIEWS = ["t", "flatten", "slice", "unsqueeze_expand", "permute", "step2", "select0", "narrow_odd"]
CASTS = ["float16", "bfloat16", "float64", "int32", "bool"]
GATHERS = ["gather_argmin", "index_select_rev", "take_perm", "mask_fill"]


@dataclass(frozen=True)
class Step:
    kind: str  # "unary", "binary", "scalar", "reduce", "view", "cast", "gather"
    name: str
    arg: int = 0


def _steps() -> st.SearchStrategy:
    unary = st.builds(Step, st.just("unary"), st.sampled_from(sorted(UNARY)))
    # arg: 0 same shape, 1 broadcast over the last dim, 2 over the first, 3 a 0-d tensor
    binary = st.builds(Step, st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 3))
    scalar = st.builds(Step, st.just("scalar"), st.sampled_from(["add", "mul"]), st.integers(-3, 3))
    reduce = st.builds(Step, st.just("reduce"), st.sampled_from(REDUCTIONS), st.integers(-1, 0))
    view = st.builds(Step, st.just("view"), st.sampled_from(VIEWS))
    cast = st.builds(Step, st.just("cast"), st.sampled_from(CASTS))
    gather = st.builds(Step, st.just("gather"), st.sampled_from(GATHERS))
    return st.lists(st.one_of(unary, binary, scalar, reduce, view, cast, gather), min_size=1, max_size=6)


def run_program(steps: list[Step], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The program both eager and torchfuse run. ``y`` is a second operand of x's shape."""
    for step in steps:
        if step.kind == "unary":
            x = UNARY[step.name](x)
        elif step.kind == "binary":
            x = BINARY[step.name](x, _other(x, y, step.arg).to(x.dtype))
        elif step.kind == "scalar":
            x = x + step.arg if step.name == "add" else x * (step.arg + 0.5)
        elif step.kind == "reduce":
            x = _reduce(step.name, step.arg, x)
        elif step.kind == "view":
            x = _view(step.name, x)
        elif step.kind == "cast":
            x = _cast(step.name, x)
        elif step.kind == "gather":
            x = _gather(step.name, x)
    return x


def _other(x: torch.Tensor, y: torch.Tensor, how: int) -> torch.Tensor:
    """A second operand for x: y (or x reversed) of x's shape, a broadcast slice of it, or 0-d."""
    other = y if y.shape == x.shape else (x.flip(-1) if x.dim() >= 1 else x)
    if how == 1 and x.dim() >= 1:
        return other[..., :1]  # broadcast over the last dim
    if how == 2 and x.dim() >= 2:
        return other[:1]  # broadcast over the first dim
    if how == 3:
        return y.reshape(-1)[:1].reshape(()) if y.numel() else torch.ones((), device=y.device)
    return other


def _reduce(name: str, arg: int, x: torch.Tensor) -> torch.Tensor:
    """A reduction whose result is broadcast back to x's shape (so programs keep a shape)."""
    dim = arg if x.dim() > 1 else -1
    if x.dim() == 0 or x.shape[dim] == 0:
        return x  # eager rejects max/argmax over an empty dim; keep programs valid
    if name == "softmax":
        return torch.softmax(x, dim)
    if name == "log_softmax":
        return torch.log_softmax(x, dim)
    if name == "logsumexp":
        return torch.logsumexp(x, dim, keepdim=True) - x
    if name == "argmax":
        return x + x.argmax(dim, keepdim=True).to(x.dtype)
    if name == "all_sum":
        return x - x.sum()
    if name in ("amax", "amin"):
        return getattr(x, name)(dim, keepdim=True) + x
    return getattr(x, name)(dim, keepdim=True) * x


def _view(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "t" and x.dim() == 2:
        return x.t()
    if name == "flatten":
        return x.reshape(x.shape[0], -1) if x.dim() >= 2 else x
    if name == "slice" and x.dim() >= 1 and x.shape[-1] > 1:
        return x[..., 1:]
    if name == "unsqueeze_expand":
        return x.unsqueeze(0).expand(2, *x.shape)[1]
    if name == "permute":
        return x.permute(*reversed(range(x.dim())))
    if name == "step2" and x.dim() >= 1:
        return x[..., ::2]
    if name == "select0" and x.dim() >= 2 and x.shape[0] > 0:
        return x[-1]
    if name == "narrow_odd" and x.dim() >= 1 and x.shape[0] > 2:
        return x.narrow(0, 1, x.shape[0] - 2)
    return x


def _cast(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "int32":  # truncation of finite, in-range values only (out of range is undefined)
        return torch.nan_to_num(x, 0.0, 1e4, -1e4).clamp(-1e4, 1e4).to(torch.int32).to(x.dtype)
    if name == "bool":
        return x.to(torch.bool).to(x.dtype) * x
    # Back to x's dtype: float32 in the program, float64 in its reference (rounded the same way).
    return x.to(getattr(torch, name)).to(x.dtype)


def _gather(name: str, x: torch.Tensor) -> torch.Tensor:
    """Data-dependent and computed indices: gathers the kernels must read at runtime."""
    if x.dim() == 0 or x.numel() == 0:
        return x
    if name == "gather_argmin":
        return x + x.gather(-1, x.abs().argmin(-1, keepdim=True))
    if name == "index_select_rev":
        return x.index_select(-1, torch.arange(x.shape[-1] - 1, -1, -1, device=x.device))
    if name == "take_perm":
        n = x.numel()
        return x.reshape(-1)[(torch.arange(n, device=x.device) * 7 + 3) % n].reshape(x.shape)
    if name == "mask_fill":
        return x.masked_fill(x > x.mean(), 0.5)
    return x


SHAPES = [(5, 7), (1, 9), (3, 1), (4, 0), (2, 3, 5), (6, 33), (1, 1), (17,), (1,), (0,), (3, 0, 2), (2, 1, 13),
          (7, 129)]
LAYOUTS = ["contiguous", "transposed", "step2", "expanded", "offset"]


def _layout(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` in another layout: strided, a storage offset, or broadcast (stride 0: x's first row repeated)."""
    if name == "transposed" and x.dim() >= 2:
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    if name == "step2":
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], device=x.device, dtype=x.dtype) if x.dim() else x
        if x.dim():
            wide[..., ::2] = x
            return wide[..., ::2]
    if name == "expanded" and x.dim() >= 1 and x.shape[0] > 0:
        return x[:1].expand(x.shape)  # a broadcast input: stride 0 over the first dim
    if name == "offset":
        flat = torch.empty(x.numel() + 3, device=x.device, dtype=x.dtype)
        flat[3:] = x.reshape(-1)
        return flat[3:].view(x.shape)
    return x


@st.composite
def inputs(draw) -> tuple[torch.Tensor, torch.Tensor]:
    shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * draw(st.sampled_from([1.0, 10.0]))
    y = torch.randn(shape, generator=generator)
    if draw(st.booleans()) and x.numel() > 2:  # special values
        flat = x.view(-1)
        flat[0], flat[-1] = float("nan"), draw(st.sampled_from([float("inf"), float("-inf")]))
        flat[x.numel() // 2] = draw(st.sampled_from([0.0, -0.0, float("inf")]))
    if draw(st.booleans()) and y.numel() > 1:
        y.view(-1)[1] = draw(st.sampled_from([0.0, float("nan"), float("-inf")]))
    x = _layout(draw(st.sampled_from(LAYOUTS)), x)
    y = _layout(draw(st.sampled_from(LAYOUTS)), y)
    return x.to(DEVICE), y.to(DEVICE)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TORCHFUSE_FUZZ_EXAMPLES"),
          suppress_health_check=list(HealthCheck))
@given(steps=_steps(), tensors=inputs())
def test_random_programs_match_eager(steps, tensors):
    check_program(steps, *tensors)


def check_program(steps: list[Step], x: torch.Tensor, y: torch.Tensor) -> None:
    torchfuse.reset()
    expected = run_program(steps, x, y)
    reference = run_program(steps, *to_float64((x, y)))
    actual = compile_strict(lambda a, b: run_program(steps, a, b))(x, y)
    half = _has_half(steps)
    assert_close(actual, expected, dtype=torch.float16 if half else None, reference=reference.to(expected.dtype))
    # Element by element too: the check above scales its tolerance by the largest value. The
    # absolute tolerance is assert_close's: a chain like sin(x * x.sum(0)) amplifies a one-ulp
    # difference of a differently ordered sum to ~3e-5 (a legitimate difference, not a bug).
    tol = TOLERANCE[torch.float16 if half else torch.float32]
    why = compare(actual, expected, reference, "float16" if half else "float32", tolerance=(tol, tol))
    assert why is None, why


def _has_half(steps: list[Step]) -> bool:
    return any(s.kind == "cast" and s.name in ("float16", "bfloat16") for s in steps)


# Programs that failed once, shrunk by hypothesis; each must stay fixed.
# (steps, shape, scale of x). Explicit, value-level tests of the same bugs are in test_elementwise.py.
REGRESSIONS: list[tuple[list[Step], tuple[int, ...], float]] = [
    # GCC folded (float)(int)x into truncf(x): -0.0 for x in (-1, 0), so atan2 gave -pi for pi.
    ([Step("cast", "int32"), Step("binary", "atan2", 0)], (5, 7), 1.0),
    # Our erf reached 1.0 early / stayed below it late: floor(4 * erf(x)) was 4 for eager's 3.
    ([Step("unary", "erf"), Step("unary", "floor")], (64, 129), 4.0),
]


def test_regressions():
    generator = torch.Generator().manual_seed(0)
    for steps, shape, scale in REGRESSIONS:
        x = torch.randn(shape, generator=generator) * scale
        y = torch.randn(shape, generator=generator)
        check_program(steps, x.to(DEVICE), y.to(DEVICE))
