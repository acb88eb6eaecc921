"""Print sympy index expressions and dtypes as C++ source text.

Every index is a non-negative ``int64_t``, so C++'s ``/`` and ``%`` are exactly the floor
division and modulo of ``FloorDiv``/``ModIndex``; size arithmetic that may be negative
(``PyFloorDiv``/``PyMod``, torch's ``FloorDiv``/``PythonMod``) is printed sign-safe.
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.symbols import FloorDiv, ModIndex, PyFloorDiv, PyMod

# How each dtype is held in memory. Half types are raw 16-bit patterns: the prelude converts
# them to float on load and rounds to nearest even on store (no compiler half type needed).
STORAGE_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "uint16_t", torch.bfloat16: "uint16_t",
    torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in float32 inside kernels (rounded only on store)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def storage_type(dtype: torch.dtype) -> str:
    try:
        return STORAGE_TYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} in a C++ kernel") from None


def value_type(dtype: torch.dtype) -> str:
    """The C++ type a value of ``dtype`` is computed in."""
    return storage_type(compute_dtype(dtype))


def print_index(expr: sympy.Expr) -> str:
    """C++ text for a non-negative integer index or size (int64 arithmetic)."""
    expr = sympy.sympify(expr)
    torch_fn = _torch_function_text(expr)
    if torch_fn is not None:
        return torch_fn
    if isinstance(expr, (sympy.Max, sympy.Min)):
        return _fold("tf_imax" if isinstance(expr, sympy.Max) else "tf_imin", [print_index(a) for a in expr.args])
    if expr.is_Integer:
        return _int_literal(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(print_index(arg) for arg in _ordered(expr.args)) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(print_index(arg) for arg in _ordered(expr.args)) + ")"
    if isinstance(expr, FloorDiv):
        return f"({print_index(expr.args[0])} / {print_index(expr.args[1])})"
    if isinstance(expr, ModIndex):
        return f"({print_index(expr.args[0])} % {print_index(expr.args[1])})"
    if isinstance(expr, (PyMod, PyFloorDiv)):
        return _python_div_mod(type(expr).__name__, print_index(expr.args[0]), print_index(expr.args[1]))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([print_index(expr.base)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"index expression {expr} in a C++ kernel")


def _int_literal(value: int) -> str:
    # Literals are int64 so that products of sizes never overflow a 32-bit int.
    if value == -(2**63):
        return "(-INT64_C(9223372036854775807) - 1)"
    return f"INT64_C({value})" if abs(value) >= 2**31 else str(value)


def _fold(fn: str, parts: list[str]) -> str:
    text = parts[0]
    for part in parts[1:]:
        text = f"{fn}({text}, {part})"
    return text


# Sizes from Dynamo carry torch's own sympy functions (torch.utils._sympy.functions), printed
# by class name so codegen imports nothing torch-internal (as the Triton printer does). Their
# operands may be negative, where C++ truncates: Python's flooring // and % print sign-safe.
_TORCH_BINARY = {"FloorDiv": "PyFloorDiv", "Mod": "PyMod", "PythonMod": "PyMod"}


def _python_div_mod(kind: str, a: str, b: str) -> str:
    """Python's a % b and a // b (b > 0) with C++'s truncating operators."""
    mod = f"((({a} % {b}) + {b}) % {b})"
    return mod if kind == "PyMod" else f"(({a} - {mod}) / {b})"


def _torch_function_text(expr: sympy.Expr) -> str | None:
    if isinstance(expr, (FloorDiv, ModIndex, PyMod, PyFloorDiv)):
        return None
    kind = type(expr).__name__
    if not isinstance(expr, sympy.Function) and kind not in ("Max", "Min"):
        return None
    args = [print_index(a) for a in expr.args]
    if kind in _TORCH_BINARY:
        return _python_div_mod(_TORCH_BINARY[kind], args[0], args[1])
    if kind == "CleanDiv":  # exact division
        return f"({args[0]} / {args[1]})"
    if kind == "CeilDiv":
        return f"(({args[0]} + {args[1]} - 1) / {args[1]})"
    if kind == "ModularIndexing":  # (x // divisor) % modulus
        return f"(({args[0]} / {args[1]}) % {args[2]})"
    if kind in ("Max", "Min"):
        return _fold("tf_imax" if kind == "Max" else "tf_imin", args)
    if kind == "PowByNatural" and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        return "(" + " * ".join([args[0]] * int(expr.args[1])) + ")"
    return None


def _ordered(args) -> list:
    """Symbols before constants, so ``x0 + 1`` prints that way round."""
    return sorted(args, key=lambda a: (a.is_number, str(a)))


def literal(value, dtype: torch.dtype) -> str:
    """A C++ literal of ``dtype``'s compute type holding ``value``."""
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if dtype in (torch.float16, torch.bfloat16):  # a half constant holds a half value
            value = float(torch.tensor(value, dtype=torch.float32).to(dtype))
        single = compute_dtype(dtype) == torch.float32
        if value != value:
            return "__builtin_nanf(\"\")" if single else "__builtin_nan(\"\")"
        if value in (float("inf"), float("-inf")):
            text = "__builtin_inff()" if single else "__builtin_inf()"
            return text if value > 0 else f"(-{text})"
        text = repr(value)
        if single:
            # Round to float32 first: the literal must hold the float32 value the graph holds.
            text = repr(float(torch.tensor(value, dtype=torch.float32)))
            text = text + ("f" if ("e" in text or "." in text) else ".0f")
        return text if value >= 0 else f"({text})"
    ctype = storage_type(dtype)
    return f"(({ctype}){_int_literal(int(value))})"
