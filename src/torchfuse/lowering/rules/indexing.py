"""Indexing ops: regions (``cat``, ``constant_pad_nd``, ``*_scatter``), rearrangements (``flip``,
``repeat``) and gathers (``embedding``, ``gather``, ``index``, ``index_select``). Scatters that
accumulate (embedding's backward, ``index_put`` with ``accumulate=True``) are in ``scatter.py``.

Every rule here is one pointwise node over the output. Regions are ``Where`` over index
conditions; each region's load is at an index *clamped* into its source, because both sides
of a ``Where`` are evaluated (a masked-off lane must still read valid memory). Gathers are
loads whose index has runtime entries (``Expr`` loaded from the index tensor). Gathered
indices are not bounds-checked: eager raises on an out-of-range index, we read whatever
is there (as Inductor does without its debug asserts).
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from torchfuse.ir.expr import Const, Expr, IndexValue, Load, Op, Where
from torchfuse.ir.symbols import FloorDiv, ModIndex, linear_coefficients, simplify_index
from torchfuse.lowering.context import LoweringContext, load_broadcast
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import cast, operand, out_meta, output_shape
from torchfuse.lowering.rules.views import _normalize_start
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten
Index = tuple[sympy.Expr, ...]
INT64 = torch.int64


# -- small expression helpers ---------------------------------------------------------------
def index_value(expr: Any) -> Expr:
    """An integer index expression (a loop variable, a size) as an int64 value."""
    expr = sympy.sympify(expr)
    return Const(INT64, int(expr)) if expr.is_number else IndexValue(INT64, expr)


def compare(name: str, a: Any, b: Any) -> Expr:
    return Op(torch.bool, name, (index_value(a), index_value(b)))


def all_of(conditions: Sequence[Expr]) -> Expr | None:
    """The conjunction of ``conditions``; None when there are none (always true)."""
    result = None
    for condition in conditions:
        result = condition if result is None else Op(torch.bool, "logical_and", (result, condition))
    return result


def clamp_index(expr: sympy.Expr, size: sympy.Expr, low: bool = True, high: bool = True) -> sympy.Expr:
    """``expr`` clamped into ``[0, size - 1]`` (each side only when asked)."""
    if low:
        expr = sympy.Max(expr, 0)
    if high:
        expr = sympy.Min(expr, size - 1)
    return expr


def is_zero(size: sympy.Expr) -> bool:
    size = sympy.sympify(size)
    return bool(size.is_number and size == 0)


def _dim(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# -- cat --------------------------------------------------------------------------------------
@register_lowering(aten.cat.default)
def cat(ctx: LoweringContext, node: torch.fx.Node, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    """Each input is a slab of the output along ``dim``: a nested ``Where`` picks the slab.

    Empty inputs contribute nothing and are skipped (eager also skips legacy 1-d empty
    tensors of any rank mismatch). Slab offsets are sympy sums, so dynamic sizes work.
    """
    meta = out_meta(node)
    shape = output_shape(node)
    dim = _dim(dim, len(shape))
    parts = [t for t in tensors if t.rank == len(shape) and not is_zero(t.shape[dim])]
    if not parts or any(is_zero(s) for s in shape):
        return ctx.pointwise(shape, meta.dtype, meta.device, lambda idx: Const(meta.dtype, 0))
    offsets = [sympy.Integer(0)]
    for part in parts:
        offsets.append(offsets[-1] + part.shape[dim])

    def body(idx: Index) -> Expr:
        def read(k: int) -> Expr:
            local = clamp_index(idx[dim] - offsets[k], parts[k].shape[dim], low=k > 0, high=k < len(parts) - 1)
            return cast(parts[k].load((*idx[:dim], local, *idx[dim + 1:])), meta.dtype)

        result = read(len(parts) - 1)
        for k in range(len(parts) - 2, -1, -1):
            result = Where(meta.dtype, compare("lt", idx[dim], offsets[k + 1]), read(k), result)
        return result

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


# -- constant_pad_nd ---------------------------------------------------------------------------
@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, pad: Sequence[Any],
                    value: Any = 0) -> TensorValue:
    """``pad`` holds (before, after) pairs from the last dim backwards; negative pads crop."""
    meta = out_meta(node)
    shape = output_shape(node)
    fill = operand(value, (), (), meta.dtype)
    if any(is_zero(s) for s in x.shape):  # nothing to read: all padding
        return ctx.pointwise(shape, meta.dtype, meta.device, lambda idx: fill)
    before = {x.rank - 1 - k: sympy.sympify(pad[2 * k]) for k in range(len(pad) // 2)}
    after = {x.rank - 1 - k: sympy.sympify(pad[2 * k + 1]) for k in range(len(pad) // 2)}

    def body(idx: Index) -> Expr:
        source, conditions = list(idx), []
        for d, low in before.items():
            high = after[d]
            pads_low, pads_high = _maybe_positive(low), _maybe_positive(high)
            source[d] = clamp_index(idx[d] - low, x.shape[d], low=pads_low, high=pads_high)
            if pads_low:
                conditions.append(compare("ge", idx[d], low))
            if pads_high:
                conditions.append(compare("lt", idx[d], low + x.shape[d]))
        loaded = cast(x.load(tuple(source)), meta.dtype)
        inside = all_of(conditions)
        return loaded if inside is None else Where(meta.dtype, inside, loaded, fill)

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


def _maybe_positive(amount: sympy.Expr) -> bool:
    """False only when ``amount`` is known <= 0 (a crop or nothing: no padded region)."""
    return not (amount.is_number and amount <= 0)


# -- select_scatter / slice_scatter -----------------------------------------------------------
@register_lowering(aten.select_scatter.default)
def select_scatter(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, src: Any, dim: int,
                   index: Any) -> TensorValue:
    meta = out_meta(node)
    shape = output_shape(node)
    dim = _dim(dim, len(shape))
    index = sympy.sympify(index)
    if index.is_number and index < 0:
        index = index + shape[dim]

    def body(idx: Index) -> Expr:
        inner = operand(src, (*idx[:dim], *idx[dim + 1:]), shape[:dim] + shape[dim + 1:], meta.dtype)
        return Where(meta.dtype, compare("eq", idx[dim], index), inner, cast(x.load(idx), meta.dtype))

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


@register_lowering(aten.slice_scatter.default)
def slice_scatter(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, src: TensorValue, dim: int = 0,
                  start: Any = None, end: Any = None, step: Any = 1) -> TensorValue:
    """``src`` fills positions ``start, start + step, ...`` of ``dim``; its length is its own size."""
    meta = out_meta(node)
    shape = output_shape(node)
    dim = _dim(dim, len(shape))
    if is_zero(src.shape[dim]) or any(is_zero(s) for s in shape):
        return ctx.pointwise(shape, meta.dtype, meta.device, lambda idx: cast(x.load(idx), meta.dtype))
    start = _normalize_start(start, shape[dim])
    step = sympy.sympify(step)
    count = src.shape[dim]

    def body(idx: Index) -> Expr:
        offset = sympy.Max(idx[dim] - start, 0)
        position = clamp_index(FloorDiv(offset, step), count, low=False)
        conditions = [compare("ge", idx[dim], start), compare("lt", idx[dim], start + step * (count - 1) + 1)]
        if step != 1:
            conditions.append(compare("eq", ModIndex(offset, step), 0))
        inner = operand(src, (*idx[:dim], position, *idx[dim + 1:]), shape, meta.dtype)
        return Where(meta.dtype, all_of(conditions), inner, cast(x.load(idx), meta.dtype))

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


# -- rearrangements ---------------------------------------------------------------------------
@register_lowering(aten.flip.default)
def flip(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    """A copy, not a view: a reversed index map has negative strides, which ATen calls reject."""
    meta = out_meta(node)
    flipped = {_dim(d, x.rank) for d in dims}

    def body(idx: Index) -> Expr:
        return x.load(tuple(x.shape[d] - 1 - i if d in flipped else i for d, i in enumerate(idx)))

    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, body)


@register_lowering(aten.repeat.default)
def repeat(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, repeats: Sequence[Any]) -> TensorValue:
    meta = out_meta(node)
    shape = output_shape(node)
    lead = len(shape) - x.rank

    def body(idx: Index) -> Expr:
        return x.load(tuple(sympy.Integer(0) if size == 1 else ModIndex(idx[d + lead], size)
                            for d, size in enumerate(x.shape)))

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


# -- gathers ----------------------------------------------------------------------------------
def gather_source(ctx: LoweringContext, value: TensorValue, dims: Sequence[int]) -> TensorValue:
    """``value`` ready to be read with runtime indices along ``dims``.

    A gathered entry must be arithmetic we can do on the loaded index: each buffer index
    must be affine in the gathered variables. A view that mixes them non-linearly (a
    reshape's ``//`` and ``%``) is first copied into a buffer of its own.
    """
    gathered = [value.vars[d] for d in dims]
    for entry in value.index_map:
        entry = sympy.sympify(entry)
        used = [v for v in gathered if entry.has(v)]
        if not used:
            continue
        coeffs = linear_coefficients(entry, used)
        if coeffs is None or any(c.has(*value.vars) for c in coeffs[0]):
            return ctx.pointwise(value.shape, value.dtype, value.device, lambda idx: value.load(idx))
    return value


def load_gathered(value: TensorValue, index: Sequence[Any]) -> Load:
    """``value[index]`` where entries are sympy (direct) or int64 ``Expr`` (gathered).

    ``value`` must come from ``gather_source`` for the gathered positions.
    """
    direct = {v: sympy.sympify(e) for v, e in zip(value.vars, index) if not isinstance(e, Expr)}
    gathered = {v: e for v, e in zip(value.vars, index) if isinstance(e, Expr)}
    entries: list[Any] = []
    for entry in value.index_map:
        entry = sympy.sympify(entry)
        used = [v for v in gathered if entry.has(v)]
        if not used:
            entries.append(simplify_index(entry.xreplace(direct)))
            continue
        coeffs, rest = linear_coefficients(entry, used)
        total: Expr | None = None
        for var, coeff in zip(used, coeffs):
            term = gathered[var] if coeff == 1 else Op(INT64, "mul", (gathered[var], index_value(coeff)))
            total = term if total is None else Op(INT64, "add", (total, term))
        rest = simplify_index(rest.xreplace(direct))
        entries.append(total if rest == 0 else Op(INT64, "add", (total, index_value(rest))))
    return Load(value.dtype, value.buffer, tuple(entries))


def index_entry(index: TensorValue, at: Index, out_shape: Sequence[sympy.Expr] | None = None,
                wrap_size: Any = None) -> Expr:
    """The int64 index read from ``index`` at ``at``; negative values wrap by ``wrap_size``."""
    loaded = load_broadcast(index, at, tuple(out_shape)) if out_shape is not None else index.load(at)
    entry = cast(loaded, INT64)
    if wrap_size is None:
        return entry
    negative = Op(torch.bool, "lt", (entry, Const(INT64, 0)))
    return Where(INT64, negative, Op(INT64, "add", (entry, index_value(wrap_size))), entry)


def _is_integer_index(value: Any) -> bool:
    return isinstance(value, TensorValue) and not value.dtype.is_floating_point and value.dtype not in (torch.bool, torch.uint8)


@register_lowering(aten.embedding.default)
def embedding(ctx: LoweringContext, node: torch.fx.Node, weight: TensorValue, indices: TensorValue,
              *args: Any, **kwargs: Any) -> TensorValue:
    """``out[..., j] = weight[indices[...], j]`` (padding_idx only matters in the backward)."""
    meta = out_meta(node)
    weight = gather_source(ctx, weight, (0,))

    def body(idx: Index) -> Expr:
        row = index_entry(indices, idx[:-1])
        return cast(load_gathered(weight, (row, idx[-1])), meta.dtype)

    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, body)


@register_lowering(aten.gather.default)
def gather(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, index: TensorValue,
           **kwargs: Any) -> TensorValue:
    """``out[i] = x[i with dim replaced by index[i]]``; ``index`` may be smaller than ``x``."""
    meta = out_meta(node)
    if x.rank == 0:  # every index is 0 (eager checks): the output is x repeated in index's shape
        return ctx.pointwise(output_shape(node), meta.dtype, meta.device, lambda idx: cast(x.load(()), meta.dtype))
    dim = _dim(dim, x.rank)
    x = gather_source(ctx, x, (dim,))

    def body(idx: Index) -> Expr:
        at = index_entry(index, idx)
        return cast(load_gathered(x, (*idx[:dim], at, *idx[dim + 1:])), meta.dtype)

    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, body)


@register_lowering(aten.index_select.default)
def index_select(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    meta = out_meta(node)
    if x.rank == 0:
        return ctx.pointwise(output_shape(node), meta.dtype, meta.device, lambda idx: cast(x.load(()), meta.dtype))
    dim = _dim(dim, x.rank)
    x = gather_source(ctx, x, (dim,))

    def body(idx: Index) -> Expr:
        at = index_entry(index, (idx[dim],) if index.rank else ())
        return cast(load_gathered(x, (*idx[:dim], at, *idx[dim + 1:])), meta.dtype)

    return ctx.pointwise(output_shape(node), meta.dtype, meta.device, body)


@register_lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, indices: Sequence[Any]) -> Any:
    """Advanced indexing ``x[..., i, j, ...]`` with integer index tensors (None = a full slice).

    The index tensors broadcast to one shape B. If they sit on adjacent dims, B replaces
    those dims in place; otherwise B comes first, followed by the remaining dims (eager's
    rule). Negative indices count from the end of their dim. Boolean masks make
    data-dependent shapes: those run in ATen.
    """
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not tensors or not all(_is_integer_index(t) for _, t in tensors):
        return NotImplemented
    meta = out_meta(node)
    shape = output_shape(node)
    indexed = [d for d, _ in tensors]
    sliced = [d for d in range(x.rank) if d not in indexed]
    b_rank = max(t.rank for _, t in tensors)
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    b_start = indexed[0] if adjacent else 0
    b_shape = tuple(shape[b_start:b_start + b_rank])
    x = gather_source(ctx, x, indexed)

    def body(idx: Index) -> Expr:
        b_index = idx[b_start:b_start + b_rank]
        rest = list(idx[:b_start]) + list(idx[b_start + b_rank:])
        source: list[Any] = [None] * x.rank
        for d in sliced:
            source[d] = rest.pop(0)
        for d, t in tensors:
            source[d] = index_entry(t, b_index, b_shape, wrap_size=x.shape[d])
        return cast(load_gathered(x, source), meta.dtype)

    return ctx.pointwise(shape, meta.dtype, meta.device, body)


# -- scatter (one-hot case only) --------------------------------------------------------------
@register_lowering(aten.scatter.value, aten.scatter.src)
def scatter(ctx: LoweringContext, node: torch.fx.Node, x: TensorValue, dim: int, index: TensorValue,
            value: Any) -> Any:
    """``out = where(i_dim == index[..., 0, ...], value, x)`` when ``index`` has size 1 along ``dim``
    and matches ``x`` elsewhere (one write per row: one-hot). General scatters run in ATen:
    which write wins for duplicate indices is not something a pointwise node can express.
    """
    if x.rank == 0 or index.rank != x.rank:
        return NotImplemented
    dim = _dim(dim, x.rank)
    one_hot = index.shape[dim] == 1 and all(
        sympy.simplify(index.shape[d] - x.shape[d]) == 0 for d in range(x.rank) if d != dim)
    if not one_hot:
        return NotImplemented
    meta = out_meta(node)
    shape = output_shape(node)

    def body(idx: Index) -> Expr:
        row = (*idx[:dim], sympy.Integer(0), *idx[dim + 1:])
        target = index_entry(index, row)
        written = cast(value.load(row), meta.dtype) if isinstance(value, TensorValue) else operand(value, (), (), meta.dtype)
        hit = Op(torch.bool, "eq", (IndexValue(INT64, idx[dim]), target))
        return Where(meta.dtype, hit, written, cast(x.load(idx), meta.dtype))

    return ctx.pointwise(shape, meta.dtype, meta.device, body)
