"""Split a pointwise kernel's inner loop where its index conditions change (cat, pad).

``cat`` and ``pad`` lower to ``where(i < 256, a[min(i, 255)], where(i < 512, ...))``: every
element evaluates every branch with clamped indices (both sides of a where must read valid
memory), and the clamps make the loads look non-contiguous to the vectorizer. When the
conditions compare the inner loop variable with constants, the loop splits at those
constants; in each piece every condition is a known constant, so the where folds away and
the clamps simplify (``min(i, 255)`` is ``i`` for ``i < 256``), leaving one contiguous copy
per piece, as eager's ``cat`` does.
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.expr import Const, Expr, IndexValue, Load, Op, Where, transform, walk

_COMPARISONS = {"lt", "le", "gt", "ge"}
_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
# Conditions of several regions (pad's "inside" test) combine with these; fold them too.
_LOGICAL = {"logical_and": lambda a, b: a and b, "logical_or": lambda a, b: a or b,
            "logical_xor": lambda a, b: a != b, "logical_not": lambda a: not a}


def split_points(bodies: list[Expr], var: sympy.Symbol, size: sympy.Expr) -> list[int]:
    """Where conditions of the form ``var + k <op> c`` (constants k, c) change, inside (0, size)."""
    if not sympy.sympify(size).is_number:
        return []
    points: set[int] = set()
    for body in bodies:
        for node in walk(body):
            found = _condition(node, var)
            if found is not None:
                points.add(found[1])
    return sorted(p for p in points if 0 < p < int(size))


def _condition(node: Expr, var: sympy.Symbol) -> tuple[str, int] | None:
    """(op, t) when ``node`` is ``var <op'> t`` in disguise, normalized so that the condition is
    true for var < t (op "before") or for var >= t (op "after")."""
    if not isinstance(node, Op) or node.name not in _COMPARISONS:
        return None
    a, b = node.args
    name = node.name
    if isinstance(a, Const) and isinstance(b, IndexValue):
        a, b, name = b, a, _MIRRORED[name]
    if not (isinstance(a, IndexValue) and isinstance(b, Const)) or isinstance(b.value, bool):
        return None
    offset = sympy.expand(sympy.sympify(a.index) - var)
    if not offset.is_number or a.index.coeff(var) != 1 or not float(b.value).is_integer():
        return None
    bound = int(b.value) - int(offset)  # var <op> bound
    if name == "lt":
        return "before", bound
    if name == "le":
        return "before", bound + 1
    if name == "gt":
        return "after", bound + 1
    return "after", bound  # ge


def specialize(body: Expr, var: sympy.Symbol, start: int, end: int) -> Expr:
    """``body`` for ``start <= var < end``, a range on which no split condition changes."""

    def rewrite(node: Expr) -> Expr | None:
        found = _condition(node, var)
        if found is not None:
            kind, bound = found
            return Const(torch.bool, start < bound if kind == "before" else start >= bound)
        if isinstance(node, Where) and isinstance(node.cond, Const):
            return node.if_true if node.cond.value else node.if_false
        if isinstance(node, Op) and node.name in _LOGICAL and all(isinstance(a, Const) for a in node.args):
            return Const(torch.bool, _LOGICAL[node.name](*(bool(a.value) for a in node.args)))
        if isinstance(node, Load) and not node.is_indirect:
            index = tuple(_fold_min_max(sympy.sympify(e), var, start, end) for e in node.index)
            return Load(node.dtype, node.buffer, index)
        return None

    return transform(body, rewrite)


def _fold_min_max(expr: sympy.Expr, var: sympy.Symbol, start: int, end: int) -> sympy.Expr:
    """Resolve ``Max``/``Min`` whose arguments are ordered over ``start <= var < end``."""

    def pick(args, largest: bool):
        args = list(args)
        for candidate in args:
            if all(_ordered(candidate, other, var, start, end, largest) for other in args if other is not candidate):
                return candidate
        return None

    def resolve(node):
        if isinstance(node, (sympy.Max, sympy.Min)):
            args = [resolve(a) for a in node.args]
            chosen = pick(args, isinstance(node, sympy.Max))
            return chosen if chosen is not None else type(node)(*args)
        if node.args:
            return node.func(*[resolve(a) for a in node.args])
        return node

    return resolve(expr)


def _ordered(a, b, var, start: int, end: int, largest: bool) -> bool:
    """``a >= b`` (``largest``) or ``a <= b`` over the whole range; both affine in var."""
    diff = sympy.expand(a - b)
    if diff.free_symbols - {var}:
        return False
    values = [diff.subs(var, start), diff.subs(var, end - 1)]  # affine: the extremes are the ends
    if not all(v.is_number for v in values):
        return False
    return all(v >= 0 for v in values) if largest else all(v <= 0 for v in values)
