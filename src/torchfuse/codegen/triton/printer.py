"""Print sympy index expressions and dtypes as Triton source text."""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.symbols import FloorDiv, ModIndex, PyFloorDiv, PyMod

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def tl_dtype(dtype: torch.dtype) -> str:
    try:
        return TL_DTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} in a Triton kernel") from None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in float32 inside kernels (rounded only on store)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def print_index(expr: sympy.Expr, max_fn: str = "tl.maximum", min_fn: str = "tl.minimum") -> str:
    """Triton (or, with ``max_fn="max"``, Python) text for a non-negative integer index."""
    expr = sympy.sympify(expr)
    torch_fn = _torch_function_text(expr, max_fn, min_fn)
    if torch_fn is not None:
        return torch_fn
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = max_fn if isinstance(expr, sympy.Max) else min_fn
        parts = [print_index(a, max_fn, min_fn) for a in expr.args]
        text = parts[0]
        for part in parts[1:]:
            text = f"{fn}({text}, {part})"
        return text
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    def sub(e: sympy.Expr) -> str:
        return print_index(e, max_fn, min_fn)

    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(sub(arg) for arg in _ordered(expr.args)) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(sub(arg) for arg in _ordered(expr.args)) + ")"
    if isinstance(expr, FloorDiv):
        return f"({sub(expr.args[0])} // {sub(expr.args[1])})"
    if isinstance(expr, ModIndex):
        return f"({sub(expr.args[0])} % {sub(expr.args[1])})"
    if isinstance(expr, (PyMod, PyFloorDiv)):
        return _python_div_mod(type(expr).__name__, sub(expr.args[0]), sub(expr.args[1]))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([sub(expr.base)] * int(expr.exp)) + ")"
    raise NotImplementedError(f"index expression {expr} in a Triton kernel")


# Sizes from Dynamo carry torch's own sympy functions (torch.utils._sympy.functions), e.g.
# ``FloorDiv(s0, 2)`` for ``x.shape[0] // 2``. We print them by class name so codegen needs
# no torch-internal import. Their operands may be negative and Triton's integer // and %
# truncate, so Python's flooring ones are printed sign-safe.
_TORCH_BINARY = {"FloorDiv": "PyFloorDiv", "Mod": "PyMod", "PythonMod": "PyMod"}


def _python_div_mod(kind: str, a: str, b: str) -> str:
    """Python's a % b and a // b (b > 0) from operators that may truncate (C, Triton)."""
    mod = f"((({a} % {b}) + {b}) % {b})"
    return mod if kind == "PyMod" else f"(({a} - {mod}) // {b})"


def _torch_function_text(expr: sympy.Expr, max_fn: str, min_fn: str) -> str | None:
    if isinstance(expr, (FloorDiv, ModIndex, PyMod, PyFloorDiv)):
        return None
    kind = type(expr).__name__
    if not isinstance(expr, sympy.Function) and kind not in ("Max", "Min"):
        return None
    args = [print_index(a, max_fn, min_fn) for a in expr.args]
    if kind in _TORCH_BINARY:
        return _python_div_mod(_TORCH_BINARY[kind], args[0], args[1])
    if kind == "CleanDiv":  # exact division
        return f"({args[0]} // {args[1]})"
    if kind == "CeilDiv":
        return f"(-((-{args[0]}) // {args[1]}))"
    if kind == "ModularIndexing":  # (x // divisor) % modulus
        return f"(({args[0]} // {args[1]}) % {args[2]})"
    if kind in ("Max", "Min"):
        fn = max_fn if kind == "Max" else min_fn
        text = args[0]
        for part in args[1:]:
            text = f"{fn}({text}, {part})"
        return text
    if kind == "PowByNatural" and expr.args[1].is_Integer and int(expr.args[1]) > 0:
        return "(" + " * ".join([args[0]] * int(expr.args[1])) + ")"
    return None


def _ordered(args) -> list:
    """Symbols before constants, so ``x0 + 1`` prints that way round."""
    return sorted(args, key=lambda a: (a.is_number, str(a)))
