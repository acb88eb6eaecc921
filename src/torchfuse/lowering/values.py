"""What a lowering rule sees for each tensor argument: a view of a buffer.

A ``TensorValue`` says "element ``(i0, i1, ...)`` of this tensor is element
``index_map(i0, i1, ...)`` of buffer ``buffer``". Elementwise rules create a new node (and
so a new buffer) and return its identity view; view rules only compose index maps. The
scheduler later decides which node buffers are really stored and which are recomputed
inside their consumers.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from torchfuse.ir.expr import Load
from torchfuse.ir.graph import Shape
from torchfuse.ir.symbols import index_vars, simplify_index


@dataclass(frozen=True)
class TensorValue:
    buffer: str
    shape: Shape
    dtype: torch.dtype
    device: torch.device
    index_map: tuple[sympy.Expr, ...]  # over index_vars(rank), one entry per buffer dim

    @staticmethod
    def of_buffer(name: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> "TensorValue":
        return TensorValue(name, tuple(shape), dtype, device, index_vars(len(shape)))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def vars(self) -> tuple[sympy.Symbol, ...]:
        return index_vars(self.rank)

    def load(self, index) -> Load:
        """The expression reading this tensor at ``index`` (one sympy entry per dim)."""
        mapping = dict(zip(self.vars, index))
        mapped = tuple(simplify_index(sympy.sympify(e).xreplace(mapping)) for e in self.index_map)
        return Load(self.dtype, self.buffer, mapped)

    def view(self, shape: Shape, index_of_new) -> "TensorValue":
        """A new view: ``index_of_new`` gives this tensor's index for each new-view index."""
        new_vars = index_vars(len(shape))
        old_index = index_of_new(new_vars)
        mapping = dict(zip(self.vars, old_index))
        composed = tuple(simplify_index(sympy.sympify(e).xreplace(mapping)) for e in self.index_map)
        return TensorValue(self.buffer, tuple(shape), self.dtype, self.device, composed)

    @property
    def is_identity(self) -> bool:
        """True when element i is buffer element i (the buffer may still be larger)."""
        return self.index_map == self.vars
