"""Iteration order from memory order, shared by the renderers.

A kernel's rows come in the logical order of their sizes (N, C, H, W). Walked that way, a
channels-last store moves C elements between neighbouring iterations: the C++ compiler cannot
vectorize it, and on a GPU neighbouring lanes of a warp write C elements apart (uncoalesced,
about 240 GB/s measured on an H200 against ~4 TB/s). Ordering rows by their stride in the
kernel's first store, largest first, puts the unit-stride row innermost. Only the order of
independent iterations changes, so any order computes the same values.
"""
from __future__ import annotations

import sympy

from torchfuse.ir.expr import loads
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import contiguous_strides, linear_coefficients, simplify_index


def store_order(variables: list, sizes: list, store_expr: sympy.Expr | None) -> tuple[list, list]:
    """``variables`` and their ``sizes`` reordered by their coefficient in ``store_expr`` (the
    first store's offset), largest first; unchanged when that offset is not linear in them with
    numeric coefficients (symbolic strides: keep the logical order)."""
    if store_expr is None or len(variables) < 2:
        return variables, sizes
    coeffs = linear_coefficients(sympy.expand(store_expr), variables)
    if coeffs is None or not all(sympy.sympify(c).is_number for c in coeffs[0]):
        return variables, sizes
    order = sorted(range(len(variables)), key=lambda i: -int(coeffs[0][i]))  # stable for ties
    return [variables[i] for i in order], [sizes[i] for i in order]


def same_storage_layout(source: Buffer, target: Buffer) -> bool:
    """Whether each offset holds the same element in both (a kernel may then write ``target``
    over ``source`` element by element): one layout, or both dense and row-major over as many
    elements (a matmul's [B*T, H] output feeding a [B, T, H] GELU)."""
    if source.dtype != target.dtype or sympy.sympify(source.offset) != 0 or sympy.sympify(target.offset) != 0:
        return False
    if tuple(source.shape) == tuple(target.shape) and tuple(source.strides) == tuple(target.strides):
        return True
    dense = all(tuple(b.strides) == tuple(contiguous_strides(b.shape)) for b in (source, target))
    return dense and sympy.simplify(sympy.sympify(source.numel) - sympy.sympify(target.numel)) == 0


def overwritable_inputs(kernel, buffers: dict[str, Buffer]) -> dict[str, list[str]]:
    """Inputs a pointwise kernel's single stored member may overwrite, element by element (both
    renderers: ``CppKernel.in_place``, ``TritonKernel.in_place``). An input qualifies when every
    load of it (through the kernel-mates the member recomputes) reads exactly the element stored
    at the same point, in the same layout (``same_storage_layout``): each element is then read
    before it is written, by the same iteration or program (a pointwise kernel's loads are all
    emitted before its stores). Whether the input is dead after the kernel, and ours to
    overwrite, is the wrapper's call. It saves an allocation and writes to cache lines the kernel
    already holds (a GELU after a matmul measured faster than eager's out-of-place one only this
    way)."""
    stored = [m for m in kernel.members if m.stored]
    if kernel.kind != "pointwise" or len(stored) != 1:
        return {}
    member = stored[0]
    target = buffers[member.node.name]
    where = simplify_index(target.flat_offset(tuple(member.var_map.get(v, v) for v in member.node.vars)) - target.offset)
    members = {m.node.name: m for m in kernel.members}
    offsets: dict[str, set] = {}
    pending, expanded = [member.body], set()
    while pending:
        for load in loads(pending.pop()):
            if load.buffer in members:  # a kernel-mate recomputed at this index: its loads count
                if (load.buffer, load.index) not in expanded:
                    expanded.add((load.buffer, load.index))
                    pending.append(members[load.buffer].body_at(load.index))
                continue
            if load.is_indirect:
                offsets.setdefault(load.buffer, set()).add("indirect")
                continue
            buffer = buffers[load.buffer]
            offsets.setdefault(load.buffer, set()).add(simplify_index(buffer.flat_offset(load.index) - buffer.offset))
    found = [name for name, seen in offsets.items()
             if seen == {where} and same_storage_layout(buffers[name], target)]
    return {member.node.name: found} if found else {}
