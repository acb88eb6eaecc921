"""Substitute runtime values for loop variables: recomputing a producer at a gathered index.

A body indexes its loads with sympy arithmetic on loop variables. To recompute a pointwise
producer at ``buffer[i, target[i]]`` (cross-entropy reads one log-probability per row) the
variable of the gathered dim must become a runtime value. Index entries that are exactly
that variable take the value itself; anything else (``2*v + 1``, ``v // 4``, clamps) is
rebuilt as integer ``Op``s over the value, with the other variables as ``IndexValue``s.
Every index form the printers accept can be rebuilt, so the substitution never fails on a
graph that could be rendered.
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, transform
from torchfuse.ir.symbols import FloorDiv, ModIndex, PyFloorDiv, PyMod, simplify_index

INDEX_DTYPE = torch.int64

# Dynamo's own sympy functions (torch.utils._sympy.functions), matched by class name as the
# printers do, so the IR needs no torch-internal import. On non-negative indices // and %
# of either convention agree.
_TORCH_BINARY = {"FloorDiv": "floordiv", "CleanDiv": "floordiv", "Mod": "remainder", "PythonMod": "remainder"}


def substitute_values(expr: Expr, direct: dict[sympy.Symbol, sympy.Expr],
                      gathered: dict[sympy.Symbol, Expr]) -> Expr:
    """``expr`` with variables replaced: ``direct`` by sympy expressions, ``gathered`` by values."""

    def rewrite(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            return Load(node.dtype, node.buffer, tuple(_entry(e, direct, gathered) for e in node.index))
        if isinstance(node, IndexValue):
            value = _entry(node.index, direct, gathered)
            if isinstance(value, Expr):
                return value if value.dtype == node.dtype else Cast(node.dtype, value)
            return IndexValue(node.dtype, value)
        return None

    # Gathered entries already in ``expr`` are Exprs: transform rebuilds (and rewrites) them.
    return transform(expr, rewrite)


def _entry(entry, direct: dict, gathered: dict[sympy.Symbol, Expr]):
    if isinstance(entry, Expr):
        return entry  # already rewritten by transform (children first)
    entry = sympy.sympify(entry)
    if not entry.free_symbols & gathered.keys():
        return simplify_index(entry.xreplace(direct))
    if entry in gathered:
        return _as_index(gathered[entry])
    return index_value(entry, direct, gathered)


def _as_index(value: Expr) -> Expr:
    return value if value.dtype == INDEX_DTYPE else Cast(INDEX_DTYPE, value)


def index_value(expr: sympy.Expr, direct: dict, gathered: dict[sympy.Symbol, Expr]) -> Expr:
    """The int64 value of a sympy index expression in which some variables are runtime values."""
    if not expr.free_symbols & gathered.keys():
        return IndexValue(INDEX_DTYPE, simplify_index(expr.xreplace(direct)))
    if expr in gathered:
        return _as_index(gathered[expr])

    def sub(e: sympy.Expr) -> Expr:
        return index_value(e, direct, gathered)

    def fold(name: str, args) -> Expr:
        parts = [sub(a) for a in args]
        value = parts[0]
        for part in parts[1:]:
            value = Op(INDEX_DTYPE, name, (value, part))
        return value

    if isinstance(expr, sympy.Add):
        return fold("add", expr.args)
    if isinstance(expr, sympy.Mul):
        return fold("mul", expr.args)
    if isinstance(expr, FloorDiv):
        return fold("floordiv", expr.args)
    if isinstance(expr, (ModIndex, PyMod)):  # the remainder op has Python's sign rules
        return fold("remainder", expr.args)
    if isinstance(expr, PyFloorDiv):
        return fold("floordiv", expr.args)
    if isinstance(expr, sympy.Max) or type(expr).__name__ == "Max":
        return fold("maximum", expr.args)
    if isinstance(expr, sympy.Min) or type(expr).__name__ == "Min":
        return fold("minimum", expr.args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return fold("mul", [expr.base] * int(expr.exp))
    name = type(expr).__name__
    if name in _TORCH_BINARY:
        return fold(_TORCH_BINARY[name], expr.args)
    if name == "ModularIndexing":  # (x // divisor) % modulus
        x, divisor, modulus = (sub(a) for a in expr.args)
        return Op(INDEX_DTYPE, "remainder", (Op(INDEX_DTYPE, "floordiv", (x, divisor)), modulus))
    if expr.is_Integer:
        return Const(INDEX_DTYPE, int(expr))
    raise NotImplementedError(f"index expression {expr} at a gathered index")
