"""Where a node sits in a kernel's iteration space: the legality half of fusion.

``place(node, kernel)`` answers "may this node run in this kernel?" with either a new
kernel shape and the node's variable map, or a refusal with its reason. Whether it is
*worth* it is ``policy.py``'s question.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy

from torchfuse.ir.expr import Expr
from torchfuse.ir.graph import Buffer, Pointwise, Reduction, Shape
from torchfuse.scheduler.alignment import aligned_row_map
from torchfuse.ir.symbols import index_vars
from torchfuse.scheduler.decisions import FusionDecision
from torchfuse.scheduler.kernel import FusedKernel, KernelMember

Node = Union[Pointwise, Reduction]


@dataclass
class Placement:
    x_ranges: Shape
    r_ranges: Shape
    var_map: dict[sympy.Symbol, sympy.Expr]
    role: str
    # New variable maps for existing members when the kernel changes shape (pointwise -> reduction).
    remapped: dict[str, tuple[dict[sympy.Symbol, sympy.Expr], str]] | None = None


def non_unit(shape: Shape) -> Shape:
    return tuple(s for s in shape if s != 1)


def row_map(node_vars, shape: Shape, x_ranges: Shape) -> dict | None:
    """Map a node over ``shape`` onto kernel rows ``x_ranges`` (size-1 dims read index 0)."""
    if non_unit(shape) != tuple(x_ranges):
        return None
    x_vars = iter(index_vars(len(x_ranges), "x"))
    return {v: (sympy.Integer(0) if s == 1 else next(x_vars)) for v, s in zip(node_vars, shape)}


def reduction_map(red: Reduction, x_ranges: Shape) -> dict | None:
    """Variable map of a reduction: kept dims onto rows, reduced dims onto r variables."""
    mapping = row_map(red.vars, red.shape, x_ranges)
    if mapping is None:
        return None
    r_vars = iter(index_vars(len(non_unit(red.reduction_ranges)), "r"))
    for var, size in zip(red.reduction_vars, red.reduction_ranges):
        mapping[var] = sympy.Integer(0) if size == 1 else next(r_vars)
    return mapping


def full_map(node_vars, red: Reduction, red_map: dict) -> dict:
    """Map a node over ``red.source_shape`` onto (rows, r) the way ``red`` reads its input."""
    keepdim = len(red.shape) == len(red.source_shape)
    kept = red.kept_axes
    mapping = {}
    for d, var in enumerate(node_vars):
        if d in red.reduced_axes:
            mapping[var] = red_map[red.reduction_vars[red.reduced_axes.index(d)]]
        else:
            mapping[var] = red_map[red.vars[d if keepdim else kept.index(d)]]
    return mapping


def place(node: Node, kernel: FusedKernel, own_body: Expr | None = None,
          buffers: dict[str, Buffer] | None = None) -> Placement | FusionDecision:
    """``own_body`` (the node's body with producers inlined) and ``buffers``: to align a pointwise
    node with a pointwise kernel's members (alignment.py)."""
    if kernel.kind == "scatter":
        # Its buffer is complete only when every program's additions are done, and its points
        # are source elements, not destination elements: nothing shares its loop.
        return FusionDecision.no(f"{kernel.name} is an accumulating scatter: it runs alone")
    if isinstance(node, Reduction):
        return _place_reduction(node, kernel)
    return _place_pointwise(node, kernel, own_body, buffers)


def _place_pointwise(node: Pointwise, kernel: FusedKernel, own_body: Expr | None,
                     buffers: dict[str, Buffer] | None) -> Placement | FusionDecision:
    mapping = row_map(node.vars, node.shape, kernel.x_ranges)
    if mapping is not None:
        if own_body is not None and buffers is not None and kernel.kind == "pointwise" and kernel.members:
            mapping = aligned_row_map(node, own_body, kernel, mapping, buffers)
        return Placement(kernel.x_ranges, kernel.r_ranges, mapping, "row")
    for member in kernel.members:
        red = member.node
        if isinstance(red, Reduction) and tuple(node.shape) == tuple(red.source_shape):
            return Placement(kernel.x_ranges, kernel.r_ranges, full_map(node.vars, red, member.var_map), "full")
    return FusionDecision.no(
        f"different iteration space: {_fmt(node.shape)} vs kernel {_fmt(kernel.x_ranges)}"
        + (f" x r{_fmt(kernel.r_ranges)}" if kernel.r_ranges else "")
    )


def _place_reduction(node: Reduction, kernel: FusedKernel) -> Placement | FusionDecision:
    r_ranges = non_unit(node.reduction_ranges)
    x_ranges = non_unit(node.shape)
    if kernel.kind == "reduction":
        if tuple(kernel.r_ranges) != r_ranges or tuple(kernel.x_ranges) != x_ranges:
            return FusionDecision.no(
                f"reduction over {_fmt(x_ranges)} x r{_fmt(r_ranges)} vs kernel "
                f"{_fmt(kernel.x_ranges)} x r{_fmt(kernel.r_ranges)}"
            )
        return Placement(x_ranges, r_ranges, reduction_map(node, x_ranges), "reduction")
    # A pointwise kernel becomes a reduction kernel if each member fits the new space.
    red_map = reduction_map(node, x_ranges)
    remapped = {}
    for member in kernel.members:
        shape = member.node.shape
        if tuple(shape) == tuple(node.source_shape) and r_ranges:
            remapped[member.node.name] = (full_map(member.node.vars, node, red_map), "full")
        elif (mapping := row_map(member.node.vars, shape, x_ranges)) is not None:
            remapped[member.node.name] = (mapping, "row")
        else:
            return FusionDecision.no(
                f"pointwise kernel over {_fmt(kernel.x_ranges)} does not fit reduction "
                f"{_fmt(x_ranges)} x r{_fmt(r_ranges)}"
            )
    return Placement(x_ranges, r_ranges, red_map, "reduction", remapped)


def _fmt(shape: Shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def apply(kernel: FusedKernel, node: Node, placement: Placement) -> KernelMember:
    """Add ``node`` to ``kernel`` as ``placement`` says; returns the new member."""
    if placement.remapped:
        for member in kernel.members:
            member.var_map, member.role = placement.remapped[member.node.name]
    kernel.x_ranges, kernel.r_ranges = placement.x_ranges, placement.r_ranges
    member = KernelMember(node, placement.var_map, placement.role)
    kernel.members.append(member)
    return member
