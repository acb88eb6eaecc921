"""Tensor creation: constants (``full``, ``zeros``, ``empty``, ``fill``) and ranges (``arange``, ``iota``).

These read no buffer: their bodies are a ``Const`` or an ``IndexValue`` of the loop
variables, so the scheduler inlines them into every reader and they never touch memory
unless they are a graph output. The output shape and dtype always come from the node's
``meta['val']``: eager's own answer, including its dtype inference for ``arange``/``full``.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from torchfuse.ir.expr import Cast, Expr, IndexValue, Op
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import cast, operand, out_meta, output_shape
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten
prims = torch.ops.prims


def constant(ctx: LoweringContext, node: torch.fx.Node, value: Any) -> TensorValue:
    """A node of the output's shape whose every element is ``value`` (a scalar, SymInt or 0-d tensor)."""
    meta = out_meta(node)
    shape = output_shape(node)
    if isinstance(value, TensorValue):  # fill.Tensor: a 0-d tensor broadcast to every element
        return ctx.pointwise(shape, meta.dtype, meta.device, lambda idx: cast(value.load(()), meta.dtype))
    return ctx.pointwise(shape, meta.dtype, meta.device, lambda idx: operand(value, (), (), meta.dtype))


# Ops whose result is a constant, with where each finds its fill value. ``empty*`` gives
# zeros: any value is correct for memory the program must write before reading.
@register_lowering(aten.full.default, aten.full_like.default, aten.scalar_tensor.default)
def full(ctx: LoweringContext, node: torch.fx.Node, first: Any, fill_value: Any = 0, **kwargs: Any) -> TensorValue:
    if node.target is aten.scalar_tensor.default:
        fill_value = first
    return constant(ctx, node, fill_value)


@register_lowering(aten.new_full.default)
def new_full(ctx: LoweringContext, node: torch.fx.Node, x: Any, size: Any, fill_value: Any, **kwargs: Any) -> TensorValue:
    return constant(ctx, node, fill_value)


@register_lowering(
    aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default,
    aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
    aten.empty_permuted.default, aten.new_empty.default, aten.new_empty_strided.default,
)
def zeros(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> TensorValue:
    return constant(ctx, node, 0)


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> TensorValue:
    return constant(ctx, node, 1)


@register_lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(ctx: LoweringContext, node: torch.fx.Node, x: Any, value: Any) -> TensorValue:
    return constant(ctx, node, value)


# -- ranges ---------------------------------------------------------------------------------
def _is_integral(value: Any) -> bool:
    """True for python ints and integer sympy expressions (SymInts); False for floats."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return True
    if isinstance(value, sympy.Expr):
        return bool(value.is_integer) or (value.is_number and value == int(value) and not value.is_Float)
    return False


def range_body(start: Any, step: Any, var: sympy.Symbol, dtype: torch.dtype) -> Expr:
    """``start + step * var`` in ``dtype``.

    Integer start and step stay exact index arithmetic (one ``IndexValue``). A float start or
    step is computed in float64 and then rounded once to ``dtype``, as eager's CPU kernel
    does (it accumulates in double), so ``arange(0.1, 1, 0.3)`` matches it bit for bit.
    """
    if _is_integral(start) and _is_integral(step):
        # int(): a bool start/step (``arange(False, True, True)``) would become a sympy boolean.
        start, step = (int(v) if isinstance(v, bool) else v for v in (start, step))
        return cast(IndexValue(torch.int64, sympy.sympify(start) + sympy.sympify(step) * var), dtype)
    wide = torch.float64
    position = Cast(wide, IndexValue(torch.int64, var))
    scaled = Op(wide, "mul", (position, operand(step, (), (), wide)))
    return cast(Op(wide, "add", (operand(start, (), (), wide), scaled)), dtype)


@register_lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> TensorValue:
    if node.target is aten.arange.default:
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    meta = out_meta(node)
    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, lambda idx: range_body(start, step, idx[0], meta.dtype))


@register_lowering(prims.iota.default)
def iota(ctx: LoweringContext, node: torch.fx.Node, length: Any, *, start: Any, step: Any, dtype: torch.dtype,
         device: Any, requires_grad: bool = False) -> TensorValue:
    meta = out_meta(node)
    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, lambda idx: range_body(start, step, idx[0], meta.dtype))
