"""C++ text for each elementwise op of ``ir.ops.OPS`` (the renderer's op table).

Each entry takes the operand texts and the operands' compute dtype and returns an
expression. Semantics follow eager ATen (the same choices as ``codegen/triton/ops.py``):
NaN-propagating ``maximum``/``minimum``, floor division and remainder with Python signs,
shifts past the bit width, integer arithmetic that wraps. Helpers named ``tf_*`` live in
``prelude.py``; all of them are branch-free so that loops calling them still vectorize.
"""
from __future__ import annotations

from typing import Callable

import torch

from torchfuse.codegen.cpp.printer import storage_type

Render = Callable[..., str]


def _is_float(dt: torch.dtype) -> bool:
    return dt.is_floating_point


def _suffix(dt: torch.dtype) -> str:
    """Literal suffix for the compute type: ``f`` for float32, nothing for float64."""
    return "f" if dt != torch.float64 else ""


def _arith(symbol: str, wrapping: str) -> Render:
    """``a op b``; integers go through unsigned helpers so overflow wraps as in ATen
    (signed overflow is undefined behaviour in C++)."""

    def render(a: str, b: str, dt: torch.dtype) -> str:
        if _is_float(dt):
            return f"({a} {symbol} {b})"
        if dt == torch.bool:
            return f"(bool)({a} {symbol} {b})"
        return f"{wrapping}<{storage_type(dt)}>({a}, {b})"

    return render


def _binary(symbol: str) -> Render:
    return lambda a, b, dt: f"({a} {symbol} {b})"


def _math1(name: str) -> Render:
    """A <cmath> function; the float overloads pick expf/logf/... for float32."""
    return lambda a, dt: f"std::{name}({a})"


def _math2(name: str) -> Render:
    return lambda a, b, dt: f"std::{name}({a}, {b})"


def _int_or_float(float_text: str, int_text: str) -> Render:
    def render(*args) -> str:
        *operands, dt = args
        template = float_text if _is_float(dt) else int_text
        return template.format(*operands, T=storage_type(dt), s=_suffix(dt))

    return render


def _minmax(kind: str) -> Render:
    def render(a: str, b: str, dt: torch.dtype) -> str:
        if _is_float(dt):
            return f"tf_{kind}_nan({a}, {b})"
        if dt == torch.bool:
            return f"({a} {'|' if kind == 'max' else '&'} {b})"
        op = ">" if kind == "max" else "<"
        return f"(({a} {op} {b}) ? {a} : {b})"

    return render


def _shift(kind: str) -> Render:
    def render(a: str, b: str, dt: torch.dtype) -> str:
        if dt == torch.bool:
            return f"(bool)({a} {'<<' if kind == 'left' else '>>'} {b})"
        return f"tf_shift_{kind}<{storage_type(dt)}>({a}, {b})"

    return render


def _sign(a: str, dt: torch.dtype) -> str:
    if dt == torch.bool:
        return a
    # As ATen: sign(NaN) is 0 (both comparisons are false), sign(-0.0) is 0.
    return f"(({storage_type(dt)})((0 < {a}) - ({a} < 0)))"


def _abs(a: str, dt: torch.dtype) -> str:
    if dt == torch.bool:
        return a
    if _is_float(dt):
        return f"std::fabs({a})"
    return f"tf_iabs<{storage_type(dt)}>({a})"


def _neg(a: str, dt: torch.dtype) -> str:
    if _is_float(dt):
        return f"(-{a})"
    if dt == torch.bool:
        return a
    return f"tf_wsub<{storage_type(dt)}>(0, {a})"


def _float_only(name: str) -> Render:
    """A <cmath> function of floats; integers never reach it (lowering casts them first)."""
    return lambda a, dt: f"std::{name}({a})"


def _round_like(name: str) -> Render:
    return lambda a, dt: f"std::{name}({a})" if _is_float(dt) else a


def _isinf(a: str, dt: torch.dtype) -> str:
    return f"(std::fabs({a}) == tf_inf<{storage_type(dt)}>())" if _is_float(dt) else "false"


def _isfinite(a: str, dt: torch.dtype) -> str:
    return f"(std::fabs({a}) < tf_inf<{storage_type(dt)}>())" if _is_float(dt) else "true"


