"""Loads that one side of a ``Where`` needs only where that side is taken: masked by the
condition instead of clamped into bounds.

Region rules (``cat``, ``constant_pad_nd``, pooling windows; ``lowering/rules/indexing.py``)
clamp each region's load index into its source, because both sides of a ``Where`` are
evaluated and a lane whose value is thrown away must still read valid memory. On a GPU the
clamp costs more than its instructions: Triton's alignment analysis gives ``tl.minimum`` or
``tl.maximum`` of an index a contiguity of 1, so every such load becomes a 2-byte scalar
load. (A LLaMA block's SwiGLU-gradient ``cat``, compiled for sm_90: 40 ``ld.b16`` a thread
clamped, 5 ``ld.v4.b32`` masked; it ran at 40% of copy bandwidth on the H200.)

Inside a branch its condition is known, and it usually says the clamp does nothing: under
``i < 512``, ``Min(i, 511)`` is ``i``. Such clamps are dropped, and the load is masked with
the branch's conditions; lanes outside read nothing (``other=0``), and the ``Where``
discards their values. A clamp the conditions do not prove idle stays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import sympy
import torch

from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, Where

# What a branch knows: (condition, whether it holds there).
Fact = tuple[Expr, bool]

# An index comparison ``a OP b`` as ``form <= 0`` over the integers, when it holds.
_HOLDS = {"lt": lambda a, b: a - b + 1, "le": lambda a, b: a - b,
          "gt": lambda a, b: b - a + 1, "ge": lambda a, b: b - a}
_NEGATION = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


@dataclass(frozen=True, eq=False)
class GuardedLoad(Expr):
    """``load``, needed only where every fact in ``facts`` is as stated (a node of the Triton
    writer only: it never reaches the IR)."""

    load: Load
    facts: tuple[Fact, ...]


def guard_branches(expr: Expr, facts: tuple[Fact, ...] = (), done: dict[int, Expr] | None = None) -> Expr:
    """``expr`` with every load that has a clamp in its index and sits under a ``Where`` branch
    wrapped in a ``GuardedLoad`` carrying that branch's facts (outer branches' included).

    ``done`` collects the ``Where`` nodes of the result (by id), whose branches need no second
    pass; shared sub-expressions stay shared for each set of facts."""
    done = {} if done is None else done
    memo: dict[tuple[int, tuple[Fact, ...]], Expr] = {}

    def visit(node: Expr, known: tuple[Fact, ...]) -> Expr:
        key = (id(node), known)
        if key not in memo:
            memo[key] = _guarded(node, known, visit)
            if isinstance(memo[key], Where):
                done[id(memo[key])] = memo[key]
        return memo[key]

    return visit(expr, facts)


def _guarded(node: Expr, known: tuple[Fact, ...], visit) -> Expr:
    if isinstance(node, Where):
        cond = visit(node.cond, known)
        if_true = visit(node.if_true, (*known, (cond, True)))
        if_false = visit(node.if_false, (*known, (cond, False)))
        if all(a is b for a, b in zip((cond, if_true, if_false), node.children())):
            return node
        return Where(node.dtype, cond, if_true, if_false)
    if isinstance(node, Load):
        index = tuple(visit(e, known) if isinstance(e, Expr) else e for e in node.index)
        load = node if all(a is b for a, b in zip(index, node.index)) else Load(node.dtype, node.buffer, index)
        return GuardedLoad(node.dtype, load, known) if known and _has_clamp(load) else load
    if isinstance(node, Op):
        args = tuple(visit(a, known) for a in node.args)
        return node if all(a is b for a, b in zip(args, node.args)) else Op(node.dtype, node.name, args)
    if isinstance(node, Cast):
        value = visit(node.value, known)
        return node if value is node.value else Cast(node.dtype, value)
    if isinstance(node, IndexValue) and known and node.index.has(sympy.Min, sympy.Max):
        # No memory is read: the value only has to be right where the facts hold, so an idle
        # clamp goes without a mask (a nested cat's condition on the outer one's clamped index).
        index = _drop_idle_clamps(node.index, _all_forms(known), set())
        return node if index == node.index else IndexValue(node.dtype, index)
    return node  # Const, GuardedLoad


def _has_clamp(load: Load) -> bool:
    return any(not isinstance(e, Expr) and sympy.sympify(e).has(sympy.Min, sympy.Max) for e in load.index)


def unclamp(load: Load, facts: tuple[Fact, ...]) -> tuple[Load, Expr | None]:
    """``load`` without the clamps ``facts`` prove idle, and the mask it then needs: the
    conjunction of *all* the facts (None when no clamp could be dropped).

    All, not only those a proof used: a nested branch's condition may itself have been
    unclamped under the outer ones (a rotary ``cat`` inside a ``cat``), so it is right only
    where they hold; on the lanes where every fact holds, each is evaluated correctly."""
    forms = _all_forms(facts)
    used: set[int] = set()
    index = tuple(e if isinstance(e, Expr) else _drop_idle_clamps(sympy.sympify(e), forms, used)
                  for e in load.index)
    if not used:
        return load, None
    guard = None
    for cond, holds in facts:
        term = cond if holds else Op(torch.bool, "logical_not", (cond,))
        guard = term if guard is None else Op(torch.bool, "logical_and", (guard, term))
    return Load(load.dtype, load.buffer, index), guard


def _all_forms(facts: tuple[Fact, ...]) -> list[tuple[sympy.Expr, int]]:
    """Every ``form <= 0`` the facts give, with the index of the fact it came from."""
    return [(form, i) for i, fact in enumerate(facts) for form in _forms(*fact)]


def _forms(cond: Expr, holds: bool) -> list[sympy.Expr]:
    """What ``cond`` being ``holds`` says, as expressions that are <= 0. Index comparisons and
    (when they hold) conjunctions of them; anything else says nothing here."""
    if not isinstance(cond, Op):
        return []
    if cond.name == "logical_and" and holds:
        return [f for arg in cond.args for f in _forms(arg, True)]
    name = cond.name if holds else _NEGATION.get(cond.name)
    if name not in _HOLDS:
        return []
    sides = [_index_of(arg) for arg in cond.args]
    if any(side is None for side in sides):
        return []
    return [sympy.expand(_HOLDS[name](*sides))]


def _index_of(arg: Expr) -> sympy.Expr | None:
    if isinstance(arg, IndexValue):
        return arg.index
    if isinstance(arg, Const) and isinstance(arg.value, int) and not isinstance(arg.value, bool):
        return sympy.Integer(arg.value)
    return None


def _drop_idle_clamps(entry: sympy.Expr, forms: list[tuple[sympy.Expr, int]], used: set[int]) -> sympy.Expr:
    def idle(node: sympy.Expr) -> sympy.Expr | None:
        """The argument a Min/Max equals wherever the facts hold, or None."""
        pick_max = isinstance(node, sympy.Max)
        for kept in node.args:
            proofs = [_proof(other - kept if pick_max else kept - other, forms) for other in node.args if other != kept]
            if all(p is not None for p in proofs):
                used.update(proofs)
                return kept
        return None

    def rewrite(node: sympy.Expr) -> sympy.Expr:
        kept = idle(node)
        return node if kept is None else kept

    return entry.replace(lambda n: isinstance(n, (sympy.Min, sympy.Max)), rewrite)


def _proof(claim: sympy.Expr, forms: Iterable[tuple[sympy.Expr, int]]) -> int | None:
    """The index of a fact ``form <= 0`` that implies ``claim <= 0`` (their difference is a
    non-positive number), or None."""
    for form, i in forms:
        gap = sympy.expand(claim - form)
        if gap.is_number and gap <= 0:
            return i
    return None
