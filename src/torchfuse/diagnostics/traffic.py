"""Bytes each scheduled kernel reads and writes, against what eager PyTorch moves for the same ops.

Eager runs one kernel per ATen op (views excepted), and each reads all its inputs from memory and
writes its output. A fused kernel reads only the buffers that come from outside it and writes only
the buffers someone outside reads. The difference is what fusion saves in memory traffic.

Sizes are sympy expressions; symbolic ones are evaluated with the example inputs' size hints (the
sizes seen when the graph was traced) and the expression is kept as text for the report.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from torchfuse.diagnostics.model import BufferAccess
from torchfuse.frontend.symbolic import size_hint
from torchfuse.ir.expr import read_buffers
from torchfuse.ir.graph import Buffer, Extern, Graph, Pointwise, Reduction, ScatterAdd, node_exprs, node_reads
from torchfuse.ir.printer import dtype_name
from torchfuse.ir.symbols import product


@dataclass(frozen=True)
class KernelTraffic:
    reads: list[BufferAccess]
    writes: list[BufferAccess]
    eager_bytes: int | None


class TrafficCounter:
    """Counts bytes for the items of one schedule (see ``pipeline.stage_schedule``).

    Args:
        graph: the lowered graph.
        kernels: the schedule's fused kernels (to tell stored buffers from inlined ones).
        shape_env: Dynamo's ShapeEnv for symbolic sizes, or None.
    """

    def __init__(self, graph: Graph, kernels: list[Any], shape_env: Any | None) -> None:
        self.graph = graph
        self.shape_env = shape_env
        self.nodes = {n.name: n for n in graph.nodes if not isinstance(n, Extern)}
        self.members = {m.node.name for k in kernels for m in k.members}
        self._seen: dict[str, BufferAccess] = {}  # a buffer is read by many kernels: size it once

    def access(self, name: str) -> BufferAccess:
        if name not in self._seen:
            self._seen[name] = self._access(name)
        return self._seen[name]

    def _access(self, name: str) -> BufferAccess:
        buffer: Buffer | None = self.graph.buffers.get(name)
        if buffer is None:
            return BufferAccess(name, "?", None)
        expr = product(buffer.shape) * _itemsize(buffer.dtype)
        shape = f"{dtype_name(buffer.dtype)}[{', '.join(str(s) for s in buffer.shape)}]"
        return BufferAccess(name, shape, self._evaluate(expr), "" if sympy.sympify(expr).is_number else str(expr))

    def _evaluate(self, expr: sympy.Expr) -> int | None:
        try:
            with warnings.catch_warnings():  # some torch versions deprecate ShapeEnv.size_hint noisily
                warnings.simplefilter("ignore", FutureWarning)
                return size_hint(expr, self.shape_env)
        except Exception:  # noqa: BLE001 - an unknown size is shown as its expression
            return None

    def fused(self, kernel: Any) -> KernelTraffic:
        """A ``FusedKernel``: reads from outside, stores that leave it, and eager's bytes for
        its members and the producers inlined into them."""
        own = set(kernel.node_names)
        reads: list[str] = []
        for member in kernel.members:
            body = member.own_body if member.own_body is not None else member.node.body
            reads += [b for b in read_buffers(body) if b not in own]
            if isinstance(member.node, ScatterAdd):  # its index and mask (the additions count as the write)
                reads += [b for expr in member.exprs[1:] for b in read_buffers(expr) if b not in own]
        writes = [m.node.name for m in kernel.members if m.stored]
        eager_nodes = self._with_inlined([m.node for m in kernel.members])
        return KernelTraffic(self._accesses(reads), self._accesses(writes), self._eager(eager_nodes))

    def extern(self, node: Extern) -> KernelTraffic:
        reads, writes = node.reads(), [out.name for out in node.outputs]
        return KernelTraffic(self._accesses(reads), self._accesses(writes), self._eager([node]))

    def graph_eager_bytes(self) -> int | None:
        return self._eager(list(self.graph.nodes))

    def _accesses(self, names: list[str]) -> list[BufferAccess]:
        return [self.access(n) for n in dict.fromkeys(names)]

    def _with_inlined(self, nodes: list[Any]) -> list[Any]:
        """The nodes plus every pointwise producer recomputed inside them (not stored)."""
        found: dict[str, Any] = {n.name: n for n in nodes}
        pending = list(nodes)
        while pending:
            node = pending.pop()
            for name in (b for expr in node_exprs(node) for b in read_buffers(expr)):
                producer = self.nodes.get(name)
                if isinstance(producer, Pointwise) and name not in self.members and name not in found:
                    found[name] = producer
                    pending.append(producer)
        return list(found.values())

    def _eager(self, nodes: list[Any]) -> int | None:
        total = 0
        for node in nodes:
            if isinstance(node, Extern):
                names = node.reads() + [out.name for out in node.outputs]
            elif isinstance(node, (Pointwise, Reduction, ScatterAdd)):
                names = node_reads(node) + [node.name]
            else:
                continue
            for name in names:
                size = self.access(name).bytes
                if size is None:
                    return None
                total += size
        return total


def _itemsize(dtype: Any) -> int:
    try:
        return dtype.itemsize
    except AttributeError:  # older torch dtypes: use an empty tensor
        return torch.empty((), dtype=dtype).element_size()
