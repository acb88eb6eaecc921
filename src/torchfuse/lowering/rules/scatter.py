"""Accumulating scatters: ``embedding_dense_backward``, ``index_put`` with ``accumulate=True``
(``index_add`` decomposes to it) and ``scatter_add``.

Each is one ``ScatterAdd`` node (``ir/graph.py``): a buffer starting as zeros or a copy of the
input, into which every element of the source adds its value at a runtime index. Half types
accumulate in float32 and are rounded once at the end by a pointwise node that fuses with its
readers, as eager's CUDA kernels accumulate in float32 (``ACCUMULATION``); integers accumulate in
int64 and wrap back to their type, which gives eager's wrapped sums.

Three cases stay ATen calls, with their reason in the report: deterministic algorithms on the
Triton target (GPU atomic adds hit an element in a varying order, so float sums vary in their
last bits; ATen's sort-based kernels are deterministic), boolean-mask indices (the shape
depends on the data), and GPU embedding backwards with many indices a table row (``_crowded_rows``).
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from torchfuse.frontend.symbolic import strides_of
from torchfuse.ir.expr import Const, Expr, IndexValue, Load, Op
from torchfuse.lowering.context import LoweringContext, is_dense, load_broadcast
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import cast, out_meta, output_shape
from torchfuse.lowering.rules.indexing import INT64, _dim, _is_integer_index, index_entry
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten

# The dtype a scatter accumulates a result of each dtype in; others (bool, complex) stay ATen calls.
ACCUMULATION = {
    torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
    torch.float64: torch.float64, torch.int64: torch.int64, torch.int32: torch.int64, torch.int16: torch.int64,
    torch.int8: torch.int64, torch.uint8: torch.int64,
}

DETERMINISTIC = ("deterministic algorithms are on, and generated GPU kernels accumulate with atomic adds "
                 "whose order varies from run to run: ATen's deterministic kernel runs instead")


def _declined(ctx: LoweringContext, dtype: torch.dtype) -> Any:
    """NotImplemented with the reason, when this scatter cannot be generated; else None."""
    if not ctx.unordered_adds:
        return ctx.not_lowered(DETERMINISTIC)
    if dtype not in ACCUMULATION:
        return ctx.not_lowered(f"no accumulating scatter of {dtype}")
    return None


def _finish(ctx: LoweringContext, node: torch.fx.Node, result: TensorValue) -> TensorValue:
    """The accumulated ``result`` in the op's dtype: rounded once, after every addition."""
    meta = out_meta(node)
    if result.dtype == meta.dtype:
        return result
    return ctx.pointwise(result.shape, meta.dtype, meta.device, lambda idx: cast(result.load(idx), meta.dtype))


def _traced_strides(node: torch.fx.Node) -> tuple | None:
    """The result's layout as tracing saw it, when dense (the scatter's buffer takes it)."""
    meta = out_meta(node)
    strides = strides_of(meta)
    return strides if is_dense(output_shape(node), strides) else None


def _zeros(dtype: torch.dtype):
    return lambda idx: Const(dtype, 0)


# -- embedding backward -------------------------------------------------------------------------
@register_lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(ctx: LoweringContext, node: torch.fx.Node, grad: TensorValue, indices: TensorValue,
                             num_weights: Any, padding_idx: Any, scale_grad_by_freq: bool) -> Any:
    """``weight_grad[indices[p], j] += grad[p, j]``, skipping rows equal to ``padding_idx``.

    The iteration space is ``grad``'s: for a [tokens, D] gradient the embedding dim is innermost,
    so a kernel reads gradient rows and adds into weight rows contiguously. With
    ``scale_grad_by_freq`` each row's gradient is divided by how often its index occurs: a
    first scatter counts the indices (int64), the second divides by the count at its row.
    """
    meta = out_meta(node)
    acc = ACCUMULATION.get(meta.dtype)
    declined = _declined(ctx, meta.dtype)
    if declined is not None:
        return declined
    crowded = _crowded_rows(meta.device, indices, num_weights)
    if crowded is not None:
        return ctx.not_lowered(crowded)
    rank = indices.rank
    rows = sympy.sympify(num_weights)
    counts = _index_counts(ctx, indices, rows) if scale_grad_by_freq else None

    def point(p):
        row = index_entry(indices, p[:rank])
        value = cast(grad.load(p), acc)
        if counts is not None:
            count = Load(INT64, counts.buffer, (row,))
            value = Op(acc, "truediv", (value, cast(count, acc)))
        return (row, *p[rank:]), value, _not_padding(row, padding_idx)

    result = ctx.scatter_add(output_shape(node), acc, meta.device, _zeros(acc), grad.shape, point,
                             _traced_strides(node))
    return _finish(ctx, node, result)


# Indices per table row above which GPU atomic adds serialize on the few rows they hit.
CROWDED_ROWS = 64


