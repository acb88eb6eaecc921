"""Triton text of a scatter kernel: each source point adds its value at a runtime index.

A scatter kernel (one ``ScatterAdd`` member, ``ir/graph.py``) walks its source points over one
flat ``xindex``, as a pointwise kernel does, and launches like one. The points enter ``xindex``
with a unit-stride dim innermost (``scatter_order``): the one the destination steps by 1 along
(an embedding gradient's feature dim: neighbouring lanes read neighbouring elements of a
gradient row and add into neighbouring elements of a weight row, both coalesced), or else the
one of the largest value read. Each lane computes its value, its destination offset (the
direct part of the index plus each runtime entry times its stride) and ``tl.atomic_add``\\ s it
there under the scatter's mask, which also masks the value's loads: an embedding's padding rows
are neither read nor added. Atomics are ``relaxed``: the additions need no ordering among
themselves, only to be complete when the kernel ends. Destinations are never half types
(lowering accumulates those in float32), so no bf16 atomics are needed.

The renderer is ``kernel.KernelRenderer``; these functions take it as a parameter (as the C++
strategies take theirs), so that module can call them without an import cycle.
"""
from __future__ import annotations

from typing import Any

import sympy

from torchfuse.codegen.scope import Scope
from torchfuse.codegen.triton.printer import tl_dtype
from torchfuse.codegen.triton.tiling import Access, unit_row_last
from torchfuse.ir.expr import Expr, index_symbols, loads, substitute_index
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import simplify_index
from torchfuse.scheduler.kernel import FusedKernel, KernelMember

# The flat index of kernel.py (same name and assumptions, so the same sympy symbol).
XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)


def scatter_order(kernel: FusedKernel, buffers: dict[str, Buffer]) -> tuple[list, list]:
    """The order of a scatter kernel's points in ``xindex``: a unit-stride dim innermost, chosen
    by the heaviest access (by buffer size) that has one: the destination's direct part first
    in line, then each value load."""
    member = kernel.members[0]
    found = [_destination_access(member, buffers)]
    for load in loads(member.body):
        buffer = buffers.get(load.buffer)
        if buffer is not None and not load.is_indirect:
            found.append(Access(simplify_index(buffer.flat_offset(load.index) - buffer.offset), _weight(buffer)))
    return unit_row_last(found, list(kernel.x_vars), list(kernel.x_ranges))


def _destination_access(member: KernelMember, buffers: dict[str, Buffer]) -> Access:
    """The destination offset without its runtime entries (they are the same along the dims
    the direct part walks)."""
    buffer = buffers[member.node.name]
    direct = [sympy.Integer(0) if isinstance(e, Expr) else e for e in member.index]
    return Access(simplify_index(buffer.flat_offset(direct) - buffer.offset), _weight(buffer))


def _weight(buffer: Buffer) -> int:
    try:
        return int(buffer.numel)
    except TypeError:  # symbolic: count it as large
        return 1 << 40


def emit_scatter(renderer: Any, scope: Scope) -> None:
    """The kernel's body after its prologue: mask, value, destination, atomic add."""
    member: KernelMember = renderer.kernel.members[0]
    writer, flat = renderer.writer, renderer.flat
    condition = "xmask"
    unmasked = writer.mask_for
    if member.mask is not None:
        extra = f"({writer.tensor(substitute_index(member.mask, flat), scope)})"
        condition = f"xmask & {extra}"
        # Loads of the value are masked by the condition as well: masked-off points read nothing.
        writer.mask_for = lambda used: f"{unmasked(used)} & {extra}" if unmasked(used) else ""
    offset = _destination_offset(renderer, member, scope)
    try:
        value = writer.tensor(substitute_index(member.body, flat), scope)
    finally:
        writer.mask_for = unmasked
    node = member.node
    text = f"tl.broadcast_to({value}, [XBLOCK]).to({tl_dtype(node.dtype)})"
    scope.emit(f"tl.atomic_add({renderer._pointer(node.name)} + ({offset}), {text}, {condition}, sem='relaxed')")


def _destination_offset(renderer: Any, member: KernelMember, scope: Scope) -> str:
    """Text of the destination's offset from its ``data_ptr()``: the direct part in xindex, plus
    each runtime entry times its dim's stride; a block of XBLOCK offsets even when constant."""
    buffer = renderer.buffers[member.node.name]
    writer, flat = renderer.writer, renderer.flat
    direct, terms, moves = sympy.Integer(0), [], False
    for entry, stride in zip(member.index, buffer.strides):
        if isinstance(entry, Expr):
            entry = substitute_index(entry, flat)
            terms.append(f"({writer.tensor(entry, scope)}) * {writer.index_text(stride)}")
            moves = moves or XINDEX in index_symbols(entry)
        else:
            direct = direct + sympy.sympify(entry).xreplace(flat) * stride
    direct = simplify_index(direct)
    text = " + ".join([writer.index_text(direct)] + terms)
    return text if moves or XINDEX in direct.free_symbols else f"{text} + 0 * xindex"
