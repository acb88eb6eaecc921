"""Loop-body expressions: the values a kernel computes at one point of its iteration space.

A body is a DAG of small frozen dataclasses. Leaves are constants, loads and index values;
inner nodes are ``Op`` (a named operation from ``ops.OPS``), ``Where`` and ``Cast``. Index
arithmetic stays in sympy (see ``symbols.py``) until a load needs a runtime value for an
index (a gather): then that index entry is itself an ``Expr``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Union

import sympy
import torch

from torchfuse.ir.symbols import simplify_index


@dataclass(frozen=True)
class Expr:
    """Base of all body expressions; every expression knows its dtype."""

    dtype: torch.dtype

    def children(self) -> tuple["Expr", ...]:
        return ()


@dataclass(frozen=True)
class Const(Expr):
    value: Union[bool, int, float]


@dataclass(frozen=True)
class IndexValue(Expr):
    """An index expression used as a value (``iota``, masks of ``cat``/``pad``, one-hot)."""

    index: sympy.Expr


# An entry of a load's index: sympy arithmetic on loop variables, or a runtime value.
IndexEntry = Union[sympy.Expr, Expr]


@dataclass(frozen=True)
class Load(Expr):
    """``buffer[index]``: ``index`` has one entry per dimension of the buffer's shape."""

    buffer: str
    index: tuple[IndexEntry, ...]

    def children(self) -> tuple[Expr, ...]:
        return tuple(e for e in self.index if isinstance(e, Expr))

    @property
    def is_indirect(self) -> bool:
        return any(isinstance(e, Expr) for e in self.index)


@dataclass(frozen=True)
class Op(Expr):
    """A named elementwise operation (``add``, ``exp``, ``lt``, ...) on already-cast args."""

    name: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Where(Expr):
    cond: Expr
    if_true: Expr
    if_false: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.if_true, self.if_false)


@dataclass(frozen=True)
class Cast(Expr):
    """Convert ``value`` to ``dtype``; rounds to that precision even inside fused code."""

    value: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


def walk(expr: Expr) -> Iterator[Expr]:
    """Every distinct sub-expression, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.children()))


def loads(expr: Expr) -> list[Load]:
    return [node for node in walk(expr) if isinstance(node, Load)]


def read_buffers(expr: Expr) -> list[str]:
    """Names of buffers that ``expr`` reads, in first-read order, without repeats."""
    return list(dict.fromkeys(load.buffer for load in loads(expr)))


def count_ops(expr: Expr) -> int:
    return sum(1 for node in walk(expr) if isinstance(node, (Op, Where, Cast)))


def transform(expr: Expr, rewrite: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``expr`` bottom-up; ``rewrite(node)`` returns a replacement or None to keep it.

    ``rewrite`` sees each node after its children were rebuilt. Results are memoised by
    identity, so shared sub-expressions stay shared.
    """
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        key = id(node)
        if key in memo:
            return memo[key]
        rebuilt = _rebuild(node, visit)
        replaced = rewrite(rebuilt)
        result = rebuilt if replaced is None else replaced
        memo[key] = result
        return result

    return visit(expr)


def _rebuild(node: Expr, visit: Callable[[Expr], Expr]) -> Expr:
    if isinstance(node, Load):
        if not node.is_indirect:
            return node
        index = tuple(visit(e) if isinstance(e, Expr) else e for e in node.index)
        return Load(node.dtype, node.buffer, index)
    if isinstance(node, Op):
        return Op(node.dtype, node.name, tuple(visit(a) for a in node.args))
    if isinstance(node, Where):
        return Where(node.dtype, visit(node.cond), visit(node.if_true), visit(node.if_false))
    if isinstance(node, Cast):
        return Cast(node.dtype, visit(node.value))
    return node


def substitute_index(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Replace loop variables in every index of ``expr`` (loads and index values)."""
    if not mapping:
        return expr

    def rewrite(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            index = tuple(
                e if isinstance(e, Expr) else simplify_index(sympy.sympify(e).xreplace(mapping))
                for e in node.index
            )
            return Load(node.dtype, node.buffer, index)
        if isinstance(node, IndexValue):
            return IndexValue(node.dtype, simplify_index(node.index.xreplace(mapping)))
        return None

    return transform(expr, rewrite)


def index_symbols(expr: Expr) -> set[sympy.Symbol]:
    """All sympy symbols (loop variables and sizes) that ``expr``'s indices mention."""
    found: set[sympy.Symbol] = set()
    for node in walk(expr):
        if isinstance(node, Load):
            for entry in node.index:
                if not isinstance(entry, Expr):
                    found |= sympy.sympify(entry).free_symbols
        elif isinstance(node, IndexValue):
            found |= node.index.free_symbols
    return found
