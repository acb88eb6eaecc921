"""The elementwise operations a body may use, by name, with their arity and group.

Lowering rules build ``Op(name, args)`` only from this table, and every renderer must
implement every name here (a test checks it), so a new op is added in exactly one place
per renderer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    group: str  # "arith", "math", "compare", "logical", "bitwise"


def _specs(group: str, arity: int, names: str) -> dict[str, OpSpec]:
    return {name: OpSpec(name, arity, group) for name in names.split()}


OPS: dict[str, OpSpec] = {
    **_specs("arith", 2, "add sub mul truediv floordiv truncdiv remainder fmod maximum minimum pow atan2 copysign hypot"),
    # Division rounded to nearest (IEEE) on every target, where a target's plain ``truediv`` may
    # be approximate (Triton's float32 ``/`` is within 2 ulp): for results that must be exact,
    # e.g. a variance's correction term; elsewhere plain ``truediv`` (cheaper in loops).
    **_specs("arith", 2, "div_rn"),
    **_specs("arith", 1, "neg abs sign reciprocal trunc floor ceil round frac"),
    **_specs(
        "math",
        1,
        "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
        "asinh acosh atanh erf erfc erfinv sigmoid lgamma isnan isinf isfinite signbit",
    ),
    **_specs("compare", 2, "eq ne lt le gt ge"),
    **_specs("logical", 2, "logical_and logical_or logical_xor"),
    **_specs("logical", 1, "logical_not"),
    **_specs("bitwise", 2, "bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift"),
    **_specs("bitwise", 1, "bitwise_not"),
}

# Reductions a Reduction node may perform, with the identity of each for padding lanes.
REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")
