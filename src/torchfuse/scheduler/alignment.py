"""Which way round a pointwise node joins a kernel whose rows include equal sizes.

Fusion places a node's dims onto a kernel's rows in order (``placement.row_map``). When rows
have equal sizes (attention's ``[B, H, S, S]``, square images), a node may be the transpose of a
kernel-mate: an attention backward under autocast casts P for one matmul and dS, transposed,
for another (``dS.transpose(-1, -2).to(torch.bfloat16)``: a node over the transposed space
whose buffer keeps dS's memory order). Placed in order, it recomputed the softmax at (j, i)
where its mate did at (i, j): each input read twice, half of it across the lanes (T5's encoder
on the H200: 393 MB in 328 us, 29% of copy bandwidth). Any bijection of a pointwise node's
points onto the kernel's is legal, so among the permutations of its equal-size dims this takes
the one whose loads meet the kernel's own (each shared one is one load), in order unless
another shares more.
"""
from __future__ import annotations

import itertools

import sympy

from torchfuse.ir.expr import Expr, loads, substitute_index
from torchfuse.ir.graph import Buffer, Pointwise
from torchfuse.scheduler.kernel import FusedKernel

MAX_CANDIDATES = 24  # permutations tried (4 equal dims); more equal dims keep their order


def aligned_row_map(node: Pointwise, own_body: Expr, kernel: FusedKernel, mapping: dict[sympy.Symbol, sympy.Expr],
                    buffers: dict[str, Buffer]) -> dict[sympy.Symbol, sympy.Expr]:
    """``mapping`` (the in-order row map of ``node`` into pointwise ``kernel``), or a permutation
    of it among equal-size dims that shares more loads with the kernel's members and stores
    along the same unit-stride row as the kernel's first member (a permutation that only moved
    the transpose from a read to the store would leave it where the 2-D tiling cannot see it)."""
    candidates = _permutations(node, mapping)
    if len(candidates) < 2:
        return mapping
    # A mate's value at its own point is in a register; first the usual case, cheaply: in order,
    # the node reads a mate where the mate computes (a consumer fused after its producer).
    existing = {(member.node.name, tuple(member.var_map.get(v, v) for v in member.node.vars))
                for member in kernel.members}
    if _shared(own_body, mapping, existing):
        return mapping
    existing |= {(load.buffer, load.index) for member in kernel.members for load in loads(member.body)
                 if not load.is_indirect}
    first = kernel.members[0]
    lane = _unit_row(buffers.get(first.node.name), first.node.vars, first.var_map)
    if lane is None or _shared(own_body, mapping, existing):
        return mapping
    best, best_shared = mapping, 0
    for candidate in candidates[1:]:
        shared = _shared(own_body, candidate, existing)
        if shared > best_shared and _unit_row(buffers.get(node.name), node.vars, candidate) == lane:
            best, best_shared = candidate, shared
    return best


def _unit_row(buffer: Buffer | None, node_vars, var_map: dict) -> sympy.Symbol | None:
    """The kernel row along which a member's store steps by one element, if any."""
    if buffer is None:
        return None
    for var, stride, size in zip(node_vars, buffer.strides, buffer.shape):
        if sympy.sympify(stride) == 1 and sympy.sympify(size) != 1:
            row = var_map.get(var)
            return row if isinstance(row, sympy.Symbol) else None
    return None


def _shared(own_body: Expr, mapping: dict, existing: set) -> int:
    body = substitute_index(own_body, mapping)
    return sum(1 for load in loads(body) if not load.is_indirect and (load.buffer, load.index) in existing)


def _permutations(node: Pointwise, mapping: dict[sympy.Symbol, sympy.Expr]) -> list[dict]:
    """``mapping`` first, then the maps that swap the kernel rows of the node's equal-size dims."""
    groups: dict[int, list[sympy.Symbol]] = {}
    for var, size in zip(node.vars, node.shape):
        size = sympy.sympify(size)
        if size != 1 and size.is_Integer:
            groups.setdefault(int(size), []).append(var)
    groups = {size: members for size, members in groups.items() if len(members) > 1}
    found = [mapping]
    for orders in itertools.product(*(itertools.permutations(members) for members in groups.values())):
        candidate = dict(mapping)
        for members, order in zip(groups.values(), orders):
            for var, source in zip(members, order):
                candidate[var] = mapping[source]
        if candidate not in found:
            found.append(candidate)
        if len(found) >= MAX_CANDIDATES:
            break
    return found
