"""What the scheduler hands to codegen: fused kernels, and externs in execution order.

A ``FusedKernel`` iterates over ``x_ranges`` (its rows, or all points of a pointwise
kernel) and, for reductions, ``r_ranges``. Each member node is placed in that space by a
``var_map`` from the node's own index variables to kernel variables ``x*`` and ``r*``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import sympy
import torch

from torchfuse.ir.expr import Expr, substitute_index
from torchfuse.ir.graph import Extern, Pointwise, Reduction, Shape
from torchfuse.ir.symbols import index_vars


@dataclass(eq=False)
class KernelMember:
    node: Union[Pointwise, Reduction]
    var_map: dict[sympy.Symbol, sympy.Expr]
    # "reduction", "row" (pointwise over the kept dims) or "full" (pointwise over rows x r).
    role: str
    stored: bool = True  # False when every reader is inside this kernel
    own_body: Expr | None = None  # the body with producers inlined, in the node's own variables

    def body_at(self, index) -> Expr:
        """The inlined body read at ``index`` (how kernel-mates recompute a pointwise member)."""
        own = self.own_body if self.own_body is not None else self.node.body
        return substitute_index(own, dict(zip(self.node.vars, index)))

    @property
    def body(self) -> Expr:
        """The inlined body in kernel variables."""
        return substitute_index(self.own_body if self.own_body is not None else self.node.body, self.var_map)


@dataclass(eq=False)
class FusedKernel:
    name: str
    x_ranges: Shape
    r_ranges: Shape = ()
    members: list[KernelMember] = field(default_factory=list)
    inlined_origins: list[str] = field(default_factory=list)  # ATen ops recomputed inside

    @property
    def kind(self) -> str:
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
