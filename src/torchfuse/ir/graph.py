"""The loop-level graph: buffers and the nodes that compute them.

``Pointwise`` and ``Reduction`` nodes each define one buffer by a body over index
variables (``i0..`` for output dims, ``r0..`` for reduced dims). ``ScatterAdd`` defines one by
adding values into runtime-chosen elements of a copy of another (embedding backward).
``Extern`` nodes call an ATen op on real tensors. Views never appear as nodes: lowering folds
them into the index of the loads that read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import sympy
import torch

from torchfuse.ir.expr import Expr, IndexEntry, loads, transform
from torchfuse.ir.symbols import contiguous_strides, index_vars, product

Shape = tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Buffer:
    """A tensor in memory: graph inputs, extern outputs and realized node outputs."""

    name: str
    shape: Shape
    dtype: torch.dtype
    device: torch.device
    strides: Shape
    offset: sympy.Expr = sympy.Integer(0)

    @staticmethod
    def contiguous(name: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> "Buffer":
        return Buffer(name, tuple(shape), dtype, device, contiguous_strides(shape))

    @property
    def numel(self) -> sympy.Expr:
        return product(self.shape)

    def flat_offset(self, index) -> sympy.Expr:
        """Storage offset of ``self[index]`` for a direct (all-sympy) index."""
        return self.offset + sum((i * s for i, s in zip(index, self.strides)), sympy.Integer(0))


@dataclass(frozen=True)
class Pointwise:
    """``buffer[i0, i1, ...] = body`` for every point of ``shape``."""

    name: str
    shape: Shape
    dtype: torch.dtype
    device: torch.device
    body: Expr
    origin: str = ""  # the ATen op this node came from, for reports

    @property
    def vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(len(self.shape))


@dataclass(frozen=True)
class CenteredSum:
    """What a ``Reduction`` tagged with it computes: the sum over its rows of ``(x - m) ** power``,
    where ``x`` is what the sum reduction ``total`` (same rows, same output shape) adds up and
    ``m`` is the pointwise buffer ``mean = total / n``, loaded by the body at the output's index.

    Variance's two-pass form (``lowering/rules/reductions.py``) tags its two centered sums so
    that the Triton split (``codegen/triton/split.py``) can compute them per chunk, around each
    chunk's own mean, and combine the chunks exactly: then the input is read once. Renderers and
    the scheduler ignore the tag; a pass that rewrites a tagged body must drop the tag.
    """

    mean: str
    total: str
    power: int  # 1 or 2
    deviations: str | None = None  # power 2: the power-1 sum over the same rows (its combine needs it)


@dataclass(frozen=True)
class Reduction:
    """``buffer[i...] = reduce_op over r... of body``.

    ``source_shape`` and ``reduced_axes`` say how the reduction sits on the full tensor
    it reduces: source dim ``d`` is reduced if ``d in reduced_axes``, else it is output dim
    ``kept_axes.index(d)``. The scheduler uses this to fuse pointwise nodes over the full
    shape (softmax's ``exp(x - max)``) into the same kernel.
    """

    name: str
    shape: Shape  # output shape, with the 1s of keepdim=True
    dtype: torch.dtype
    device: torch.device
    body: Expr
    reduce_op: str
    reduction_ranges: Shape
    source_shape: Shape
    reduced_axes: tuple[int, ...]
    origin: str = ""
    centered: CenteredSum | None = None  # a centered sum of a variance (see CenteredSum); else None

    @property
    def vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(len(self.shape))

    @property
    def reduction_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(len(self.reduction_ranges), "r")

    @property
    def kept_axes(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.source_shape)) if d not in self.reduced_axes)


@dataclass(frozen=True)
class ScatterAdd:
    """An accumulating scatter: ``buffer = base``, then for every point ``p`` of ``source_shape``
    where ``mask(p)`` holds, ``buffer[index(p)] += body(p)``.

    ``index`` has one entry per dimension of ``shape`` (the destination's), in the node's own
    variables ``i0..`` over ``source_shape``; entries are sympy (direct) or an int64 ``Expr``
    (gathered: a runtime value, such as a token id). Lowering guarantees that ``mask`` is false
    wherever a gathered entry is out of range, so no kernel writes outside the buffer, and that
    ``base`` is a pointwise buffer of this node's layout that nothing else reads: the buffer *is*
    ``base``'s memory, accumulated into in place (the scheduler stores ``base``, the wrapper
    hands its memory on). Several points may hit one element, so the order of the additions is
    the kernel's: atomic on GPUs (not reproducible bit for bit), ordered in C++.
    """

    name: str
    shape: Shape  # the destination's
    dtype: torch.dtype  # the destination's: the accumulation dtype (float32 for half grads)
    device: torch.device
    base: str  # the buffer whose memory holds the initial value (zeros, a copy of the input)
    source_shape: Shape
    index: tuple[IndexEntry, ...]
    body: Expr  # the value added at each point, of ``dtype``
    mask: Expr | None = None  # bool; None: every point adds
    origin: str = ""

    @property
    def vars(self) -> tuple[sympy.Symbol, ...]:
        """The variables of the iteration space (``source_shape``), which body, index and mask use."""
        return index_vars(len(self.source_shape))

    def exprs(self) -> tuple[Expr, ...]:
        """Every expression the node evaluates: the value, the mask and the gathered index entries."""
        gathered = tuple(e for e in self.index if isinstance(e, Expr))
        return (self.body,) + ((self.mask,) if self.mask is not None else ()) + gathered


def node_exprs(node: "Pointwise | Reduction | ScatterAdd") -> tuple[Expr, ...]:
    """Every expression a computed node evaluates (its body, and a scatter's mask and index)."""
    return node.exprs() if isinstance(node, ScatterAdd) else (node.body,)


def node_reads(node: "Node") -> list[str]:
    """The buffers a node reads, in first-read order; a scatter also reads (and overwrites) its base."""
    if isinstance(node, Extern):
        return node.reads()
    found = [load.buffer for expr in node_exprs(node) for load in loads(expr)]
    if isinstance(node, ScatterAdd):
        found.append(node.base)
    return list(dict.fromkeys(found))


def rewrite_node_exprs(node, rewrite):
    """``node`` with ``transform(expr, rewrite)`` applied to every expression it evaluates."""
    if not isinstance(node, ScatterAdd):
        return type(node)(**{**node.__dict__, "body": transform(node.body, rewrite)})
    index = tuple(transform(e, rewrite) if isinstance(e, Expr) else e for e in node.index)
    mask = transform(node.mask, rewrite) if node.mask is not None else None
    return type(node)(**{**node.__dict__, "body": transform(node.body, rewrite), "index": index, "mask": mask})


@dataclass(frozen=True)
class ExternArg:
    """A reference to a buffer viewed with explicit sizes/strides, passed to an Extern."""

    buffer: str
    shape: Shape
    strides: Shape
    offset: sympy.Expr


@dataclass(frozen=True)
class Extern:
    """A call of an ATen op on real tensors; produces one buffer per tensor output."""

    name: str
    target: Any  # the torch OpOverload
    args: tuple[Any, ...]  # nested structure of ExternArg / constants / sympy sizes
    kwargs: dict[str, Any]
    outputs: tuple[Buffer, ...]
    # How the op's result maps onto outputs: None (a tensor) or a tuple of indices.
    output_paths: tuple[Any, ...] = ()
    origin: str = ""

    def reads(self) -> list[str]:
        found: list[str] = []
        _collect_extern_reads(self.args, found)
        _collect_extern_reads(tuple(self.kwargs.values()), found)
        return list(dict.fromkeys(found))


def _collect_extern_reads(value: Any, found: list[str]) -> None:
    if isinstance(value, ExternArg):
        found.append(value.buffer)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_extern_reads(item, found)


Node = Union[Pointwise, Reduction, ScatterAdd, Extern]


@dataclass
class GraphOutput:
    """One output of the graph: a buffer viewed with the strides eager would give, or a constant."""

    buffer: str | None
    shape: Shape = ()
    strides: Shape = ()
    offset: sympy.Expr = sympy.Integer(0)
    constant: Any = None  # used when buffer is None (None outputs, python scalars)


@dataclass
class Graph:
    """A lowered graph: inputs in call order, nodes in a valid execution order, outputs."""

    inputs: list[Buffer] = field(default_factory=list)
    # Symbols of sizes and where to read each at run time: (input position, dim) or
    # (input position, None) when the input is itself a SymInt.
    size_sources: dict[sympy.Symbol, tuple[int, int | None]] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    buffers: dict[str, Buffer] = field(default_factory=dict)
    outputs: list[GraphOutput] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # ATen ops run as Extern without a rule
    fallback_reasons: dict[str, str] = field(default_factory=dict)  # op -> why its rule declined
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # tensors held by the graph
    name: str = "graph"

    def node(self, name: str) -> Node | None:
        return self._nodes_by_name().get(name)

    def _nodes_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes if not isinstance(n, Extern)} | {
            out.name: n for n in self.nodes if isinstance(n, Extern) for out in n.outputs
        }

    def users(self) -> dict[str, list[Node]]:
        """For each buffer name, the nodes that read it (an output counts separately)."""
        result: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node_reads(node):
                result.setdefault(name, []).append(node)
        return result

    def output_names(self) -> set[str]:
        return {o.buffer for o in self.outputs if o.buffer is not None}
