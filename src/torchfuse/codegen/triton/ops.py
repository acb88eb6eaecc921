"""Triton text for each elementwise op of ``ir.ops.OPS`` (the renderer's op table)."""
from __future__ import annotations

from typing import Callable

import torch

from torchfuse.codegen.triton.printer import tl_dtype

NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"

# Helper functions for ops whose exact semantics take several statements. They are emitted
# once per kernel module (with the reduction helpers); the module supplies ``jit``, ``tl``
# and ``libdevice``. Each follows the eager (ATen CPU/CUDA) definition of the op.
HELPERS = '''
@jit
def _floordiv_float(a, b):
    # ATen's div_floor_floating: floor(a / b) rounds wrongly when a / b rounds up to an
    # integer (1.0 // 0.1 is 9, not 10), and inf // x is NaN.
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = tl.floor(div)
    floordiv = tl.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    quotient = a / b
    floordiv = tl.where(div != 0, floordiv, libdevice.copysign(div * 0, quotient))
    return tl.where(b == 0, quotient, floordiv)


@jit
def _pow_int(base, exponent):
    # Integer power by squaring (libdevice.pow is float-only). A negative exponent gives
    # 0 except for bases 1 and -1, as in ATen.
    zero = (base + exponent) * 0
    result = zero + 1
    square = base + zero
    e = exponent + zero
    for _ in range(64):
        result = tl.where((e & 1) != 0, result * square, result)
        square = square * square
        e = e >> 1
    odd = (exponent & 1) != 0
    negative = tl.where(base == 1, zero + 1, tl.where(base == -1, tl.where(odd, zero - 1, zero + 1), zero))
    return tl.where(exponent < 0, negative, result)


@jit
def _round_bf16(x):
    # float32 -> the nearest bfloat16 (ties to even), kept in float32. A GPU's conversion rounds
    # to nearest even; Triton's interpreter truncates, so there integer ops do it (ROUND_BY_BITS,
    # set by the loader). On an H200 those integer ops made a bfloat16 GELU 35% slower.
    if ROUND_BY_BITS:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
        return tl.where(x != x, x, rounded)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@jit
def _round_bf16_pairs(x):
    # _round_bf16 two elements an instruction on GPUs (cvt.rn.bf16x2.f32, SASS F2FP...PACK_AB),
    # bit for bit the same rounding; Triton converts one a time (F2F), at a quarter of the add
    # rate. Where roundings, not memory, bound a kernel (kernel.PACKED_ROUNDINGS). A tensor of one
    # element (a row's value at XBLOCK 1) has no pair: Triton refuses the packed op there.
    if ROUND_BY_BITS:
        return _round_bf16(x)
    elif x.numel % 2 == 1:
        return _round_bf16(x)
    else:
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.bfloat16,
                                         is_pure=True, pack=2).to(tl.float32)
'''


def _binary(symbol: str) -> Callable:
    return lambda a, b, dt: f"({a} {symbol} {b})"


def _call(fn: str) -> Callable:
    return lambda *args: f"{fn}({', '.join(args[:-1])})"


def _floordiv(a: str, b: str, dt: torch.dtype) -> str:
    if dt.is_floating_point:
        return f"_floordiv_float({a}, {b})"
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
    # As ATen: sign(NaN) is 0 (both comparisons are false), sign(-0.0) is 0.
    return f"((0 < {a}).to({t}) - ({a} < 0).to({t}))"


def _shift(symbol: str) -> Callable:
    """ATen's shifts: a shift by a negative amount or by >= the bit width gives 0 (left) or
    the sign fill (right), where Triton (like C) leaves it undefined."""

    def render(a: str, b: str, dt: torch.dtype) -> str:
        if dt == torch.bool:
            return f"({a} {symbol} {b})"
        width = torch.iinfo(dt).bits
        overflow = f"{a} >> {width - 1}" if symbol == ">>" else "0"
        return f"tl.where(({b} < 0) | ({b} >= {width}), {overflow}, {a} {symbol} {b})"

    return render


def _pow(a: str, b: str, dt: torch.dtype) -> str:
    return f"libdevice.pow({a}, {b})" if dt.is_floating_point else f"_pow_int({a}, {b})"


def _abs(a: str, dt: torch.dtype) -> str:
    return a if dt == torch.bool else f"tl.abs({a})"


def _div_rn(a: str, b: str, dt: torch.dtype) -> str:
    """IEEE division, never fused with what uses it: Triton's float32 ``/`` is approximate and its
    product may fuse into the next subtraction (an FMA). A variance's mean and correction need
    rounded quotients (lowering/rules/reductions.py); with ``/`` the H200 left 1e-8 to 1e-30 for
    equal values. Not for every division: ``div.rn`` is a dozen instructions with a slow path,
    and made reductions that divide per element up to 2x slower."""
    return f"tl.div_rn({a}, {b})" if dt == torch.float32 else f"({a} / {b})"


# Ops rendered as Python operators; every other op is a function call, whose scalar
# arguments the writer first makes tensors of the compute dtype (a float64 call must not
# see a literal that Triton types as float32).
OPERATOR_OPS = frozenset(
    "add sub mul truediv neg eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or "
    "bitwise_xor".split()
)

TRITON_OPS: dict[str, Callable[..., str]] = {
    "add": _binary("+"), "sub": _binary("-"), "mul": _binary("*"), "truediv": _binary("/"), "div_rn": _div_rn,
    "floordiv": _floordiv, "truncdiv": lambda a, b, dt: f"libdevice.trunc({a} / {b})" if dt.is_floating_point else f"({a} // {b})",
    "remainder": _remainder,
    "fmod": lambda a, b, dt: f"libdevice.fmod({a}, {b})" if dt.is_floating_point else f"({a} % {b})",
    "maximum": _minmax("maximum"), "minimum": _minmax("minimum"),
    "pow": _pow, "atan2": _call("libdevice.atan2"),
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
    "bitwise_left_shift": _shift("<<"), "bitwise_right_shift": _shift(">>"),
}
