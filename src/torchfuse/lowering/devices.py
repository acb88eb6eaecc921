"""Graphs that mix devices: every kernel reads memory of its own device only.

Eager lets a CUDA op read CPU tensors in two ways, and a captured graph keeps both:

- a 0-d CPU tensor is a scalar; kernels receive it by value (``ir/devices.is_kernel_scalar``).
- index tensors: ``cuda_x[cpu_index]`` copies the indices to the GPU inside ATen. Lowering
  turns the index into a gathered load, so a CUDA kernel would read CPU memory: this pass puts
  an explicit ``_to_copy`` in front of such reads, once per buffer and device, and says so in
  the report.

Nodes computed on the CPU inside a CUDA graph (``torch.arange(n) * s`` before a ``.to("cuda")``)
stay CPU nodes: the scheduler never fuses or inlines across devices, and the pipeline builds
such kernels for the CPU.
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.devices import is_kernel_scalar
from torchfuse.ir.expr import Expr, Load, read_buffers
from torchfuse.ir.graph import (Buffer, Extern, ExternArg, Graph, Pointwise, Reduction, ScatterAdd, node_exprs,
                                rewrite_node_exprs)
from torchfuse.ir.symbols import contiguous_strides
from torchfuse.lowering.context import is_dense


def place_on_one_device(graph: Graph) -> list[str]:
    """Copy each buffer that a node on another device reads (other than kernel scalars) to that
    device with an ATen ``_to_copy``, and point the node's loads at the copy.

    Args:
        graph: a lowered graph; changed in place.
    Returns:
        One line per copy made, for the report.
    """
    copies: dict[tuple[str, str], str] = {}  # (buffer, device) -> the copy's buffer name
    notes: list[str] = []
    nodes = []
    for node in graph.nodes:
        if isinstance(node, (Pointwise, Reduction, ScatterAdd)):
            reads = [name for expr in node_exprs(node) for name in read_buffers(expr)]
            foreign = [name for name in dict.fromkeys(reads)
                       if _needs_copy(graph.buffers[name], node.device)]
            renames = {}
            for name in foreign:
                key = (name, str(node.device))
                if key not in copies:
                    copies[key] = _add_copy(graph, nodes, graph.buffers[name], node.device)
                    notes.append(f"{name} ({graph.buffers[name].device.type}) copied to {node.device} "
                                 f"for {node.origin or node.name}: a kernel reads memory of one device")
                renames[name] = copies[key]
            if renames:
                node = _rename_loads(node, renames)
        nodes.append(node)
    graph.nodes = nodes
    return notes


def _needs_copy(buffer: Buffer, device: torch.device) -> bool:
    return buffer.device != device and not is_kernel_scalar(buffer, device)


def _add_copy(graph: Graph, nodes: list, source: Buffer, device: torch.device) -> str:
    name = f"{source.name}_{device.type}"
    # _to_copy keeps a dense layout and makes anything else contiguous; the wrapper's
    # ensure_layout holds it to these strides either way.
    strides = source.strides if _is_dense(source) else contiguous_strides(source.shape)
    copy = Buffer(name, source.shape, source.dtype, device, tuple(strides))
    graph.buffers[name] = copy
    arg = ExternArg(source.name, source.shape, source.strides, source.offset)
    nodes.append(Extern(f"extern_{name}", torch.ops.aten._to_copy.default, (arg,), {"device": device},
                        (copy,), ((),), "aten._to_copy.default"))
    return name


def _is_dense(buffer: Buffer) -> bool:
    return sympy.sympify(buffer.offset) == 0 and is_dense(buffer.shape, buffer.strides)


def _rename_loads(node: Pointwise | Reduction | ScatterAdd, renames: dict[str, str]) -> Pointwise | Reduction | ScatterAdd:
    def rewrite(expr: Expr) -> Expr | None:
        if isinstance(expr, Load) and expr.buffer in renames:
            return Load(expr.dtype, renames[expr.buffer], expr.index)
        return None

    return rewrite_node_exprs(node, rewrite)


def check_one_device(kernels: list, buffers: dict[str, Buffer]) -> None:
    """Raise if a scheduled kernel reads or writes memory of another device (a torchfuse bug:
    at launch it would crash or read garbage; at compile time the graph falls back to ATen)."""
    for kernel in kernels:
        for member in kernel.members:
            for name in [member.node.name, *(b for expr in member.exprs for b in read_buffers(expr))]:
                buffer = buffers.get(name)
                if buffer is not None and buffer.device != kernel.device and not is_kernel_scalar(buffer, kernel.device):
                    raise RuntimeError(f"{kernel.name} runs on {kernel.device} but touches {name} on {buffer.device}")
