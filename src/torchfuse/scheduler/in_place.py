"""Input mutations stored in place: the kernel that computes an input's new value writes it there.

aot_autograd ends a graph that mutates an input (an optimizer step, batch norm's running
statistics) with ``copy_(input, new_value)``. Run as an ATen call, that copy reads and writes
the tensor once more after the kernel has written ``new_value`` to a temporary. When it is safe,
the temporary *is* the input's memory and the copy disappears.

Safe means: the new value comes from a pointwise kernel, or from a per-row member of a reduction
kernel that alone reads the input there (``_loads_precede_the_store``), with the input's exact
layout; no item after that kernel reads the input (it would see the new value instead of the
old); and inside the kernel every read of the input is of the element being written (renderers
emit all of a pointwise kernel's loads before its stores, so each element is read before it is
overwritten).
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.ir.expr import Expr, loads
from torchfuse.ir.graph import Buffer, ExternArg, Graph
from torchfuse.scheduler.kernel import ExternKernel, FusedKernel, KernelMember, ScheduledItem

aten = torch.ops.aten
_MAX_EXPANSIONS = 64  # member-to-member reads followed; beyond that, assume unsafe


def store_mutations_in_place(items: list[ScheduledItem], graph: Graph) -> dict[str, str]:
    """Drop each ``copy_`` into an input that its source kernel can do itself.

    Returns {new-value buffer: input buffer}: the wrapper binds the first to the second's
    memory. ``items`` loses the dropped copies.
    """
    in_place: dict[str, str] = {}
    inputs = {b.name: b for b in graph.inputs}
    reads = {id(item): _reads(item) for item in items}  # once: an optimizer step has many copies
    for item in list(items):
        source = _in_place_source(item, items, reads, graph, inputs, in_place)
        if source is not None:
            in_place[source] = item.node.args[0].buffer
            items.remove(item)
    return in_place


def _in_place_source(item: ScheduledItem, items: list[ScheduledItem], reads: dict[int, set[str]], graph: Graph,
                     inputs: dict[str, Buffer], taken: dict[str, str]) -> str | None:
    """The buffer whose kernel can write ``item``'s copy in place, or None."""
    if not isinstance(item, ExternKernel) or item.node.target is not aten.copy_.default:
        return None
    dst, src = item.node.args[:2]
    if not isinstance(dst, ExternArg) or not isinstance(src, ExternArg):
        return None
    target, source = inputs.get(dst.buffer), graph.buffers.get(src.buffer)
    if target is None or source is None or source.name in taken or target.name in taken.values():
        return None
    if not (_whole(dst, target) and _whole(src, source) and _same_layout(source, target)):
        return None
    outputs = graph.output_names()
    if source.name in outputs or target.name in outputs:
        return None
    others = [other for other in items if other is not item]
    if any(out.name in outputs or any(out.name in reads[id(other)] for other in others)
           for out in item.node.outputs):
        return None  # the copy's result is read
    kernel, member = _writer(items, source.name)
    if kernel is None or not _loads_precede_the_store(kernel, member, target.name):
        return None
    later = items[items.index(kernel) + 1:]
    if any(target.name in reads[id(other)] for other in later if other is not item):
        return None
    return source.name if _reads_only_element(kernel, member, target.name) else None


def _loads_precede_the_store(kernel: FusedKernel, writer: KernelMember, target: str) -> bool:
    """Whether every load of ``target`` in ``kernel`` happens before ``writer`` stores over it.
    A pointwise kernel loads everything before it stores. A reduction kernel computes its
    per-row members after the reduction (batch norm's running statistics, in the epilogue of
    its mean and variance): there the writer's own loads come before its store, but a kernel-mate
    computed after it would read the new value, so only the writer may read ``target``."""
    if kernel.kind == "pointwise":
        return True
    if kernel.kind != "reduction" or writer.role != "row":
        return False
    return not any(member is not writer and any(load.buffer == target for load in loads(member.body))
                   for member in kernel.members)


def _whole(arg: ExternArg, buffer: Buffer) -> bool:
    return (tuple(arg.shape), tuple(arg.strides), sympy.sympify(arg.offset)) == \
        (tuple(buffer.shape), tuple(buffer.strides), sympy.sympify(buffer.offset))


def _same_layout(a: Buffer, b: Buffer) -> bool:
    return (tuple(a.shape), tuple(a.strides), a.dtype, a.device) == (tuple(b.shape), tuple(b.strides), b.dtype, b.device) \
        and sympy.sympify(a.offset) == 0 and sympy.sympify(b.offset) == 0


def _reads(item: ScheduledItem) -> set[str]:
    if isinstance(item, ExternKernel):
        return set(item.node.reads())
    return {load.buffer for member in item.members for expr in member.exprs for load in loads(expr)}


def _writer(items: list[ScheduledItem], name: str) -> tuple[FusedKernel | None, KernelMember | None]:
    for item in items:
        if isinstance(item, FusedKernel):
            for member in item.members:
                if member.node.name == name and member.stored:
                    return item, member
    return None, None


def _reads_only_element(kernel: FusedKernel, writer: KernelMember, target: str) -> bool:
    """True when every load of ``target`` in ``kernel`` is of the element ``writer`` stores."""
    element = tuple(writer.var_map.get(v, v) for v in writer.node.vars)
    members = {m.node.name: m for m in kernel.members}
    pending: list[Expr] = [m.body for m in kernel.members]
    expansions = 0
    while pending:
        for load in loads(pending.pop()):
            if load.buffer == target:
                if load.is_indirect or len(load.index) != len(element) or any(
                        sympy.expand(sympy.sympify(a) - b) != 0 for a, b in zip(load.index, element)):
                    return False
            elif load.buffer in members:  # a kernel-mate recomputed at this index
                expansions += 1
                if expansions > _MAX_EXPANSIONS or load.is_indirect:
                    return False
                pending.append(members[load.buffer].body_at(load.index))
    return True
