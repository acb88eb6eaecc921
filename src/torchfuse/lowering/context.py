"""State shared by the lowering rules while one FX graph is lowered."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import sympy
import torch

from torchfuse.ir.expr import Const, Expr, IndexEntry, IndexValue, Op
from torchfuse.ir.graph import Buffer, Extern, ExternArg, Graph, Node, Pointwise, Reduction, ScatterAdd, Shape
from torchfuse.ir.symbols import index_vars, linear_coefficients, simplify_index
from torchfuse.lowering.values import TensorValue

BodyFn = Callable[[tuple[sympy.Symbol, ...]], Expr]
# A scatter's point function: for the variables of its iteration space, the destination index
# (one entry per destination dim: sympy, or an int64 Expr for a runtime index), the value added
# there and the condition for adding it (None: always).
ScatterFn = Callable[[tuple[sympy.Symbol, ...]], tuple[tuple[IndexEntry, ...], Expr, "Expr | None"]]


class LoweringContext:
    """Builds the ``ir.Graph``: rules call these methods to add nodes and buffers.

    Args:
        graph: the graph being built.
        unordered_adds: whether an accumulating scatter may add in an order that varies from run
            to run (atomic adds on a GPU). False when deterministic algorithms are on and the
            kernels would be Triton's: those scatters then run as ATen's deterministic kernels.
    """

    def __init__(self, graph: Graph, unordered_adds: bool = True) -> None:
        self.graph = graph
        self._counter = itertools.count()
        self.current_origin = ""
        self.unordered_adds = unordered_adds
        self.fallback_reason: str | None = None  # why the current op's rule declined, if it said
        self._indexed_nodes: list | None = None  # _node_index's state: the list it scanned,
        self._indexed = 0  # how far,
        self._writers: dict[str, Node] = {}  # and what it found
        self._extern_reads: set[str] = set()

    def not_lowered(self, reason: str) -> Any:
        """Decline the current op, saying why (the report lists it with its ATen fallback)."""
        self.fallback_reason = reason
        return NotImplemented

    def new_name(self, prefix: str = "buf") -> str:
        return f"{prefix}{next(self._counter)}"

    def add_buffer(self, buffer: Buffer) -> None:
        self.graph.buffers[buffer.name] = buffer

    def pointwise(self, shape: Shape, dtype: torch.dtype, device: torch.device, body_fn: BodyFn,
                  strides: Shape | None = None) -> TensorValue:
        """Add a node computing ``body_fn(i0, i1, ...)`` at every point of ``shape``.

        Its buffer is contiguous unless ``strides`` (a dense layout) says otherwise.
        """
        shape = tuple(sympy.sympify(s) for s in shape)
        name = self.new_name()
        body = body_fn(index_vars(len(shape)))
        self.graph.nodes.append(Pointwise(name, shape, dtype, device, body, self.current_origin))
        if strides is None:
            self.add_buffer(Buffer.contiguous(name, shape, dtype, device))
        else:
            self.add_buffer(Buffer(name, shape, dtype, device, tuple(sympy.sympify(s) for s in strides)))
        return TensorValue.of_buffer(name, shape, dtype, device)

    def reduction(
        self,
        source: Shape,
        axes: tuple[int, ...],
        keepdim: bool,
        dtype: torch.dtype,
        device: torch.device,
        reduce_op: str,
        body_fn: BodyFn,
    ) -> TensorValue:
        """Reduce ``body_fn(full index)`` over ``axes`` of a tensor of shape ``source``."""
        source = tuple(sympy.sympify(s) for s in source)
        axes = tuple(sorted(set(a % len(source) for a in axes))) if source else ()
        kept = [d for d in range(len(source)) if d not in axes]
        out_shape = tuple(sympy.Integer(1) if d in axes else source[d] for d in range(len(source))) if keepdim else tuple(source[d] for d in kept)
        out_vars = index_vars(len(out_shape))
        red_vars = index_vars(len(axes), "r")
        full_index = []
        for d in range(len(source)):
            if d in axes:
                full_index.append(red_vars[axes.index(d)])
            else:
                full_index.append(out_vars[d] if keepdim else out_vars[kept.index(d)])
        name = self.new_name()
        node = Reduction(
            name, out_shape, dtype, device, body_fn(tuple(full_index)), reduce_op,
            tuple(source[d] for d in axes), source, axes, self.current_origin,
        )
        self.graph.nodes.append(node)
        self.add_buffer(Buffer.contiguous(name, out_shape, dtype, device))
        return TensorValue.of_buffer(name, out_shape, dtype, device)

    def scatter_add(self, shape: Shape, dtype: torch.dtype, device: torch.device, initial: BodyFn,
                    source_shape: Shape, point: ScatterFn, strides: Shape | None = None) -> TensorValue:
        """Add an accumulating scatter: a new buffer of ``shape`` holding ``initial`` (over its own
        index), then ``buffer[index(p)] += value(p)`` for every point ``p`` of ``source_shape``
        where the condition holds (``point(p)`` gives the three).

        The initial value is a pointwise node of its own (the scatter's ``base``): nothing else
        reads it, so the scatter may accumulate into its memory. Contributions whose runtime
        index falls outside the buffer are dropped (the mask says so): a kernel never writes
        out of bounds, whatever the indices hold.
        """
        shape = tuple(sympy.sympify(s) for s in shape)
        source_shape = tuple(sympy.sympify(s) for s in source_shape)
        base = self.pointwise(shape, dtype, device, initial, strides)
        index, value, mask = point(index_vars(len(source_shape)))
        for entry, size in zip(index, shape):
            if isinstance(entry, Expr):
                mask = _conjunction(mask, _in_range(entry, size))
        name = self.new_name()
        self.graph.nodes.append(ScatterAdd(name, shape, dtype, device, base.buffer, source_shape, tuple(index), value,
                                           mask, self.current_origin))
        layout = self.graph.buffers[base.buffer]
        self.add_buffer(Buffer(name, shape, dtype, device, layout.strides))
        return TensorValue.of_buffer(name, shape, dtype, device)

    def extern_arg(self, value: TensorValue) -> ExternArg:
        """Pass ``value`` to an ATen call: a strided view of its buffer, or a fresh copy."""
        buffer = self.graph.buffers[value.buffer]
        strided = _as_strided_view(value, buffer)
        if strided is not None:
            return strided
        copy = self.pointwise(value.shape, value.dtype, value.device, lambda idx: value.load(idx))
        return self.extern_arg(copy)

    # -- layouts of node buffers ---------------------------------------------------------------
    def is_whole_free_buffer(self, value: TensorValue) -> bool:
        """True when ``value`` is a whole pointwise or reduction buffer whose strides no Extern
        has relied on yet (so they may still change)."""
        buffer = self.graph.buffers[value.buffer]
        if not (value.is_identity and value.shape == buffer.shape):
            return False
        writers, extern_reads = self._node_index()
        if not isinstance(writers.get(value.buffer), (Pointwise, Reduction)):
            return False
        return value.buffer not in extern_reads

    def _node_index(self) -> tuple[dict[str, Node], set[str]]:
        """The node writing each buffer, and the buffers ATen calls read, brought up to date with
        the nodes appended since the last query (lowering only appends). Scanning every node at
        every query made lowering quadratic: 2.2 of MobileNetV3's 5 s under a profiler."""
        nodes = self.graph.nodes
        if self._indexed_nodes is not nodes or self._indexed > len(nodes):
            self._indexed_nodes, self._indexed, self._writers, self._extern_reads = nodes, 0, {}, set()
        for node in nodes[self._indexed:]:
            if isinstance(node, Extern):
                self._extern_reads.update(node.reads())
                self._writers.update((out.name, node) for out in node.outputs)
            else:
                self._writers[node.name] = node
        self._indexed = len(nodes)
        return self._writers, self._extern_reads

    def adopt_traced_layout(self, value: TensorValue, strides: Shape) -> None:
        """Lay out the buffer behind ``value`` with ``strides`` (what tracing saw) when they are
        dense and the buffer's layout is still free; otherwise leave it as it is."""
        if self.is_whole_free_buffer(value):
            self.relayout(value, strides)

    def relayout(self, value: TensorValue, strides: Shape) -> None:
        """Lay out ``value``'s whole buffer with ``strides`` when they are dense; the caller
        knows that no ATen call relied on its strides yet."""
        if not is_dense(value.shape, strides):
            return
        buffer = self.graph.buffers[value.buffer]
        self.graph.buffers[value.buffer] = Buffer(buffer.name, buffer.shape, buffer.dtype, buffer.device,
                                                  tuple(sympy.sympify(s) for s in strides))

    def extern(self, target: Any, args: tuple, kwargs: dict, outputs: tuple[Buffer, ...], paths: tuple) -> None:
        for buffer in outputs:
            self.add_buffer(buffer)
        self.graph.nodes.append(Extern(self.new_name("extern"), target, args, kwargs, outputs, paths, self.current_origin))


def _in_range(entry: Expr, size: sympy.Expr) -> Expr:
    """``0 <= entry < size`` for an int64 runtime index."""
    size_value = Const(torch.int64, int(size)) if size.is_number else IndexValue(torch.int64, size)
    return Op(torch.bool, "logical_and", (Op(torch.bool, "ge", (entry, Const(torch.int64, 0))),
                                          Op(torch.bool, "lt", (entry, size_value))))


def _conjunction(a: Expr | None, b: Expr) -> Expr:
    return b if a is None else Op(torch.bool, "logical_and", (a, b))


def is_dense(shape: Shape, strides: Shape) -> bool:
    """True when ``strides`` lay ``shape`` out densely (a permutation of contiguous).

    Works for symbolic sizes too: the innermost dim has stride 1, the next one the innermost's
    size, and so on; each step looks for the dim whose stride equals the product so far.
    """
    shape = [sympy.sympify(v) for v in shape]
    strides = [sympy.sympify(v) for v in strides]
    remaining = [d for d in range(len(shape)) if shape[d] != 1]  # size-1 dims may have any stride
    expected = sympy.Integer(1)
    while remaining:
        match = next((d for d in remaining if sympy.expand(strides[d] - expected) == 0), None)
        if match is None:
            return False
        remaining.remove(match)
        expected = expected * shape[match]
    return True


def _as_strided_view(value: TensorValue, buffer: Buffer) -> ExternArg | None:
    """The value as (sizes, strides, offset) over ``buffer`` when its index map is affine."""
    if value.is_identity and len(buffer.strides) == value.rank:
        # the whole buffer as it lies (most ATen operands): its own strides, no index algebra
        return ExternArg(value.buffer, value.shape, tuple(sympy.sympify(s) for s in buffer.strides),
                         sympy.sympify(buffer.offset))
    offset_expr = simplify_index(buffer.flat_offset(value.index_map))
    coeffs = linear_coefficients(offset_expr, value.vars)
    if coeffs is None:
        return None
    strides, offset = coeffs
    if any(s.has(*index_vars(8, "r")) for s in strides):
        return None
    return ExternArg(value.buffer, value.shape, tuple(strides), offset)


def load_broadcast(value: TensorValue, out_index: tuple[sympy.Expr, ...], out_shape: Shape) -> Expr:
    """Read ``value`` at ``out_index`` of a broadcast result of shape ``out_shape``."""
    offset = len(out_shape) - value.rank
    index = []
    for d, size in enumerate(value.shape):
        out_dim = d + offset
        broadcast = size == 1 and out_shape[out_dim] != 1
        index.append(sympy.Integer(0) if broadcast else out_index[out_dim])
    return value.load(tuple(index))