def _signbit(a: str, dt: torch.dtype) -> str:
    if _is_float(dt):
        return f"std::signbit({a})"
    return "false" if dt in (torch.bool, torch.uint8) else f"({a} < 0)"


def _reciprocal(a: str, dt: torch.dtype) -> str:
    return f"(1.0{_suffix(dt)} / {a})"


def _sigmoid(a: str, dt: torch.dtype) -> str:
    s = _suffix(dt)
    return f"(1.0{s} / (1.0{s} + std::exp(-{a})))"


def _rsqrt(a: str, dt: torch.dtype) -> str:
    return f"(1.0{_suffix(dt)} / std::sqrt({a}))"


# Integer division and remainder by zero would trap (SIGFPE) where ATen raises; they give 0.
CPP_OPS: dict[str, Render] = {
    "add": _arith("+", "tf_wadd"), "sub": _arith("-", "tf_wsub"), "mul": _arith("*", "tf_wmul"),
    "truediv": _binary("/"), "div_rn": _binary("/"),  # C++ division is IEEE
    "floordiv": _int_or_float("tf_floordiv_float({0}, {1})", "tf_floordiv_int<{T}>({0}, {1})"),
    "truncdiv": _int_or_float("std::trunc({0} / {1})", "tf_truncdiv_int<{T}>({0}, {1})"),
    "remainder": _int_or_float("tf_remainder_float({0}, {1})", "tf_remainder_int<{T}>({0}, {1})"),
    "fmod": _int_or_float("std::fmod({0}, {1})", "tf_fmod_int<{T}>({0}, {1})"),
    "maximum": _minmax("max"), "minimum": _minmax("min"),
    "pow": _int_or_float("std::pow({0}, {1})", "tf_pow_int<{T}>({0}, {1})"),
    "atan2": _math2("atan2"), "copysign": _math2("copysign"), "hypot": _math2("hypot"),
    "neg": _neg, "abs": _abs, "sign": _sign, "reciprocal": _reciprocal,
    "trunc": _round_like("trunc"), "floor": _round_like("floor"), "ceil": _round_like("ceil"),
    "round": _round_like("nearbyint"),  # half to even, as torch.round
    "frac": lambda a, dt: f"({a} - std::trunc({a}))",
    "exp": _math1("exp"), "exp2": _math1("exp2"), "expm1": _math1("expm1"), "log": _math1("log"),
    "log2": _math1("log2"), "log10": _math1("log10"), "log1p": _math1("log1p"), "sqrt": _math1("sqrt"),
    "rsqrt": _rsqrt, "sin": _math1("sin"), "cos": _math1("cos"), "tan": _math1("tan"), "asin": _math1("asin"),
    "acos": _math1("acos"), "atan": _math1("atan"), "sinh": _math1("sinh"), "cosh": _math1("cosh"),
    "tanh": _math1("tanh"), "asinh": _math1("asinh"), "acosh": _math1("acosh"), "atanh": _math1("atanh"),
    "erf": lambda a, dt: f"tf_erff({a})" if dt == torch.float32 else f"std::erf({a})", "erfc": _math1("erfc"), "erfinv": lambda a, dt: f"tf_erfinv({a})",
    "sigmoid": _sigmoid, "lgamma": _float_only("lgamma"),
    "isnan": lambda a, dt: f"({a} != {a})" if _is_float(dt) else "false",
    "isinf": _isinf, "isfinite": _isfinite, "signbit": _signbit,
    "eq": _binary("=="), "ne": _binary("!="), "lt": _binary("<"), "le": _binary("<="),
    "gt": _binary(">"), "ge": _binary(">="),
    # Non-short-circuit forms: both sides are plain values, and branches would stop vectorization.
    "logical_and": lambda a, b, dt: f"(({a} != 0) & ({b} != 0))",
    "logical_or": lambda a, b, dt: f"(({a} != 0) | ({b} != 0))",
    "logical_xor": lambda a, b, dt: f"(({a} != 0) != ({b} != 0))",
    "logical_not": lambda a, dt: f"({a} == 0)",
    "bitwise_and": _binary("&"), "bitwise_or": _binary("|"), "bitwise_xor": _binary("^"),
    "bitwise_not": lambda a, dt: f"(!{a})" if dt == torch.bool else f"(~{a})",
    "bitwise_left_shift": _shift("left"), "bitwise_right_shift": _shift("right"),
}
