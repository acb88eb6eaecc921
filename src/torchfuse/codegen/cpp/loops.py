"""Loop nests for C++ kernels: which kernel variables become one loop.

The Triton renderer flattens all rows into one ``xindex`` and recovers each kernel variable
by div/mod; on a GPU that costs little. On a CPU a div/mod per element stops the compiler
from vectorizing, so we flatten only where it is free: adjacent variables ``a`` (outer, size
``na``) and ``b`` (inner, size ``nb``) merge into one loop ``m`` when every index in the
kernel uses them as ``c * (nb * a + b)``. Then ``a = m // nb, b = m % nb`` folds back to
``m`` everywhere (``simplify_index``) and the merged loop walks memory contiguously. A
broadcast or transposed operand blocks the merge, leaving a nested loop whose inner loop
is still contiguous for the other operands.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from torchfuse.codegen.layout import store_order
from torchfuse.ir.symbols import FloorDiv, ModIndex, linear_coefficients, simplify_index

if TYPE_CHECKING:
    from torchfuse.codegen.cpp.expressions import Scope

# Below this many elements a kernel runs on one thread: forking costs more than it saves
# (ATen's grain size).
PARALLEL_GRAIN = 32768


@dataclass(frozen=True)
class Loop:
    var: sympy.Symbol
    size: sympy.Expr


@dataclass
class LoopPlan:
    """The loops of one kernel and each kernel variable in terms of loop variables."""

    x_loops: list[Loop]
    r_loops: list[Loop]
    substitution: dict[sympy.Symbol, sympy.Expr]


def plan_loops(x_vars, x_ranges, r_vars, r_ranges, index_exprs: list[sympy.Expr],
               store_exprs: list[sympy.Expr] = ()) -> LoopPlan:
    """Merge adjacent kernel variables of each kind (rows, reduced dims) where free.

    Args:
        x_vars / x_ranges, r_vars / r_ranges: the kernel's variables and their sizes.
        index_exprs: every index the kernel computes (load and store offsets, index
            values), in kernel variables.
        store_exprs: a pointwise kernel's store offsets: its rows are walked in the order
            the first one lays them out (see ``codegen.layout.store_order``).
    Returns:
        The loops, outermost first, and the substitution of kernel variables.
    """
    x_vars, x_ranges = store_order(list(x_vars), list(x_ranges), store_exprs[0] if store_exprs else None)
    substitution: dict[sympy.Symbol, sympy.Expr] = {}
    exprs = [sympy.expand(e) for e in index_exprs]
    x_loops, exprs = _merge(list(x_vars), list(x_ranges), exprs, substitution)
    r_loops, _ = _merge(list(r_vars), list(r_ranges), exprs, substitution)
    return LoopPlan(x_loops, r_loops, substitution)


def _merge(variables, sizes, exprs, substitution) -> tuple[list[Loop], list[sympy.Expr]]:
    # Groups of kernel variables, each the flat row-major index over its members.
    loops = [Loop(v, s) for v, s in zip(variables, sizes)]
    members = [[v] for v in variables]
    k = len(loops) - 1
    while k > 0:
        outer, inner = loops[k - 1], loops[k]
        if _mergeable(outer, inner, exprs):
            merged = Loop(sympy.Symbol(_merged_name(members[k - 1] + members[k]), integer=True, nonnegative=True),
                          outer.size * inner.size)
            mapping = {outer.var: FloorDiv(merged.var, inner.size), inner.var: ModIndex(merged.var, inner.size)}
            exprs = [simplify_index(e.xreplace(mapping)) for e in exprs]
            for name, value in list(substitution.items()):
                substitution[name] = simplify_index(value.xreplace(mapping))
            for var in (outer.var, inner.var):
                if var not in substitution:
                    substitution[var] = mapping[var]
            loops[k - 1:k + 1] = [merged]
            members[k - 1:k + 1] = [members[k - 1] + members[k]]
        k -= 1
    for group in members:  # variables left alone map to themselves
        for var in group:
            substitution.setdefault(var, var)
    return loops, exprs


def _merged_name(group) -> str:
    # Keeps the prefix (x or r): codegen tells loop variables from sizes by it.
    first, last = group[0].name, group[-1].name
    return f"{first}_{last[1:]}"


def _mergeable(outer: Loop, inner: Loop, exprs) -> bool:
    for expr in exprs:
        if not expr.has(outer.var) and not expr.has(inner.var):
            continue
        found = linear_coefficients(expr, [outer.var, inner.var])
        if found is None:
            return False
        (c_outer, c_inner), _ = found
        if sympy.expand(c_outer - c_inner * inner.size) != 0:
            return False
    return True


def close_all(scope: "Scope", until: "Scope") -> None:
    """Close the braces of every scope from ``scope`` up to (not including) ``until``."""
    while scope is not until:
        scope.parent.emit("}")
        scope = scope.parent


def statically_at_most(expr, bound: int) -> bool:
    expr = sympy.sympify(expr)
    return bool(expr.is_number and int(expr) <= bound)


def statically_at_least(expr, bound: int) -> bool:
    expr = sympy.sympify(expr)
    return bool(expr.is_number and int(expr) >= bound)
