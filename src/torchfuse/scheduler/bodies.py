"""Rewrite node bodies: inline producers that are not stored, and move into kernel variables."""
from __future__ import annotations

from typing import Callable

import sympy

from torchfuse.ir.expr import Expr, Load, substitute_index, transform
from torchfuse.ir.graph import Pointwise


def inline_producers(body: Expr, inlinable: Callable[[str], Pointwise | None],
                     on_inline: Callable[[Pointwise], None] | None = None) -> Expr:
    """Replace each direct load of an inlinable pointwise buffer by the producer's body.

    ``inlinable(name)`` returns the producer to recompute, or None to keep the load.
    Producers are inlined recursively (a chain of pointwise ops becomes one expression).
    """

    def rewrite(node: Expr) -> Expr | None:
        if not isinstance(node, Load) or node.is_indirect:
            return None
        producer = inlinable(node.buffer)
        if producer is None:
            return None
        if on_inline is not None:
            on_inline(producer)
        mapping = dict(zip(producer.vars, node.index))
        inner = inline_producers(producer.body, inlinable, on_inline)
        return substitute_index(inner, mapping)

    return transform(body, rewrite)


def to_kernel_vars(body: Expr, var_map: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    return substitute_index(body, var_map)
