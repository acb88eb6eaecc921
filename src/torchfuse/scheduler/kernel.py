"""What the scheduler hands to codegen: fused kernels, and externs in execution order.

A ``FusedKernel`` iterates over ``x_ranges`` (its rows, or all points of a pointwise
kernel) and, for reductions, ``r_ranges``. Each member node is placed in that space by a
``var_map`` from the node's own index variables to kernel variables ``x*`` and ``r*``. A
*scatter* kernel has one member, a ``ScatterAdd`` over its source points (``x_ranges``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import sympy
import torch

from torchfuse.ir.expr import Expr, IndexEntry, substitute_index
from torchfuse.ir.graph import Extern, Pointwise, Reduction, ScatterAdd, Shape
from torchfuse.ir.symbols import index_vars, simplify_index


@dataclass(eq=False)
class KernelMember:
    node: Union[Pointwise, Reduction, ScatterAdd]
    var_map: dict[sympy.Symbol, sympy.Expr]
    # "reduction", "row" (pointwise over the kept dims), "full" (pointwise over rows x r) or
    # "scatter" (a ScatterAdd over the kernel's points).
    role: str
    stored: bool = True  # False when every reader is inside this kernel
    own_body: Expr | None = None  # the body with producers inlined, in the node's own variables
    # A scatter's destination index and mask with producers inlined, in its own variables.
    own_index: tuple[IndexEntry, ...] | None = None
    own_mask: Expr | None = None
    # ``body``'s last result, with the body and var_map it was computed from (the scheduler and
    # codegen ask for it many times: thousands of substitutions in a BERT backward).
    _body_memo: tuple[Expr, dict, Expr] | None = field(default=None, repr=False)

    def body_at(self, index) -> Expr:
        """The inlined body read at ``index`` (how kernel-mates recompute a pointwise member)."""
        own = self.own_body if self.own_body is not None else self.node.body
        return substitute_index(own, dict(zip(self.node.vars, index)))

    @property
    def body(self) -> Expr:
        """The inlined body in kernel variables (recomputed when ``own_body`` or ``var_map`` is
        replaced; neither is changed in place)."""
        own = self.own_body if self.own_body is not None else self.node.body
        memo = self._body_memo
        if memo is None or memo[0] is not own or memo[1] is not self.var_map:
            memo = self._body_memo = (own, self.var_map, substitute_index(own, self.var_map))
        return memo[2]

    @property
    def index(self) -> tuple[IndexEntry, ...]:
        """A scatter's destination index in kernel variables (gathered entries inlined)."""
        own = self.own_index if self.own_index is not None else self.node.index
        return tuple(substitute_index(e, self.var_map) if isinstance(e, Expr)
                     else simplify_index(sympy.sympify(e).xreplace(self.var_map)) for e in own)

    @property
    def mask(self) -> Expr | None:
        """A scatter's condition in kernel variables (None: every point adds)."""
        own = self.own_mask if self.own_mask is not None else getattr(self.node, "mask", None)
        return substitute_index(own, self.var_map) if own is not None else None

    @property
    def exprs(self) -> list[Expr]:
        """Every expression the member evaluates, in kernel variables: its body, and a scatter's
        mask and gathered index entries."""
        if not isinstance(self.node, ScatterAdd):
            return [self.body]
        mask = self.mask
        return [self.body, *([mask] if mask is not None else []), *(e for e in self.index if isinstance(e, Expr))]


@dataclass(eq=False)
class FusedKernel:
    name: str
    x_ranges: Shape
    r_ranges: Shape = ()
    members: list[KernelMember] = field(default_factory=list)
    inlined_origins: list[str] = field(default_factory=list)  # ATen ops recomputed inside

    @property
    def kind(self) -> str:
        if any(isinstance(m.node, ScatterAdd) for m in self.members):
            return "scatter"
        return "reduction" if self.r_ranges else "pointwise"

    @property
    def device(self) -> torch.device:
        """Where the kernel runs: all its members are on one device (the scheduler's rule)."""
        return self.members[0].node.device

    @property
    def x_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(len(self.x_ranges), "x")

    @property
    def r_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(len(self.r_ranges), "r")

    def member(self, name: str) -> KernelMember | None:
        for member in self.members:
            if member.node.name == name:
                return member
        return None

    @property
    def node_names(self) -> list[str]:
        return [m.node.name for m in self.members]

    @property
    def origins(self) -> list[str]:
        """The ATen ops this kernel runs (stored members and inlined producers)."""
        names = [m.node.origin for m in self.members] + list(self.inlined_origins)
        return list(dict.fromkeys(n for n in names if n))


@dataclass(eq=False)
class ExternKernel:
    node: Extern

    @property
    def name(self) -> str:
        return self.node.name

    kind = "extern"


ScheduledItem = Union[FusedKernel, ExternKernel]
