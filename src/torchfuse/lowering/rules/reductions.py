"""Reductions: each becomes one or more Reduction nodes plus pointwise epilogues.

``mean`` is a sum and a division; ``var`` is the corrected two-pass form (mean, then the sums of
deviations and of squared deviations), exact in float32 where a one-pass sum of squares is not. The
scheduler fuses the passes over the same rows back into one kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
import torch.fx

from torchfuse.ir.expr import Const, Expr, Op
from torchfuse.ir.graph import CenteredSum, Reduction
from torchfuse.ir.symbols import product
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import HALF_DTYPES, cast, opmath, operand, out_meta
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
    return reduction(ctx, x.shape, axes, keepdim, dtype, x.device, op, lambda idx: cast(x.load(idx), input_dtype))


def reduction(ctx: LoweringContext, source: tuple, axes: tuple[int, ...], keepdim: bool, dtype: torch.dtype,
              device: torch.device, op: str, body_fn) -> TensorValue:
    """``ctx.reduction``, except that reducing only size-1 dims (or none) is a pointwise node.

    Such a "reduction" reads one element per output: a pointwise node says so, fuses like
    one, and spares the scheduler reduction nodes without reduction loops.
    """
    source = tuple(sympy.sympify(s) for s in source)
    axes = tuple(sorted({a % len(source) for a in axes})) if source else ()
    if not all(source[d] == 1 for d in axes):
        return ctx.reduction(source, axes, keepdim, dtype, device, op, body_fn)
    kept = [d for d in range(len(source)) if d not in axes]
    shape = tuple(sympy.Integer(1) if d in axes else source[d] for d in range(len(source))) if keepdim else \
        tuple(source[d] for d in kept)

    def body(index: tuple) -> Expr:
        if op in ("argmax", "argmin"):
            return Const(torch.int64, 0)
        full = [sympy.Integer(0) if d in axes else index[d if keepdim else kept.index(d)] for d in range(len(source))]
        return cast(body_fn(tuple(full)), dtype)

    return ctx.pointwise(shape, dtype, device, body)


def reduce_accumulating(ctx: LoweringContext, x: TensorValue, axes: tuple[int, ...], keepdim: bool, op: str,
                        dtype: torch.dtype) -> TensorValue:
    """``reduce`` for sum/prod: half inputs accumulate in float32 and round once at the end."""
    if dtype not in HALF_DTYPES:
        return reduce(ctx, x, axes, keepdim, op, dtype)
    total = reduce(ctx, x, axes, keepdim, op, torch.float32, dtype)
    return _elementwise(ctx, total, dtype, lambda v: v, compute=torch.float32)


def _squeeze_axes(value: TensorValue, axes: tuple[int, ...]) -> TensorValue:
    """Drop the kept-as-1 ``axes`` of a keepdim=True result."""
    kept = [d for d in range(value.rank) if d not in axes]

    def index_of_new(new_index):
        old = [sympy.Integer(0)] * value.rank
        for k, d in enumerate(kept):
            old[d] = new_index[k]
        return tuple(old)

    return value.view(tuple(value.shape[d] for d in kept), index_of_new)


def _elementwise(ctx: LoweringContext, value: TensorValue, dtype: torch.dtype, fn,
                 compute: torch.dtype | None = None) -> TensorValue:
    """A pointwise node ``fn(value)`` of ``dtype``, computed in ``compute`` (default: dtype)."""
    compute = compute or dtype
    return ctx.pointwise(value.shape, dtype, value.device, lambda idx: cast(fn(cast(value.load(idx), compute)), dtype))


@register_lowering(aten.sum)
def sum_(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Any = None, keepdim: bool = False,
         dtype: Any = None) -> TensorValue:
    out_dtype = out_meta(node).dtype
    return reduce_accumulating(ctx, x, _axes(x, dims), keepdim, "sum", out_dtype)


@register_lowering(aten.prod)
def prod(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> TensorValue:
    return reduce_accumulating(ctx, x, _axes(x, dim), keepdim, "prod", out_meta(node).dtype)


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
    compute = opmath(out_dtype)
    axes = _axes(x, dims)
    total = reduce(ctx, x, axes, keepdim, "sum", compute, out_dtype)
    return _divide(ctx, total, _count(x, axes), out_dtype)


def _divide(ctx: LoweringContext, value: TensorValue, count: sympy.Expr, dtype: torch.dtype,
            op: str = "truediv") -> TensorValue:
    """``value / count`` as a ``dtype`` result, divided in opmath (a half count may not be exact)."""
    compute = opmath(dtype)

    def fn(v: Expr) -> Expr:
        return Op(compute, op, (v, operand(count, (), (), compute)))

    return _elementwise(ctx, value, dtype, fn, compute)


def _mean_and_var(ctx: LoweringContext, x: TensorValue, axes: tuple[int, ...], correction: Any,
                  keepdim: bool, dtype: torch.dtype) -> tuple[TensorValue, TensorValue]:
    """Variance by the corrected two-pass algorithm, in opmath: ``m = sum(x) / n``, then over the
    same rows ``c = sum(x - m)`` and ``s = sum((x - m)^2)``; ``mean = m + c / n`` and
    ``var = (s - c^2 / n) / (n - correction)``. ``c`` corrects the rounding of ``m``: a row of
    equal values then has exactly that value as its mean and exactly 0 as its variance, as
    eager's (Welford) does. The plain two-pass form gave 1e-15 there, and a downstream
    ``1 / var`` or ``var * x`` turned eager's inf into 1e15 (found by the GPU fuzz:
    ``reciprocal(var(x, 0) * x)`` over repeated rows). ``c`` and ``s`` read the same rows and
    fuse into one kernel."""
    count = _count(x, axes)
    compute = opmath(dtype)
    total = reduce(ctx, x, axes, True, "sum", compute)
    # div_rn: a rounded mean m, so that x - m is exact for equal values. With Triton's float32
    # division the H200 gave variances of 1e-8 to 1e-30 there, with div_rn exactly 0; most
    # likely the subtraction fused with the division's product (x - total * (1/n) as one FMA),
    # so d kept the product's extra bits and d * d rounded. (Triton's interpreter divides exactly.)
    rough_mean = _divide(ctx, total, count, compute, "div_rn")

    def deviation(idx: tuple) -> Expr:
        mean_index = tuple(sympy.Integer(0) if d in axes else idx[d] for d in range(x.rank))
        return Op(compute, "sub", (cast(x.load(idx), compute), rough_mean.load(mean_index)))

    def squared_deviation(idx: tuple) -> Expr:
        return Op(compute, "mul", (deviation(idx), deviation(idx)))

    drift = reduction(ctx, x.shape, axes, True, compute, x.device, "sum", deviation)
    squares = reduction(ctx, x.shape, axes, True, compute, x.device, "sum", squared_deviation)
    _tag_centered(ctx, total, rough_mean, drift, squares)
    n = operand(count, (), (), compute)

    def mean(idx: tuple) -> Expr:
        return Op(compute, "add", (rough_mean.load(idx), Op(compute, "div_rn", (drift.load(idx), n))))

    def corrected_squares(idx: tuple) -> Expr:
        c = drift.load(idx)
        # (c / n) * c, not c * c / n: for equal values (d = x - m a few ulps of x, so few bits)
        # c = n * d and s = n * d * d are exact, c / n is d and d * c is s: the difference is
        # exactly 0 while n * d * d fits the mantissa. c * c itself (n * n * d * d) rounds sooner.
        # c / n must be correctly rounded for that (div_rn: Triton's float32 / is approximate).
        centred = Op(compute, "sub", (squares.load(idx), Op(compute, "mul", (Op(compute, "div_rn", (c, n)), c))))
        return Op(compute, "maximum", (centred, Const(compute, 0.0)))  # >= 0 exactly, not by an ulp

    mean_kept = ctx.pointwise(rough_mean.shape, compute, x.device, mean)
    centred = ctx.pointwise(squares.shape, compute, x.device, corrected_squares)
    correction = 1 if correction is None else correction
    if float(correction).is_integer():  # 1.0 from the Scalar overload: keep the divisor an integer
        correction = int(correction)
    divisor = sympy.Max(count - sympy.sympify(correction), 0)
    var_kept = _divide(ctx, centred, divisor, dtype)
    if compute != dtype:
        mean_kept = _elementwise(ctx, mean_kept, dtype, lambda v: v, compute)
    if keepdim:
        return mean_kept, var_kept
    return _squeeze_axes(mean_kept, axes), _squeeze_axes(var_kept, axes)


def _tag_centered(ctx: LoweringContext, total: TensorValue, mean: TensorValue, drift: TensorValue,
                  squares: TensorValue) -> None:
    """Tag ``drift`` and ``squares`` as the centered sums around ``mean = total / n`` (``CenteredSum``):
    the Triton split then computes them around each chunk's own mean in the pass that sums the
    chunk (codegen/triton/split.py). Only when all three are reductions (reducing size-1 dims
    gives pointwise nodes, which are never split)."""
    nodes = ctx.graph.nodes
    position = {nodes[k].name: k for k in range(len(nodes) - 1, max(len(nodes) - 8, -1), -1)}  # just added
    names = (total.buffer, drift.buffer, squares.buffer)
    if not all(name in position and isinstance(nodes[position[name]], Reduction) for name in names):
        return
    tags = {drift.buffer: CenteredSum(mean.buffer, total.buffer, 1),
            squares.buffer: CenteredSum(mean.buffer, total.buffer, 2, drift.buffer)}
    for name, tag in tags.items():
        nodes[position[name]] = dataclasses.replace(nodes[position[name]], centered=tag)


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


@register_lowering(aten.linalg_vector_norm)
def vector_norm(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, ord: Any = 2, dim: Any = None,
                keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    """``sum(|x|**ord) ** (1/ord)``; ord 0 counts non-zeros, +-inf is the max/min of |x|."""
    out_dtype = out_meta(node).dtype
    compute = opmath(out_dtype)
    axes = _axes(x, dim)
    ord = float(ord)

    def magnitude(idx: tuple) -> Expr:
        return Op(compute, "abs", (cast(x.load(idx), compute),))

    if ord in (float("inf"), float("-inf")):
        op = "max" if ord > 0 else "min"
        result = reduction(ctx, x.shape, axes, keepdim, compute, x.device, op, magnitude)
        return _elementwise(ctx, result, out_dtype, lambda v: v, compute)
    if ord == 0:
        nonzero = lambda idx: cast(cast(x.load(idx), torch.bool), compute)  # noqa: E731
        result = reduction(ctx, x.shape, axes, keepdim, compute, x.device, "sum", nonzero)
        return _elementwise(ctx, result, out_dtype, lambda v: v, compute)
    if ord == 1:
        powered = magnitude
    elif ord == 2:
        powered = lambda idx: Op(compute, "mul", (magnitude(idx), magnitude(idx)))  # noqa: E731
    else:
        powered = lambda idx: Op(compute, "pow", (magnitude(idx), Const(compute, ord)))  # noqa: E731
    total = reduction(ctx, x.shape, axes, keepdim, compute, x.device, "sum", powered)
    if ord == 1:
        root = lambda v: v  # noqa: E731
    elif ord == 2:
        root = lambda v: Op(compute, "sqrt", (v,))  # noqa: E731
    else:
        root = lambda v: Op(compute, "pow", (v, Const(compute, 1.0 / ord)))  # noqa: E731
    return _elementwise(ctx, total, out_dtype, root, compute)
