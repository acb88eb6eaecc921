"""Lay out a stored buffer the way the kernels that read it walk it.

Lowering gives a node's buffer eager's layout (``lowering/driver._adopt_eager_layout``). For a
buffer read through a permuted view that is the wrong one: T5 computes its relative-position
bias as an embedding lookup of shape ``[S, S, H]`` and reads it as ``[1, H, S, S]`` in every
attention layer, forward and backward. Each reader walks ``S`` (its contiguous axis) while the
bias moves 8 elements a step: on an H100 the six forward softmax kernels ran at 55% of copy
bandwidth and the layer-0 probability kernel at 45%, against ~90% for kernels reading in order.
Stored ``[S, H, S]`` (8 MB written once, in order: the embedding kernel's own reads walk ``S``
as well), every read is in order.

This runs once the scheduler knows which buffers are stored (``realized``) and before it groups
nodes into kernels (placement reads layouts). For each stored pointwise buffer whose layout is
still free, every stored node that reads it, with its inlined producers in place, votes with as
many elements as it iterates over for the buffer dimension its lanes walk: a pointwise node
walks the unit-stride dimension of what it stores, a reduction its innermost reduced dimension
(or, an outer reduction whose other large reads are contiguous along a kept dimension, that
one). The producer votes too, for the dimension its own large reads are contiguous along. When
a dimension other than the current unit-stride one gets at least twice the current one's votes,
it becomes the innermost; the other dimensions keep their order. Nodes are visited last first,
so a reader's own layout is settled before it votes. Only where values live changes: every
kernel indexes the buffer through its strides.

A buffer is left alone when its strides may already be relied on: read by an ATen call, the
memory of an accumulating scatter or read by one, a graph output other than a forward graph's
saved tensors (whose new strides aot_autograd is told, ``pipeline._report_output_strides``),
or sized symbolically (the renderers order loops by numeric strides only).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

import sympy

from torchfuse.ir.expr import Expr, Load, loads
from torchfuse.ir.graph import Buffer, Extern, Graph, GraphOutput, Pointwise, Reduction, ScatterAdd, Shape, node_exprs
from torchfuse.ir.symbols import linear_coefficients, product

# A reader's pull must be at least this many times the current layout's before it changes:
# ties and near-ties keep eager's layout.
MAJORITY = 2


def prefer_reader_layouts(graph: Graph, realized: set[str], inlined: Callable[[Pointwise | Reduction], Expr],
                          movable_outputs_from: int | None) -> dict[int, tuple[int, ...]]:
    """Relayout the stored pointwise buffers of ``graph`` whose readers walk another dimension.

    Args:
        graph: the lowered graph, changed in place (its buffers and outputs).
        realized: the nodes whose buffers are stored (``schedule._SchedulerState.realized``).
        inlined: a stored node's body with its inlined producers in place.
        movable_outputs_from: the first output position whose layout may change (a forward
            graph's saved tensors), or None when no output may.
    Returns:
        Output position -> its new strides, for the outputs that changed.
    """
    fixed = _fixed_buffers(graph, movable_outputs_from)
    stored = [n for n in graph.nodes if isinstance(n, (Pointwise, Reduction, ScatterAdd)) and n.name in realized]
    bodies = {n.name: inlined(n) for n in stored if not isinstance(n, ScatterAdd)}
    readers: dict[str, list] = {}
    for node in stored:
        for name in dict.fromkeys(load.buffer for expr in _exprs(node, bodies) for load in loads(expr)):
            readers.setdefault(name, []).append(node)
    moved: dict[int, tuple[int, ...]] = {}
    for node in reversed(stored):
        if not isinstance(node, Pointwise) or node.name in fixed:
            continue
        buffer = graph.buffers[node.name]
        strides = _preferred_strides(node, buffer, readers.get(node.name, []), bodies, graph.buffers)
        if strides is None:
            continue
        graph.buffers[node.name] = Buffer(buffer.name, buffer.shape, buffer.dtype, buffer.device, strides)
        for position, out in enumerate(graph.outputs):
            if out.buffer == node.name:
                graph.outputs[position] = GraphOutput(node.name, buffer.shape, strides)
                moved[position] = tuple(int(s) for s in strides)
    return moved


def _exprs(node, bodies: dict[str, Expr]) -> tuple[Expr, ...]:
    return node_exprs(node) if isinstance(node, ScatterAdd) else (bodies[node.name],)


def _fixed_buffers(graph: Graph, movable_outputs_from: int | None) -> set[str]:
    """Buffers whose strides something already relies on (see the module's docstring)."""
    fixed = {name for node in graph.nodes if isinstance(node, Extern) for name in node.reads()}
    fixed |= {node.base for node in graph.nodes if isinstance(node, ScatterAdd)}
    for position, out in enumerate(graph.outputs):
        if out.buffer is None:
            continue
        buffer = graph.buffers[out.buffer]
        whole = tuple(out.shape) == tuple(buffer.shape) and tuple(out.strides) == tuple(buffer.strides) \
            and sympy.sympify(out.offset) == 0
        if movable_outputs_from is None or position < movable_outputs_from or not whole:
            fixed.add(out.buffer)
    return fixed


def _preferred_strides(node: Pointwise, buffer: Buffer, readers: Iterable, bodies: dict[str, Expr],
                       buffers: dict[str, Buffer]) -> Shape | None:
    """New strides for ``node``'s buffer, or None to keep its layout."""
    if not _static(buffer.shape) or not _static(buffer.strides) or sympy.sympify(buffer.offset) != 0:
        return None
    current = _unit_dim(buffer)
    if current is None:
        return None
    votes: Counter = Counter()
    for reader in readers:
        if isinstance(reader, ScatterAdd):
            return None  # its lanes follow its source, which this module does not model
        body = bodies[reader.name]
        lane = _lane_var(reader, body, buffers, skip=node.name)
        for load in loads(body):
            if load.buffer == node.name and lane is not None:
                dim = _dim_walked(load, lane)
                if dim is not None:
                    votes[dim] += _iterations(reader)
    for dim, weight in _producer_votes(node, bodies[node.name], buffers).items():
        votes[dim] += weight
    if not votes:
        return None
    winner, pull = votes.most_common(1)[0]
    if winner == current or pull < MAJORITY * votes.get(current, 0):
        return None
    return _strides_with_innermost(buffer, winner)


def _lane_var(reader: Pointwise | Reduction, body: Expr, buffers: dict[str, Buffer], skip: str) -> sympy.Symbol | None:
    """The variable of ``reader`` that neighbouring lanes of a GPU warp (or a vector of a C++
    loop) step through: the unit-stride dimension of what a pointwise node stores; a reduction's
    innermost reduced variable, unless its other large reads (those moving with a reduced
    variable, as ``codegen/triton/tiling.py`` counts them; ``skip``'s own left out) are mostly
    contiguous along its output's unit-stride variable instead (an outer reduction)."""
    stored = _unit_dim(buffers[reader.name])
    out_var = reader.vars[stored] if stored is not None else None
    if isinstance(reader, Pointwise):
        return out_var
    reduced = [v for v, size in zip(reader.reduction_vars, reader.reduction_ranges) if size != 1]
    r_inner = reduced[-1] if reduced else None
    inner = outer = 0
    for load in loads(body):
        source = buffers.get(load.buffer)
        if load.buffer == skip or source is None or load.is_indirect or not _static(source.shape):
            continue
        if not sympy.sympify(source.flat_offset(load.index)).has(*reduced):
            continue  # a row statistic or a broadcast weight: read once a row
        walked = _unit_stride_vars(load, source, [v for v in (r_inner, out_var) if v is not None])
        weight = int(product(source.shape))
        inner += weight if r_inner in walked else 0
        outer += weight if out_var in walked else 0
    return out_var if outer > inner else r_inner


def _producer_votes(node: Pointwise, body: Expr, buffers: dict[str, Buffer]) -> Counter:
    """The producer's own pull: for each direct read of another buffer, the dimension of the
    node along which it is contiguous, with as many votes as elements it reads (at most the
    node's own)."""
    votes: Counter = Counter()
    size = _iterations(node)
    seen = set()
    for load in loads(body):
        source = buffers.get(load.buffer)
        if source is None or load.is_indirect or not _static(source.shape) or (load.buffer, load.index) in seen:
            continue
        seen.add((load.buffer, load.index))
        walked = _unit_stride_vars(load, source, node.vars)
        for dim, var in enumerate(node.vars):
            if var in walked and node.shape[dim] != 1:
                votes[dim] += min(size, int(product(source.shape)))
    return votes


def _unit_stride_vars(load: Load, source: Buffer, variables: list) -> set:
    """The variables along which ``load`` reads ``source`` at consecutive addresses."""
    found = linear_coefficients(sympy.expand(source.flat_offset(load.index)), variables)
    if found is None:
        return set()
    return {var for var, coeff in zip(variables, found[0]) if coeff == 1}


def _dim_walked(load: Load, lane: sympy.Symbol) -> int | None:
    """The one dimension of the loaded buffer whose index moves by 1 with ``lane``; None when
    ``lane`` moves none (a broadcast read), several, or not affinely."""
    walked = []
    for dim, entry in enumerate(load.index):
        if not isinstance(entry, sympy.Expr):
            if lane in getattr(entry, "free_symbols", set()):
                return None
            continue
        if not entry.has(lane):
            continue
        found = linear_coefficients(entry, [lane])
        if found is None or found[0][0] != 1:
            return None
        walked.append(dim)
    return walked[0] if len(walked) == 1 else None


def _strides_with_innermost(buffer: Buffer, dim: int) -> Shape:
    """Dense strides for ``buffer`` with ``dim`` innermost, the others in their current order."""
    order = sorted(range(len(buffer.shape)), key=lambda d: -int(buffer.strides[d]))  # outermost first
    order = [d for d in order if d != dim] + [dim]
    strides = [sympy.Integer(0)] * len(buffer.shape)
    step = sympy.Integer(1)
    for d in reversed(order):
        strides[d] = step
        step = step * buffer.shape[d]
    return tuple(strides)


def _unit_dim(buffer: Buffer) -> int | None:
    dims = [d for d, (size, stride) in enumerate(zip(buffer.shape, buffer.strides)) if size != 1 and stride == 1]
    return dims[0] if len(dims) == 1 else None


def _iterations(node: Pointwise | Reduction) -> int:
    ranges = tuple(node.shape) + (tuple(node.reduction_ranges) if isinstance(node, Reduction) else ())
    return int(product(ranges)) if _static(ranges) else 0


def _static(values) -> bool:
    return all(sympy.sympify(v).is_number for v in values)
