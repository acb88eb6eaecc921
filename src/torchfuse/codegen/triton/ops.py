"""Triton text for each elementwise op of ``ir.ops.OPS`` (the renderer's op table)."""
from __future__ import annotations

from typing import Callable

import torch

from torchfuse.codegen.triton.printer import tl_dtype

NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"


def _binary(symbol: str) -> Callable:
    return lambda a, b, dt: f"({a} {symbol} {b})"


def _call(fn: str) -> Callable:
    return lambda *args: f"{fn}({', '.join(args[:-1])})"


def _floordiv(a: str, b: str, dt: torch.dtype) -> str:
    if dt.is_floating_point:
        return f"tl.floor({a} / {b})"
    # Triton's // truncates toward zero; Python/PyTorch floor toward -inf.
    return f"tl.where((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0)), {a} // {b} - 1, {a} // {b})"


def _remainder(a: str, b: str, dt: torch.dtype) -> str:
    rem = f"libdevice.fmod({a}, {b})" if dt.is_floating_point else f"({a} % {b})"
    return f"tl.where(({rem} != 0) & (({rem} < 0) != ({b} < 0)), {rem} + {b}, {rem})"


def _minmax(fn: str) -> Callable:
    def render(a: str, b: str, dt: torch.dtype) -> str:
        extra = f", {NAN_ALL}" if dt.is_floating_point else ""
        return f"tl.{fn}({a}, {b}{extra})"

    return render


def _sign(a: str, dt: torch.dtype) -> str:
    if dt == torch.bool:
        return a
    t = tl_dtype(dt)
    value = f"((0 < {a}).to({t}) - ({a} < 0).to({t}))"
    return f"tl.where({a} != {a}, {a}, {value})" if dt.is_floating_point else value


def _abs(a: str, dt: torch.dtype) -> str:
    return a if dt == torch.bool else f"tl.abs({a})"


TRITON_OPS: dict[str, Callable[..., str]] = {
    "add": _binary("+"), "sub": _binary("-"), "mul": _binary("*"), "truediv": _binary("/"),
    "floordiv": _floordiv, "truncdiv": lambda a, b, dt: f"libdevice.trunc({a} / {b})" if dt.is_floating_point else f"({a} // {b})",
    "remainder": _remainder,
    "fmod": lambda a, b, dt: f"libdevice.fmod({a}, {b})" if dt.is_floating_point else f"({a} % {b})",
    "maximum": _minmax("maximum"), "minimum": _minmax("minimum"),
    "pow": _call("libdevice.pow"), "atan2": _call("libdevice.atan2"),
    "copysign": _call("libdevice.copysign"), "hypot": _call("libdevice.hypot"),
    "neg": lambda a, dt: f"(-{a})", "abs": _abs, "sign": _sign,
    "reciprocal": lambda a, dt: f"(1.0 / {a})", "trunc": _call("libdevice.trunc"),
    "floor": _call("tl.floor"), "ceil": _call("tl.ceil"), "round": _call("libdevice.nearbyint"),
    "frac": lambda a, dt: f"({a} - libdevice.trunc({a}))",
    "exp": _call("tl.exp"), "exp2": _call("tl.exp2"), "expm1": _call("libdevice.expm1"),
    "log": _call("tl.log"), "log2": _call("tl.log2"), "log10": _call("libdevice.log10"),
    "log1p": _call("libdevice.log1p"), "sqrt": _call("libdevice.sqrt"), "rsqrt": _call("libdevice.rsqrt"),
    "sin": _call("tl.sin"), "cos": _call("tl.cos"), "tan": _call("libdevice.tan"),
    "asin": _call("libdevice.asin"), "acos": _call("libdevice.acos"), "atan": _call("libdevice.atan"),
    "sinh": _call("libdevice.sinh"), "cosh": _call("libdevice.cosh"), "tanh": _call("libdevice.tanh"),
    "asinh": _call("libdevice.asinh"), "acosh": _call("libdevice.acosh"), "atanh": _call("libdevice.atanh"),
    "erf": _call("libdevice.erf"), "erfc": _call("libdevice.erfc"), "erfinv": _call("libdevice.erfinv"),
    "sigmoid": lambda a, dt: f"(1.0 / (1.0 + tl.exp(-{a})))", "lgamma": _call("libdevice.lgamma"),
    "isnan": lambda a, dt: f"({a} != {a})",
    "isinf": lambda a, dt: f"(tl.abs({a}) == float('inf'))" if dt.is_floating_point else f"({a} != {a})",
    "isfinite": lambda a, dt: f"(tl.abs({a}) < float('inf'))" if dt.is_floating_point else f"({a} == {a})",
    "signbit": lambda a, dt: f"(libdevice.signbit({a}) != 0)" if dt.is_floating_point else f"({a} < 0)",
    "eq": _binary("=="), "ne": _binary("!="), "lt": _binary("<"), "le": _binary("<="),
    "gt": _binary(">"), "ge": _binary(">="),
    "logical_and": _binary("&"), "logical_or": _binary("|"), "logical_xor": _binary("^"),
    "logical_not": lambda a, dt: f"({a} == 0)",
    "bitwise_and": _binary("&"), "bitwise_or": _binary("|"), "bitwise_xor": _binary("^"),
    "bitwise_not": lambda a, dt: f"({a} == 0)" if dt == torch.bool else f"(~{a})",
    "bitwise_left_shift": _binary("<<"), "bitwise_right_shift": _binary(">>"),
}
