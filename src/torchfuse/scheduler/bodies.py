"""Rewrite node bodies: inline producers that are not stored, and move into kernel variables.

Inlining replaces each load of a pointwise producer that is not stored by the producer's body
at that index, recursively. A chain whose values are each read twice (``y = y * 0.5 + sin(y)``
forty times) would unfold into a tree of 2**40 nodes if every load were inlined separately, so
an ``Inliner`` inlines each producer at each index once and hands the same expression object to
every load of it: the result is a DAG as large as the chain, and the renderers emit each of its
nodes once (their common-subexpression cache, ``codegen/scope.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy

from torchfuse.ir.expr import Expr, IndexEntry, Load, loads, substitute_index, transform
from torchfuse.ir.gathered import substitute_values
from torchfuse.ir.graph import Pointwise

# A producer read at an index: (producer name, index entries in the reader's variables).
Key = tuple[str, tuple[IndexEntry, ...]]


@dataclass(frozen=True)
class Inlined:
    """A body with its producers inlined, and the names of the producers it recomputes."""

    body: Expr
    producers: frozenset[str]


class Inliner:
    """Inlines producers into bodies, each producer at each index once.

    Args:
        inlinable: returns the producer to recompute for a buffer name, or None to keep the
            load. It must answer the same for the Inliner's whole life: results are memoised
            across calls (one Inliner serves every node of a schedule on one device, so the
            members of a kernel share their inlined sub-expressions).

    A load through a gathered index (``logp[i, target[i]]``) recomputes the producer at the
    gathered point, with the runtime index value in place of the loop variable. The index of a
    memo key is in the reader's variables (``i0..``, ``r0..``, shared by all nodes), so the
    inlined expression at that index serves every reader that reads that element.
    """

    def __init__(self, inlinable: Callable[[str], Pointwise | None]) -> None:
        self.inlinable = inlinable
        self._done: dict[Key, Expr] = {}
        self._uses: dict[Key, tuple[Key, ...]] = {}  # the keys a key's expression inlined directly

    def inline(self, body: Expr) -> Inlined:
        """``body`` with every inlinable load replaced by its producer's (inlined) body."""
        self._resolve_direct(body)
        expr, used = self._rewrite_loads(body)
        return Inlined(expr, self._producers(used))

    def _rewrite_loads(self, body: Expr) -> tuple[Expr, tuple[Key, ...]]:
        """One pass over ``body``: loads of producers become their memoised expressions."""
        used: list[Key] = []

        def rewrite(node: Expr) -> Expr | None:
            if not isinstance(node, Load):
                return None
            producer = self.inlinable(node.buffer)
            if producer is None:
                return None
            key = (producer.name, node.index)
            if key not in self._done:  # only a gathered load: direct ones were resolved first
                placed = _placed(producer, node.index)
                self._resolve_direct(placed)
                self._finish(key, placed)
            used.append(key)
            return self._done[key]

        return transform(body, rewrite), tuple(dict.fromkeys(used))

    def _resolve_direct(self, body: Expr) -> None:
        """Inline every producer that ``body`` reads at a direct index, deepest first, with an
        explicit stack (a chain of a few hundred producers would exceed Python's recursion
        limit). A gathered load's key depends on its inlined index, so ``_rewrite_loads``
        resolves it when it gets there."""
        placed: dict[Key, Expr] = {}
        stack = self._direct_keys(body)
        while stack:
            key, producer = stack[-1]
            if key in self._done:
                stack.pop()
                continue
            if key not in placed:
                placed[key] = _placed(producer, key[1])
            missing = [(k, p) for k, p in self._direct_keys(placed[key]) if k not in self._done]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            self._finish(key, placed.pop(key))

    def _finish(self, key: Key, placed: Expr) -> None:
        self._done[key], self._uses[key] = self._rewrite_loads(placed)

    def _direct_keys(self, body: Expr) -> list[tuple[Key, Pointwise]]:
        found = []
        for load in loads(body):
            producer = None if load.is_indirect else self.inlinable(load.buffer)
            if producer is not None:
                found.append(((producer.name, load.index), producer))
        return found

    def _producers(self, keys: tuple[Key, ...]) -> frozenset[str]:
        """Names of the producers recomputed under ``keys`` (each key visited once)."""
        seen: set[Key] = set()
        stack = list(keys)
        while stack:
            key = stack.pop()
            if key not in seen:
                seen.add(key)
                stack.extend(self._uses[key])
        return frozenset(name for name, _ in seen)


def _placed(producer: Pointwise, index: tuple[IndexEntry, ...]) -> Expr:
    """``producer``'s own body at ``index`` (its loads not yet inlined)."""
    if not any(isinstance(e, Expr) for e in index):
        mapping = {v: e for v, e in zip(producer.vars, index) if v != e}
        return substitute_index(producer.body, mapping)  # the body itself when read in place
    direct = {v: e for v, e in zip(producer.vars, index) if not isinstance(e, Expr)}
    gathered = {v: e for v, e in zip(producer.vars, index) if isinstance(e, Expr)}
    return substitute_values(producer.body, direct, gathered)


def to_kernel_vars(body: Expr, var_map: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    return substitute_index(body, var_map)