def _crowded_rows(device: torch.device, indices: TensorValue, num_weights: Any) -> str | None:
    """Why a GPU embedding backward stays ATen's (sorted, segment-summed) kernel, or None.

    T5's relative position bias looks up 32 rows with a [512, 512] index: 8192 atomic adds land
    on each element of the table, and the generated scatter took 2.1 ms of a 14.5 ms step on the
    H200; so did BERT's token types (two rows, 8192 tokens). ATen sorts the indices and sums each
    row's segment without atomics."""
    count = sympy.Mul(*indices.shape) if indices.rank else sympy.Integer(1)
    rows = sympy.sympify(num_weights)
    if device.type != "cuda" or not (count.is_number and rows.is_number) or count < CROWDED_ROWS * rows:
        return None
    return (f"{int(count)} indices into {int(rows)} rows ({int(count) // max(int(rows), 1)} a row): atomic adds "
            "would serialize on the crowded rows, so ATen's sort-based kernel runs instead")


def _not_padding(row: Expr, padding_idx: Any) -> Expr | None:
    """``row != padding_idx``; None when no row can be it (a negative padding_idx: none)."""
    padding = sympy.sympify(padding_idx)
    if padding.is_number and padding < 0:
        return None
    padding_value = Const(INT64, int(padding)) if padding.is_number else IndexValue(INT64, padding)
    return Op(torch.bool, "ne", (row, padding_value))


def _index_counts(ctx: LoweringContext, indices: TensorValue, rows: sympy.Expr) -> TensorValue:
    """How often each row occurs in ``indices``: an int64 scatter of ones."""

    def point(p):
        return (index_entry(indices, p),), Const(INT64, 1), None

    return ctx.scatter_add((rows,), INT64, indices.device, _zeros(INT64), indices.shape, point)


# -- index_put(accumulate=True), index_add ------------------------------------------------------
@register_lowering(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, indices: Sequence[Any], values: TensorValue,
              accumulate: bool = False) -> Any:
    """``out = x.clone(); out[indices] += values`` (advanced indexing; None keeps a dim whole).

    The iteration space is the shape of ``x[indices]`` (the index tensors broadcast to one shape
    B, which replaces the indexed dims in place when they are adjacent and comes first
    otherwise, as in eager), and ``values`` broadcast to it. Negative indices count from the
    end of their dim. Without ``accumulate`` the last write wins among repeated indices, in an
    order eager does not define: that stays ATen's.
    """
    if not accumulate:
        return ctx.not_lowered("index_put without accumulate: repeated indices would race")
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not tensors or not all(_is_integer_index(t) for _, t in tensors):
        return ctx.not_lowered("boolean-mask indices: the number of elements depends on the data")
    meta = out_meta(node)
    acc = ACCUMULATION.get(meta.dtype)
    declined = _declined(ctx, meta.dtype)
    if declined is not None:
        return declined
    indexed = [d for d, _ in tensors]
    sliced = [d for d in range(x.rank) if d not in indexed]
    b_shape = _broadcast_shape([t.shape for _, t in tensors])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    b_start = indexed[0] if adjacent else 0
    before = sliced[:b_start] if adjacent else []
    source = tuple([x.shape[d] for d in before] + list(b_shape) + [x.shape[d] for d in sliced[len(before):]])

    def point(p):
        b_index = p[b_start:b_start + len(b_shape)]
        rest = list(p[:b_start]) + list(p[b_start + len(b_shape):])
        target: list[Any] = [None] * x.rank
        for d in sliced:
            target[d] = rest.pop(0)
        for d, t in tensors:
            target[d] = index_entry(t, b_index, b_shape, wrap_size=x.shape[d])
        return tuple(target), cast(load_broadcast(values, p, source), acc), None

    result = ctx.scatter_add(x.shape, acc, meta.device, lambda idx: cast(x.load(idx), acc), source, point,
                             _traced_strides(node))
    return _finish(ctx, node, result)


def _broadcast_shape(shapes: list[tuple]) -> tuple:
    """The shape index tensors broadcast to (sizes are equal or 1, eager has checked)."""
    rank = max(len(s) for s in shapes)
    result = []
    for d in range(rank):
        sizes = [s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0]
        result.append(next((size for size in sizes if size != 1), sympy.Integer(1)))
    return tuple(result)


# -- scatter_add --------------------------------------------------------------------------------
@register_lowering(aten.scatter_add.default)
def scatter_add(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, index: TensorValue,
                src: TensorValue) -> Any:
    """``out = x.clone(); out[..., index[p], ...] += src[p]`` for every ``p`` of ``index``'s shape
    (``dim`` replaced by the index; ``src`` may be larger than ``index``)."""
    if x.rank == 0 or index.rank != x.rank:
        return ctx.not_lowered("a 0-d scatter_add")
    meta = out_meta(node)
    acc = ACCUMULATION.get(meta.dtype)
    declined = _declined(ctx, meta.dtype)
    if declined is not None:
        return declined
    dim = _dim(dim, x.rank)

    def point(p):
        target = (*p[:dim], index_entry(index, p), *p[dim + 1:])
        return target, cast(src.load(p), acc), None

    result = ctx.scatter_add(x.shape, acc, meta.device, lambda idx: cast(x.load(idx), acc), index.shape, point,
                             _traced_strides(node))
    return _finish(ctx, node, result)
