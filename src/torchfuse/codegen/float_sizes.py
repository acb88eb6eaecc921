"""Float-valued size expressions as kernel text, for both targets.

A SymFloat of sizes (a batch norm's ``1.0 / (N * H * W)`` with dynamic shapes) is what Python
computes on the host in double precision. Kernels compute it the same way: every size
converted to float64 first (exact below 2**53), then IEEE float64 operations, so the value
equals eager's before the op casts it to its own dtype.
"""
from __future__ import annotations

from typing import Callable

import sympy


def float_size_text(expr: sympy.Expr, size: Callable[[str], str], number: Callable[[float], str]) -> str:
    """Text of ``expr`` in float64, ``size(name)`` for a size symbol and ``number(x)`` for a
    constant; NotImplementedError for anything else (the graph then falls back to ATen)."""
    expr = sympy.sympify(expr)

    def sub(e: sympy.Expr) -> str:
        return float_size_text(e, size, number)

    if expr.is_number:
        return number(float(expr))
    if isinstance(expr, sympy.Symbol):
        return size(expr.name)
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(sub(a) for a in expr.args) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(sub(a) for a in expr.args) + ")"
    kind = type(expr).__name__
    if kind in ("FloatTrueDiv", "IntTrueDiv"):
        return f"({sub(expr.args[0])} / {sub(expr.args[1])})"
    if kind == "ToFloat":
        return sub(expr.args[0])
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) != 0:
        product = " * ".join([sub(expr.base)] * abs(int(expr.exp)))
        return f"({product})" if int(expr.exp) > 0 else f"({number(1.0)} / ({product}))"
    raise NotImplementedError(f"float size expression {expr} in a kernel")
