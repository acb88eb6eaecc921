"""Random-program fuzzing: small programs of pointwise ops, reductions, views, broadcasts and
casts, compiled with torchfuse and compared with eager (float64 reference).

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
from conftest import DEVICE, assert_close, compile_strict, to_float64

EXAMPLES = int(os.environ.get("TORCHFUSE_FUZZ_EXAMPLES", "25"))

UNARY = {
    "exp": lambda x: torch.exp(x.clamp(max=20)),
    "tanh": torch.tanh,
    "abs": torch.abs,
    "neg": torch.neg,
    "sigmoid": torch.sigmoid,
    "sqrt_abs": lambda x: torch.sqrt(x.abs()),
    "log1p_abs": lambda x: torch.log1p(x.abs()),
    "relu": torch.relu,
    "square": lambda x: x * x,
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "maximum": torch.maximum,
    "where_pos": lambda a, b: torch.where(a > 0, a, b),
}


@dataclass(frozen=True)
class Step:
    kind: str  # "unary", "binary", "scalar", "reduce", "view", "cast"
    name: str
    arg: int = 0


def _steps() -> st.SearchStrategy:
    unary = st.builds(Step, st.just("unary"), st.sampled_from(sorted(UNARY)))
    binary = st.builds(Step, st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 1))
    scalar = st.builds(Step, st.just("scalar"), st.sampled_from(["add", "mul"]), st.integers(-3, 3))
    reduce = st.builds(Step, st.just("reduce"), st.sampled_from(["sum", "amax", "mean", "softmax"]), st.integers(-1, 0))
    view = st.builds(Step, st.just("view"), st.sampled_from(["t", "flatten", "slice", "unsqueeze_expand"]))
    cast = st.builds(Step, st.just("cast"), st.sampled_from(["float16", "bfloat16", "float64"]))
    return st.lists(st.one_of(unary, binary, scalar, reduce, view, cast), min_size=1, max_size=6)


def run_program(steps: list[Step], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The program both eager and torchfuse run. ``y`` is a second operand of x's shape."""
    for step in steps:
        if step.kind == "unary":
            x = UNARY[step.name](x)
        elif step.kind == "binary":
            other = y if y.shape == x.shape else x.flip(-1)  # an operand of x's shape
            if step.arg == 1 and x.dim() >= 1:
                other = other[..., :1]  # broadcast over the last dim
            x = BINARY[step.name](x, other.to(x.dtype))
        elif step.kind == "scalar":
            x = x + step.arg if step.name == "add" else x * (step.arg + 0.5)
        elif step.kind == "reduce" and x.dim() >= 1 and x.shape[-1] > 0:
            dim = step.arg if x.dim() > 1 else -1
            if step.name == "softmax":
                x = torch.softmax(x, dim)
            elif step.name == "amax":
                x = x.amax(dim, keepdim=True) + x  # keep the shape (and broadcast it back)
            else:
                x = getattr(x, step.name)(dim, keepdim=True) * x
        elif step.kind == "view":
            x = _view(step.name, x)
        elif step.kind == "cast":
            x = x.to(getattr(torch, step.name)).to(torch.float32)
    return x


def _view(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "t" and x.dim() == 2:
        return x.t()
    if name == "flatten":
        return x.reshape(x.shape[0], -1) if x.dim() >= 2 else x
    if name == "slice" and x.dim() >= 1 and x.shape[-1] > 1:
        return x[..., 1:]
    if name == "unsqueeze_expand":
        return x.unsqueeze(0).expand(2, *x.shape)[1]
    return x


@st.composite
def inputs(draw) -> tuple[torch.Tensor, torch.Tensor]:
    shape = draw(st.sampled_from([(5, 7), (1, 9), (3, 1), (4, 0), (2, 3, 5), (6, 33), (1, 1)]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * draw(st.sampled_from([1.0, 10.0]))
    y = torch.randn(shape, generator=generator)
    if draw(st.booleans()) and x.numel() > 2:  # special values
        flat = x.view(-1)
        flat[0], flat[-1] = float("nan"), draw(st.sampled_from([float("inf"), float("-inf")]))
    if draw(st.booleans()) and x.dim() == 2:  # non-contiguous layout, same values
        x = x.t().contiguous().t()
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
    assert_close(actual, expected, dtype=torch.float16 if _has_half(steps) else None, reference=reference.to(expected.dtype))


def _has_half(steps: list[Step]) -> bool:
    return any(s.kind == "cast" and s.name in ("float16", "bfloat16") for s in steps)


# Programs that failed once, shrunk by hypothesis; each must stay fixed.
REGRESSIONS: list[tuple[list[Step], tuple[int, ...]]] = []


def test_regressions():
    for steps, shape in REGRESSIONS:
        x, y = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
        check_program(steps, x, y)
