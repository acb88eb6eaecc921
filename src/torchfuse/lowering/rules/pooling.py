"""Pooling: ``max_pool2d_with_indices`` as a pointwise max over the window's offsets.

A 2x2 window is four loads and three selects per output: memory-bound, where ATen's CPU
kernel (``max_pool2d_with_indices``) costs several times a copy of its input and, as an
ATen call, forces its producer (a conv's BatchNorm + ReLU epilogue) to be stored first.
As a pointwise node the epilogue is inlined into the pool's loads.

Semantics follow ATen's ``cpu_max_pool``: the window is visited row-major, a value
replaces the running maximum when it is greater or NaN (so NaN propagates and the last
NaN's index wins), positions in the padding are skipped, and the index (flat ``h * W + w``
in the input plane) starts at the first position inside the input. The indices are a
second node over the same window; when nothing reads them (inference) they are never
computed.
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from torchfuse.ir.expr import Const, Expr, Op, Where
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import output_shape
from torchfuse.lowering.rules.indexing import all_of, clamp_index, compare, index_value
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten
INT64 = torch.int64


def _pair(value: Any, default: Sequence[Any]) -> tuple[int, int]:
    """A 2-d pooling parameter: ``[]`` means ``default``, one entry means both dims."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        values = list(default)
    if len(values) == 1:
        values = values * 2
    return int(values[0]), int(values[1])


def _is_static_int(value: Any) -> bool:
    try:
        int(value)
    except TypeError:
        return False
    return not isinstance(value, sympy.Expr) or bool(sympy.sympify(value).is_number)


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, kernel_size: Any,
                            stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Any:
    """(values, indices) over windows of the last two dims of a 3-d or 4-d ``x``."""
    params = [kernel_size, stride or kernel_size, padding, dilation]
    if x.rank not in (3, 4) or not x.dtype.is_floating_point or not all(
            _is_static_int(v) for p in params for v in (p if isinstance(p, (list, tuple)) else [p])):
        return NotImplemented
    (kh, kw), (sh, sw) = _pair(kernel_size, ()), _pair(stride, kernel_size)
    (ph, pw), (dh, dw) = _pair(padding, (0,)), _pair(dilation, (1,))
    shape = output_shape(node)
    height, width = x.shape[-2], x.shape[-1]
    window = [(i, j) for i in range(kh) for j in range(kw)]

    def positions(idx) -> list[tuple[sympy.Expr, sympy.Expr, Expr | None]]:
        """(row, column, inside-the-input condition or None) of each window position."""
        found = []
        for i, j in window:
            row = idx[-2] * sh - ph + i * dh
            col = idx[-1] * sw - pw + j * dw
            checks = []
            for at, size, pad, out_size, stride_, dil, k in ((row, height, ph, shape[-2], sh, dh, i),
                                                             (col, width, pw, shape[-1], sw, dw, j)):
                if pad > 0:
                    checks.append(compare("ge", at, 0))
                if _may_pass_end(out_size, stride_, pad, dil, k, size):
                    checks.append(compare("lt", at, size))
            found.append((row, col, all_of(checks)))
        return found

    def load_at(idx, row, col) -> Expr:
        row = clamp_index(row, height, low=ph > 0, high=True) if ph > 0 or ceil_mode else row
        col = clamp_index(col, width, low=pw > 0, high=True) if pw > 0 or ceil_mode else col
        return x.load((*idx[:-2], row, col))

    def maximum(idx) -> Expr:
        """NaN if the window holds one, else its maximum (what ATen's scan leaves in maxval).

        A chain of NaN-propagating ``maximum`` ops rather than the scan's selects: GCC
        vectorizes it (the scan's compare-or-isnan selects after a ReLU defeat its
        if-conversion, measured 10x slower)."""
        best: Expr | None = None
        for row, col, inside in positions(idx):
            value = load_at(idx, row, col)
            if inside is not None:
                value = Where(x.dtype, inside, value, Const(x.dtype, float("-inf")))
            best = value if best is None else Op(x.dtype, "maximum", (best, value))
        return best

    def argmax(idx) -> Expr:
        """The flat input index ATen's loop leaves in maxindex."""
        places = positions(idx)
        best: Expr = Const(x.dtype, float("-inf"))
        where: Expr = _first_inside(places, width)
        for k, (row, col, inside) in enumerate(places):
            value = load_at(idx, row, col)
            if k == 0 and inside is None:  # always taken: -inf stays -inf, NaN is NaN
                best, where = value, index_value(row * width + col)
                continue
            take = Op(torch.bool, "logical_or", (Op(torch.bool, "gt", (value, best)), Op(torch.bool, "isnan", (value,))))
            if inside is not None:
                take = Op(torch.bool, "logical_and", (inside, take))
            best = Where(x.dtype, take, value, best)
            where = Where(INT64, take, index_value(row * width + col), where)
        return where

    values = ctx.pointwise(shape, x.dtype, x.device, maximum)
    indices = ctx.pointwise(shape, INT64, x.device, argmax)
    return values, indices


def _first_inside(places, width) -> Expr:
    """The flat index of the first window position inside the input (ATen's initial index)."""
    result: Expr | None = None
    for row, col, inside in reversed(places):
        here = index_value(row * width + col)
        result = here if inside is None or result is None else Where(INT64, inside, here, result)
    return result if result is not None else Const(INT64, 0)


def _may_pass_end(out_size, stride: int, pad: int, dilation: int, k: int, size) -> bool:
    """True unless the ``k``-th offset of the last window is statically inside ``size``."""
    last = (sympy.sympify(out_size) - 1) * stride - pad + k * dilation
    bound = sympy.sympify(size) - 1 - last
    return not (bound.is_number and bound >= 0)
