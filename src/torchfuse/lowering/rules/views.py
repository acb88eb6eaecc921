"""View ops: they move no data, they only compose the index map of a TensorValue."""
from __future__ import annotations

from typing import Any, Callable

import sympy
import torch
import torch.fx

from torchfuse.frontend.symbolic import shape_of
from torchfuse.ir.symbols import FloorDiv, ModIndex, contiguous_strides, product
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import output_shape
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten
Index = tuple[sympy.Expr, ...]


@register_lowering(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy)
def view(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, *shape_args: Any) -> Any:
    if shape_args and isinstance(shape_args[0], torch.dtype):
        return NotImplemented  # view.dtype reinterprets bits: no index map can say that
    new_shape = output_shape(node)
    return x.view(new_shape, reshape_indexer(x.shape, new_shape))


def reshape_indexer(old: tuple, new: tuple) -> Callable[[Index], Index]:
    """Map an index of the reshaped tensor to an index of the original (same numel)."""
    if product(old) == 0:  # nothing is ever read (and the strides below would divide by 0)
        return lambda new_index: tuple(sympy.Integer(0) for _ in old)
    groups = _match_groups(old, new)

    def index_of_new(new_index: Index) -> Index:
        old_index: list[sympy.Expr] = [sympy.Integer(0)] * len(old)
        for old_dims, new_dims in groups:
            new_sizes = [new[d] for d in new_dims]
            flat = sum((new_index[d] * s for d, s in zip(new_dims, contiguous_strides(new_sizes))), sympy.Integer(0))
            old_sizes = [old[d] for d in old_dims]
            for k, (d, stride) in enumerate(zip(old_dims, contiguous_strides(old_sizes))):
                part = FloorDiv(flat, stride)
                old_index[d] = part if k == 0 else ModIndex(part, old[d])
        return tuple(old_index)

    return index_of_new


