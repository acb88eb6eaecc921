"""Rewrite node bodies: inline producers that are not stored, and move into kernel variables."""
from __future__ import annotations

from typing import Callable

import sympy

from torchfuse.ir.expr import Expr, Load, substitute_index, transform
from torchfuse.ir.gathered import substitute_values
from torchfuse.ir.graph import Pointwise


def inline_producers(body: Expr, inlinable: Callable[[str], Pointwise | None],
                     on_inline: Callable[[Pointwise], None] | None = None) -> Expr:
    """Replace each load of an inlinable pointwise buffer by the producer's body at that index.

    ``inlinable(name)`` returns the producer to recompute, or None to keep the load.
    Producers are inlined recursively (a chain of pointwise ops becomes one expression). A
    load through a gathered index (``logp[i, target[i]]``) recomputes the producer at the
    gathered point, with the runtime index value in place of the loop variable.
    """

    def rewrite(node: Expr) -> Expr | None:
        if not isinstance(node, Load):
            return None
        producer = inlinable(node.buffer)
        if producer is None:
            return None
        if on_inline is not None:
            on_inline(producer)
        inner = inline_producers(producer.body, inlinable, on_inline)
        if not node.is_indirect:
            return substitute_index(inner, dict(zip(producer.vars, node.index)))
        direct = {v: e for v, e in zip(producer.vars, node.index) if not isinstance(e, Expr)}
        gathered = {v: e for v, e in zip(producer.vars, node.index) if isinstance(e, Expr)}
        return substitute_values(inner, direct, gathered)

    return transform(body, rewrite)


def to_kernel_vars(body: Expr, var_map: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    return substitute_index(body, var_map)
