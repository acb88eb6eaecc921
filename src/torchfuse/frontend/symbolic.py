"""Convert torch's symbolic sizes (SymInt/SymFloat/SymBool) into sympy expressions.

Kept in frontend/ because ``SymInt.node.expr`` is torch-internal API.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily


def to_sympy(value: Any) -> sympy.Expr:
    """An int or SymInt (or a float/bool constant) as a sympy expression."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.expr
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, float):
        return sympy.Float(value)
    if isinstance(value, sympy.Expr):
        return value
    raise TypeError(f"cannot use {type(value).__name__} as a size")


def shape_of(tensor: torch.Tensor) -> tuple[sympy.Expr, ...]:
    return tuple(to_sympy(s) for s in tensor.shape)


def strides_of(tensor: torch.Tensor) -> tuple[sympy.Expr, ...]:
    return tuple(to_sympy(s) for s in tensor.stride())


def offset_of(tensor: torch.Tensor) -> sympy.Expr:
    return to_sympy(tensor.storage_offset())


def is_symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def size_hint(expr: sympy.Expr, shape_env: Any | None) -> int:
    """A concrete example value of a size expression (the value it had when traced)."""
    expr = sympy.sympify(expr)
    if expr.is_number:
        return int(expr)
    if shape_env is not None:
        return int(shape_env.size_hint(expr))
    raise ValueError(f"no example value for size {expr}")


def shape_env_of(example_inputs: list[Any]) -> Any | None:
    """The ShapeEnv behind symbolic example inputs, if any."""
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            for size in list(value.shape) + list(value.stride()):
                if is_symbolic(size):
                    return size.node.shape_env
        elif is_symbolic(value):
            return value.node.shape_env
    return None


def constant_value(tensor: torch.Tensor):
    """The Python value of a real 0-dim constant, read outside the compile-time fake mode."""
    with unset_fake_temporarily():
        return tensor.item()