def _match_groups(old: tuple, new: tuple) -> list[tuple[list[int], list[int]]]:
    """Split both shapes into runs of dims with equal products (the dims a reshape mixes)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        old_dims, new_dims = [], []
        if i < len(old):
            old_dims.append(i)
            i += 1
        if j < len(new):
            new_dims.append(j)
            j += 1
        while _differ(product(old[d] for d in old_dims), product(new[d] for d in new_dims)):
            old_numel = product(old[d] for d in old_dims)
            new_numel = product(new[d] for d in new_dims)
            if j < len(new) and (i >= len(old) or _divides(new_numel, old_numel)):
                new_dims.append(j)
                j += 1
            elif i < len(old):
                old_dims.append(i)
                i += 1
            else:
                break
        groups.append((old_dims, new_dims))
    return groups


def _differ(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.simplify(a - b) != 0


def _divides(small: sympy.Expr, large: sympy.Expr) -> bool:
    """True when ``small`` divides ``large`` (the side with the smaller product grows)."""
    if small.is_number and large.is_number:
        return int(small) <= int(large)
    return sympy.fraction(sympy.cancel(large / small))[1] == 1


@register_lowering(aten.alias, aten.detach)
def alias(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue) -> TensorValue:
    return x


@register_lowering(aten.permute)
def permute(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: list[int]) -> TensorValue:
    dims = [d % x.rank for d in dims]

    def index_of_new(new_index: Index) -> Index:
        old = [sympy.Integer(0)] * x.rank
        for k, d in enumerate(dims):
            old[d] = new_index[k]
        return tuple(old)

    return x.view(output_shape(node), index_of_new)


@register_lowering(aten.transpose)
def transpose(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, a: int, b: int) -> TensorValue:
    dims = list(range(x.rank))
    if x.rank:
        a, b = a % x.rank, b % x.rank
        dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, node, x, dims)


@register_lowering(aten.t)
def t(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue) -> TensorValue:
    return transpose(ctx, node, x, 0, 1) if x.rank == 2 else x


@register_lowering(aten.expand)
def expand(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, *args: Any, **kwargs: Any) -> TensorValue:
    new_shape = output_shape(node)
    lead = len(new_shape) - x.rank

    def index_of_new(new_index: Index) -> Index:
        return tuple(
            sympy.Integer(0) if size == 1 and new_shape[d + lead] != 1 else new_index[d + lead]
            for d, size in enumerate(x.shape)
        )

    return x.view(new_shape, index_of_new)


@register_lowering(aten.squeeze, aten.unsqueeze)
def squeeze_unsqueeze(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, *args: Any) -> TensorValue:
    """Both only add or drop dims of size 1: match the remaining dims in order."""
    new_shape = output_shape(node)
    if node.target.overloadpacket is aten.unsqueeze:
        inserted = args[0] % (x.rank + 1)
        keep_new = [d for d in range(len(new_shape)) if d != inserted]
        return x.view(new_shape, lambda idx: tuple(idx[d] for d in keep_new))
    dims = _squeezed_dims(x, args)
    kept_old = [d for d in range(x.rank) if d not in dims]

    def index_of_new(new_index: Index) -> Index:
        old = [sympy.Integer(0)] * x.rank
        for k, d in enumerate(kept_old):
            old[d] = new_index[k]
        return tuple(old)

    return x.view(new_shape, index_of_new)


def _squeezed_dims(x: TensorValue, args: tuple) -> set[int]:
    if not args:
        candidates = range(x.rank)
    elif isinstance(args[0], (list, tuple)):
        candidates = [d % max(x.rank, 1) for d in args[0]]
    else:
        candidates = [args[0] % max(x.rank, 1)]
    return {d for d in candidates if d < x.rank and x.shape[d] == 1}


@register_lowering(aten.slice)
def slice_(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int = 0,
           start: Any = None, end: Any = None, step: int = 1) -> TensorValue:
    dim = dim % x.rank
    size = x.shape[dim]
    start = _normalize_start(start, size)

    def index_of_new(new_index: Index) -> Index:
        old = list(new_index)
        old[dim] = start + step * new_index[dim]
        return tuple(old)

    return x.view(output_shape(node), index_of_new)


def _normalize_start(start: Any, size: sympy.Expr) -> sympy.Expr:
    if start is None:
        return sympy.Integer(0)
    start = sympy.sympify(start)
    if start.is_number and start < 0:
        start = start + size
        return sympy.Max(start, 0) if not start.is_number else sympy.Integer(max(int(start), 0))
    if start.is_number and size.is_number:
        return sympy.Integer(min(int(start), int(size)))
    return start


@register_lowering(aten.select)
def select(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, index: Any) -> TensorValue:
    dim = dim % x.rank
    index = sympy.sympify(index)
    if index.is_number and index < 0:
        index = index + x.shape[dim]

    def index_of_new(new_index: Index) -> Index:
        return (*new_index[:dim], index, *new_index[dim:])

    return x.view(output_shape(node), index_of_new)


@register_lowering(aten.split_with_sizes, aten.split)
def split(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, sizes: Any, dim: int = 0) -> tuple:
    dim = dim % x.rank
    metas = node.meta["val"]
    results, start = [], sympy.Integer(0)
    for meta in metas:
        length = sympy.sympify(meta.shape[dim]) if isinstance(meta.shape[dim], int) else meta.shape[dim].node.expr
        results.append(_narrow(x, dim, start, meta))
        start = start + length
    return tuple(results)


def _narrow(x: TensorValue, dim: int, start: sympy.Expr, meta: torch.Tensor) -> TensorValue:
    def index_of_new(new_index: Index) -> Index:
        old = list(new_index)
        old[dim] = start + new_index[dim]
        return tuple(old)

    return x.view(shape_of(meta), index_of_new)


@register_lowering(aten.unbind)
def unbind(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int = 0) -> tuple:
    dim = dim % x.rank
    outputs = []
    for k, meta in enumerate(node.meta["val"]):
        outputs.append(x.view(shape_of(meta), lambda idx, k=k: (*idx[:dim], sympy.Integer(k), *idx[dim:])))
    return tuple(outputs)


@register_lowering(aten.as_strided)
def as_strided(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, size: Any, stride: Any,
               storage_offset: Any = None) -> Any:
    """An index map when ``x`` is a whole buffer; otherwise run as an ATen call.

    ``storage_offset`` is absolute in the storage (default: x's own), while the map indexes
    the buffer's elements, which start at ``buffer.offset``: the map uses the difference.
    """
    buffer = ctx.graph.buffers[x.buffer]
    if not x.is_identity or x.shape != buffer.shape or buffer.strides != contiguous_strides(buffer.shape):
        return NotImplemented
    start = sympy.sympify(storage_offset) - buffer.offset if storage_offset is not None else sympy.Integer(0)
    if start.is_number and start < 0:
        return NotImplemented  # reads storage before the buffer's first element
    offset = start
    new_shape = output_shape(node)

    def index_of_new(new_index: Index) -> Index:
        flat = offset + sum((i * sympy.sympify(s) for i, s in zip(new_index, stride)), sympy.Integer(0))
        strides = contiguous_strides(x.shape)
        return tuple(
            FloorDiv(flat, st) if d == 0 else ModIndex(FloorDiv(flat, st), x.shape[d])
            for d, st in enumerate(strides)
        )

    return x.view(new_shape, index_of_new)


@register_lowering(aten.diagonal)
def diagonal(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, offset: int = 0, dim1: int = 0,
             dim2: int = 1) -> TensorValue:
    """The diagonal of dims (dim1, dim2) becomes the last dim: ``x[..., k + max(-offset, 0), k + max(offset, 0)]``."""
    dim1, dim2 = dim1 % x.rank, dim2 % x.rank
    rest = [d for d in range(x.rank) if d not in (dim1, dim2)]

    def index_of_new(new_index: Index) -> Index:
        old = [sympy.Integer(0)] * x.rank
        for k, d in enumerate(rest):
            old[d] = new_index[k]
        old[dim1] = new_index[-1] + max(-offset, 0)
        old[dim2] = new_index[-1] + max(offset, 0)
        return tuple(old)

    return x.view(output_shape(node), index_of_new)


@register_lowering(aten.unfold)
def unfold(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, size: int, step: int) -> TensorValue:
    """Windows of ``size`` every ``step`` along ``dim``; the window position is a new last dim."""
    dim = dim % max(x.rank, 1)

    def index_of_new(new_index: Index) -> Index:
        if x.rank == 0:
            return ()
        old = list(new_index[:x.rank])
        old[dim] = new_index[dim] * step + new_index[-1]
        return tuple(old)

    return x.view(output_shape(node), index_of_new)


@register_lowering(aten.sym_size.int)
def sym_size(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int) -> sympy.Expr:
    return x.shape[dim % x.rank]


@register_lowering(aten.sym_numel)
def sym_numel(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue) -> sympy.Expr:
    return product(x.shape)
