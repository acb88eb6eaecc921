"""Reductions: each becomes one or more Reduction nodes plus pointwise epilogues.

``mean`` is a sum and a division; ``var`` is two passes (mean, then the sum of squared
deviations), which is exact in float32 where a one-pass sum of squares is not. The
scheduler fuses the passes over the same rows back into one kernel.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from torchfuse.ir.expr import Const, Expr, Op
from torchfuse.ir.symbols import product
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import cast, out_meta
from torchfuse.lowering.rules.views import squeeze_unsqueeze  # noqa: F401  (view helpers)
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten


def _axes(x: TensorValue, dims: Any) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(x.rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(x.rank, 1) for d in dims})) if x.rank else ()


def reduce(ctx: LoweringContext, x: TensorValue, axes: tuple[int, ...], keepdim: bool, op: str,
           dtype: torch.dtype, input_dtype: torch.dtype | None = None) -> TensorValue:
    """Reduce ``x`` over ``axes`` with ``op``; the input is cast to ``input_dtype`` first."""
    input_dtype = input_dtype or dtype
    return ctx.reduction(x.shape, axes, keepdim, dtype, x.device, op, lambda idx: cast(x.load(idx), input_dtype))


def _squeeze_axes(value: TensorValue, axes: tuple[int, ...]) -> TensorValue:
    """Drop the kept-as-1 ``axes`` of a keepdim=True result."""
    kept = [d for d in range(value.rank) if d not in axes]

    def index_of_new(new_index):
        old = [sympy.Integer(0)] * value.rank
        for k, d in enumerate(kept):
            old[d] = new_index[k]
        return tuple(old)

    return value.view(tuple(value.shape[d] for d in kept), index_of_new)


def _elementwise(ctx: LoweringContext, value: TensorValue, dtype: torch.dtype, fn) -> TensorValue:
    return ctx.pointwise(value.shape, dtype, value.device, lambda idx: fn(cast(value.load(idx), dtype)))


@register_lowering(aten.sum)
def sum_(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, keepdim: bool = False,
         dtype: Any = None) -> TensorValue:
    out_dtype = out_meta(node).dtype
    return reduce(ctx, x, _axes(x, dims), keepdim, "sum", out_dtype)


@register_lowering(aten.prod)
def prod(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, _axes(x, dim), keepdim, "prod", out_meta(node).dtype)


@register_lowering(aten.amax, aten.amin)
def amax_amin(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = (), keepdim: bool = False) -> TensorValue:
    op = "max" if node.target.overloadpacket is aten.amax else "min"
    return reduce(ctx, x, _axes(x, dims), keepdim, op, x.dtype)


@register_lowering(aten.any, aten.all)
def any_all(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    op = "any" if node.target.overloadpacket is aten.any else "all"
    return reduce(ctx, x, _axes(x, dims), keepdim, op, torch.bool)


@register_lowering(aten.argmax, aten.argmin)
def argmax_argmin(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    op = "argmax" if node.target.overloadpacket is aten.argmax else "argmin"
    if dim is None:  # over the flattened tensor; keepdim keeps every dim as 1
        return reduce(ctx, x, tuple(range(x.rank)), keepdim, op, torch.int64, x.dtype)
    return reduce(ctx, x, _axes(x, dim), keepdim, op, torch.int64, x.dtype)


@register_lowering(aten.max.dim, aten.min.dim)
def max_min_dim(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    is_max = node.target is aten.max.dim
    axes = _axes(x, dim)
    values = reduce(ctx, x, axes, keepdim, "max" if is_max else "min", x.dtype)
    indices = reduce(ctx, x, axes, keepdim, "argmax" if is_max else "argmin", torch.int64, x.dtype)
    return values, indices


@register_lowering(aten.max.default, aten.min.default)
def max_min_all(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue) -> TensorValue:
    op = "max" if node.target is aten.max.default else "min"
    return reduce(ctx, x, tuple(range(x.rank)), False, op, x.dtype)


def _count(x: TensorValue, axes: tuple[int, ...]) -> sympy.Expr:
    return product(x.shape[d] for d in axes)


@register_lowering(aten.mean)
def mean(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, keepdim: bool = False,
         dtype: Any = None) -> TensorValue:
    out_dtype = out_meta(node).dtype
    axes = _axes(x, dims)
    total = reduce(ctx, x, axes, keepdim, "sum", out_dtype)
    count = _count(x, axes)
    return _divide(ctx, total, count, out_dtype)


def _divide(ctx: LoweringContext, value: TensorValue, count: sympy.Expr, dtype: torch.dtype) -> TensorValue:
    from torchfuse.lowering.rules.common import operand

    def fn(v: Expr) -> Expr:
        return Op(dtype, "truediv", (v, operand(count, (), (), dtype)))

    return _elementwise(ctx, value, dtype, fn)


def _mean_and_var(ctx: LoweringContext, x: TensorValue, axes: tuple[int, ...], correction: Any,
                  keepdim: bool, dtype: torch.dtype) -> tuple[TensorValue, TensorValue]:
    """Two-pass variance: the mean first, then the mean of squared deviations."""
    count = _count(x, axes)
    mean_kept = _divide(ctx, reduce(ctx, x, axes, True, "sum", dtype), count, dtype)

    def squared_deviation(idx: tuple) -> Expr:
        mean_index = tuple(sympy.Integer(0) if d in axes else idx[d] for d in range(x.rank))
        deviation = Op(dtype, "sub", (cast(x.load(idx), dtype), mean_kept.load(mean_index)))
        return Op(dtype, "mul", (deviation, deviation))

    squares = ctx.reduction(x.shape, axes, True, dtype, x.device, "sum", squared_deviation)
    correction = 1 if correction is None else correction
    divisor = sympy.Max(count - sympy.sympify(correction), 0)
    var_kept = _divide(ctx, squares, divisor, dtype)
    if keepdim:
        return mean_kept, var_kept
    return _squeeze_axes(mean_kept, axes), _squeeze_axes(var_kept, axes)


@register_lowering(aten.var)
def var(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, *args: Any,
        correction: Any = None, keepdim: bool = False, unbiased: Any = None) -> TensorValue:
    if args:  # var.dim(x, dims, unbiased, keepdim)
        unbiased, keepdim = args[0], (args[1] if len(args) > 1 else keepdim)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    _, variance = _mean_and_var(ctx, x, _axes(x, dims), correction, keepdim, out_meta(node).dtype)
    return variance


@register_lowering(aten.var_mean)
def var_mean(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, *args: Any,
             correction: Any = None, keepdim: bool = False, unbiased: Any = None) -> tuple:
    if args:
        unbiased, keepdim = args[0], (args[1] if len(args) > 1 else keepdim)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dtype = node.meta["val"][0].dtype
    mean_value, variance = _mean_and_var(ctx, x, _axes(x, dims), correction, keepdim, dtype)
    return variance, mean_value
