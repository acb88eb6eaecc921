"""Rewrite node bodies: inline producers that are not stored, and move into kernel variables."""
from __future__ import annotations

from typing import Callable

import sympy

from torchfuse.ir.expr import Expr, IndexValue, Load, substitute_index, transform, walk
from torchfuse.ir.graph import Pointwise
from torchfuse.ir.symbols import simplify_index


def inline_producers(body: Expr, inlinable: Callable[[str], Pointwise | None],
                     on_inline: Callable[[Pointwise], None] | None = None) -> Expr:
    """Replace each direct load of an inlinable pointwise buffer by the producer's body.

    ``inlinable(name)`` returns the producer to recompute, or None to keep the load.
    Producers are inlined recursively (a chain of pointwise ops becomes one expression).
    """

    def rewrite(node: Expr) -> Expr | None:
        if not isinstance(node, Load):
            return None
        producer = inlinable(node.buffer)
        if producer is None:
            return None
        if on_inline is not None:
            on_inline(producer)
        mapping = dict(zip(producer.vars, node.index))
        inner = inline_producers(producer.body, inlinable, on_inline)
        if node.is_indirect:  # the scheduler checked gathered_vars_are_bare for this producer
            return substitute_gathered(inner, mapping)
        return substitute_index(inner, mapping)

    return transform(body, rewrite)


def substitute_gathered(expr: Expr, mapping: dict) -> Expr:
    """``substitute_index`` where some variables map to runtime values (``Expr``): those may
    only appear as whole index entries of loads, which become gathered entries."""
    gathered = {v: e for v, e in mapping.items() if isinstance(e, Expr)}
    direct = {v: e for v, e in mapping.items() if not isinstance(e, Expr)}

    def rewrite(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            index = []
            for entry in node.index:
                if isinstance(entry, Expr):
                    index.append(entry)
                elif entry in gathered:
                    index.append(gathered[entry])
                else:
                    if sympy.sympify(entry).free_symbols & gathered.keys():
                        raise ValueError(f"gathered variable inside an index expression: {entry}")
                    index.append(simplify_index(sympy.sympify(entry).xreplace(direct)))
            return Load(node.dtype, node.buffer, tuple(index))
        if isinstance(node, IndexValue):
            if node.index.free_symbols & gathered.keys():
                raise ValueError(f"gathered variable used as a value: {node.index}")
            return IndexValue(node.dtype, simplify_index(node.index.xreplace(direct)))
        return None

    return transform(expr, rewrite)


def gathered_vars_are_bare(producer: Pointwise, positions: set[int], pointwise: dict[str, Pointwise]) -> bool:
    """True when ``producer``'s variables at ``positions`` (about to receive runtime values
    from a gather) appear only as whole index entries of loads, also through the pointwise
    producers it would inline (checked whether or not they end up stored)."""
    gathered = {producer.vars[k] for k in positions}
    for node in walk(producer.body):
        if isinstance(node, IndexValue) and node.index.free_symbols & gathered:
            return False
        if not isinstance(node, Load):
            continue
        inner_positions = set()
        for k, entry in enumerate(node.index):
            if isinstance(entry, Expr):
                continue
            used = sympy.sympify(entry).free_symbols & gathered
            if used and entry not in gathered:
                return False
            if used:
                inner_positions.add(k)
        inner = pointwise.get(node.buffer)
        if inner_positions and inner is not None and not gathered_vars_are_bare(inner, inner_positions, pointwise):
            return False
    return True


def to_kernel_vars(body: Expr, var_map: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    return substitute_index(body, var_map)
