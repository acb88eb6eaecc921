"""The table of lowering rules: one rule per ATen op, registered next to its code.

A rule receives the ``LoweringContext``, the FX node (for its ``meta['val']``: output
shape, dtype and strides as eager computes them) and the op's arguments with every tensor
replaced by a ``TensorValue`` and every SymInt by a sympy expression.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

Rule = Callable[..., Any]
_RULES: dict[Any, Rule] = {}


def register_lowering(*ops: Any) -> Callable[[Rule], Rule]:
    """Register ``rule`` for each ATen op: an OpOverload, or an OpOverloadPacket for all overloads."""

    def decorate(rule: Rule) -> Rule:
        for op in ops:
            _RULES[op] = rule
        return rule

    return decorate


def lookup(target: Any) -> Rule | None:
    """The rule for an FX call target: the exact overload first, then its packet."""
    rule = _RULES.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = _RULES.get(target.overloadpacket)
    return rule


def registered_ops() -> list[Any]:
    return list(_RULES)
