"""Loop-body expressions: the values a kernel computes at one point of its iteration space.

A body is a DAG of small frozen dataclasses. Leaves are constants, loads and index values;
inner nodes are ``Op`` (a named operation from ``ops.OPS``), ``Where`` and ``Cast``. Index
arithmetic stays in sympy (see ``symbols.py``) until a load needs a runtime value for an
index (a gather): then that index entry is itself an ``Expr``.

Bodies share sub-expressions (an inlined producer read twice is one object), so a DAG of n
nodes may unfold into a tree of 2**n. Everything that looks at a body must therefore visit
each distinct node once: ``walk`` and ``transform`` go by identity, and hashing and equality
(structural, as for any frozen dataclass) are computed once per node (``_cached_hash``) and
compare each pair of nodes once (``_structurally_equal``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Callable, Iterator, Union

import sympy
import torch

from torchfuse.ir.symbols import simplify_index


@dataclass(frozen=True, eq=False)
class Expr:
    """Base of all body expressions; every expression knows its dtype.

    Equality is structural (same class, equal fields), as a frozen dataclass's, and the hash
    agrees with it; both are defined here once for every subclass, which therefore say
    ``eq=False`` (a dataclass's own ``__eq__``/``__hash__`` would recurse into a shared child
    once per path to it: exponential in a DAG's depth).
    """

    dtype: torch.dtype

    def children(self) -> tuple["Expr", ...]:
        return ()

    def __hash__(self) -> int:
        return _cached_hash(self)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _structurally_equal(self, other)

    def __getstate__(self) -> dict:
        # The cached hash belongs to this process (str hashes are salted): never pickle it.
        return {k: v for k, v in self.__dict__.items() if k != _HASH}


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Union[bool, int, float]


@dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    """An index expression used as a value (``iota``, masks of ``cat``/``pad``, one-hot)."""

    index: sympy.Expr


# An entry of a load's index: sympy arithmetic on loop variables, or a runtime value.
IndexEntry = Union[sympy.Expr, Expr]


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """``buffer[index]``: ``index`` has one entry per dimension of the buffer's shape."""

    buffer: str
    index: tuple[IndexEntry, ...]

    def children(self) -> tuple[Expr, ...]:
        return tuple(e for e in self.index if isinstance(e, Expr))

    @property
    def is_indirect(self) -> bool:
        return any(isinstance(e, Expr) for e in self.index)


@dataclass(frozen=True, eq=False)
class Op(Expr):
    """A named elementwise operation (``add``, ``exp``, ``lt``, ...) on already-cast args."""

    name: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True, eq=False)
class Where(Expr):
    cond: Expr
    if_true: Expr
    if_false: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.if_true, self.if_false)


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """Convert ``value`` to ``dtype``; rounds to that precision even inside fused code."""

    value: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


_HASH = "_hash"  # where a node keeps its hash once computed (frozen: set by object.__setattr__)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _field_values(node: Expr) -> tuple:
    return tuple(getattr(node, name) for name in _field_names(node.__class__))


def _cached_hash(expr: Expr) -> int:
    """The structural hash of ``expr``, computed once per node, children first. Iterative (a
    deep chain would exceed Python's recursion limit), and it stops at hashed nodes."""
    stack = [expr]
    while stack:
        node = stack[-1]
        if _HASH in node.__dict__:
            stack.pop()
            continue
        unhashed = [c for c in node.children() if _HASH not in c.__dict__]
        if unhashed:
            stack.extend(unhashed)
            continue
        stack.pop()
        object.__setattr__(node, _HASH, hash((node.__class__.__name__, _field_values(node))))
    return expr.__dict__[_HASH]


def _structurally_equal(a: Expr, b: Expr) -> bool:
    """Same classes and equal fields all the way down, comparing each pair of nodes once.

    Identical nodes are equal; nodes with different hashes are not (equal fields hash
    equally). Other field values compare as in a dataclass's ``==`` (identity, then ``==``).
    """
    pending = [(a, b)]
    compared: set[tuple[int, int]] = set()
    while pending:
        x, y = pending.pop()
        if x is y or (id(x), id(y)) in compared:
            continue
        if x.__class__ is not y.__class__ or hash(x) != hash(y):
            return False
        compared.add((id(x), id(y)))
        for u, v in zip(_field_values(x), _field_values(y)):
            if not _values_equal(u, v, pending):
                return False
    return True


def _values_equal(u: object, v: object, pending: list[tuple[Expr, Expr]]) -> bool:
    """Compare two field values; a pair of expressions is queued on ``pending`` instead."""
    if isinstance(u, Expr) and isinstance(v, Expr):
        pending.append((u, v))
        return True
    if isinstance(u, tuple) and isinstance(v, tuple):  # a load's index: sympy and Expr entries
        return len(u) == len(v) and all(_values_equal(p, q, pending) for p, q in zip(u, v))
    return u is v or bool(u == v)


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
    identity, so shared sub-expressions stay shared; a node whose children all come back
    unchanged is kept (not copied), so what a rewrite leaves alone stays shared with the input.
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
    children = node.children()
    if not children:
        return node
    rebuilt = tuple(visit(c) for c in children)
    if all(new is old for new, old in zip(rebuilt, children)):
        return node
    if isinstance(node, Load):
        fresh = iter(rebuilt)
        return Load(node.dtype, node.buffer, tuple(next(fresh) if isinstance(e, Expr) else e for e in node.index))
    if isinstance(node, Op):
        return Op(node.dtype, node.name, rebuilt)
    if isinstance(node, Where):
        return Where(node.dtype, *rebuilt)
    if isinstance(node, Cast):
        return Cast(node.dtype, rebuilt[0])
    raise NotImplementedError(f"rebuilding {type(node).__name__}")


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
