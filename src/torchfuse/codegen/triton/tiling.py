"""Which way a reduction's tile walks memory: along the reduced axis (inner) or the kept one (outer).

A reduction tile is ``[XBLOCK, RBLOCK]``: XBLOCK rows (outputs), RBLOCK reduced elements of
each. Triton's default layout gives neighbouring lanes of a warp neighbouring elements of the
tile's last axis. When the reduced axis is contiguous in memory (a row sum, layer norm) that
is RBLOCK, and the tile is right as it is: *inner*. When it is not (a column sum, a bias
gradient ``grad.sum(0)``, channels-last batch-norm statistics over N*H*W) the contiguous axis
is a kept one: lanes walking r would each read an element ``C`` apart, one 32-byte sector per
lane. Those kernels are *outer*: the tile is ``[RBLOCK, XBLOCK]`` with the rows along the
last axis, the rows are ordered so the unit-stride one is innermost in ``xindex``, and the
reduction runs over axis 0. Both read the same elements; only which lanes read them changes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Sequence

import sympy

from torchfuse.ir.expr import Expr, Load, loads
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import linear_coefficients, simplify_index
from torchfuse.scheduler.kernel import FusedKernel

# Grids aim at two programs per SM of an H100/H200 (132 SMs): a kernel with fewer programs than
# SMs leaves the GPU idle (runtime/launch.py shrinks blocks, split.py splits reductions).
MIN_PROGRAMS = 2 * 132
# Outer tiles keep at least 32 rows on the lanes (64 bytes of bf16: two 32-byte sectors).
OUTER_MIN_XBLOCK = 32


@dataclass(frozen=True)
class Access:
    """One direct (not gathered) memory access of a body: its offset in loop variables and how
    many elements its buffer has (the weight of its vote)."""

    offset: sympy.Expr
    weight: int


@dataclass(frozen=True)
class ReductionTiling:
    x_vars: list  # the rows, in the order they enter xindex (last = innermost)
    x_ranges: list
    outer: bool  # lanes walk the rows: tile [RBLOCK, XBLOCK], reduced over axis 0


def accesses(bodies: Iterable[Expr], buffers: dict[str, Buffer], r_vars: Sequence[sympy.Symbol]) -> list[Access]:
    """Direct loads in ``bodies`` whose index moves with a reduced variable: the large reads,
    each (buffer, offset) once however many bodies read it (a fused kernel reads it once)."""
    return accesses_of([load for body in bodies for load in loads(body)], buffers, r_vars)


def accesses_of(found_loads: Iterable[Load], buffers: dict[str, Buffer], r_vars: Sequence[sympy.Symbol]) -> list[Access]:
    """``accesses`` of these loads (buffers missing from ``buffers`` are not read: left out)."""
    found: dict[tuple[str, sympy.Expr], Access] = {}
    reduced, seen = frozenset(r_vars), set()
    for load in found_loads:
        if (load.buffer, load.index) in seen:  # a fused chain reads the same element many times
            continue
        seen.add((load.buffer, load.index))
        buffer = buffers.get(load.buffer)
        if buffer is None or load.is_indirect:
            continue
        offset = _relative_offset(buffer, load.index)
        if _symbols(offset) & reduced:
            found.setdefault((load.buffer, offset), Access(offset, _weight(buffer)))
    return list(found.values())


@functools.lru_cache(maxsize=1 << 16)
def _symbols(offset: sympy.Expr) -> frozenset:
    """``offset.free_symbols``, memoized: sympy walks the whole expression at every call (GPT-2's
    split votes asked 355,000 times, a third of its lowering)."""
    return frozenset(offset.free_symbols)


@functools.lru_cache(maxsize=1 << 16)
def _relative_offset(buffer: Buffer, index: tuple) -> sympy.Expr:
    """``buffer[index]``'s element offset from the buffer's start, simplified. Memoized: the split's
    orientation vote (split.py) reads the same loads for every reduction over the same rows, and
    GPT-2's 25 layer norms made 74,000 of these, 1 s of its compile."""
    return simplify_index(buffer.flat_offset(index) - buffer.offset)


@functools.lru_cache(maxsize=1 << 12)
def _weight(buffer: Buffer) -> int:
    try:
        return int(buffer.numel)
    except TypeError:  # symbolic: count it as large
        return 1 << 40


def is_outer(found: list[Access], x_vars: Sequence[sympy.Symbol], r_inner: sympy.Symbol | None) -> bool:
    """True when most of the large reads (by size) step by 1 along a row variable and not along
    the innermost reduced variable ``r_inner``."""
    inner, outer = orientation_votes(found, x_vars, r_inner)
    return outer > inner


def orientation_votes(found: list[Access], x_vars: Sequence[sympy.Symbol],
                      r_inner: sympy.Symbol | None) -> tuple[int, int]:
    """(inner, outer): the sizes of the large reads that step by 1 along ``r_inner``, and of
    those that step by 1 along a row variable instead."""
    inner = outer = 0
    variables = [*x_vars, r_inner] if r_inner is not None else list(x_vars)
    for access in found:
        steps = _steps(access.offset, tuple(variables))
        if steps is None:
            continue
        *x_coeffs, r_coeff = steps if r_inner is not None else (*steps, None)
        if r_coeff is not None and r_coeff == 1:
            inner += access.weight
        elif any(c == 1 for c in x_coeffs):
            outer += access.weight
    return inner, outer


@functools.lru_cache(maxsize=1 << 16)
def _steps(offset: sympy.Expr, variables: tuple[sympy.Symbol, ...]) -> tuple | None:
    """Each variable's step in ``offset`` (its coefficient, or ``_first_steps``), or None.
    Memoized: the split's vote (split.py) asks it for the same reads at every reduction over the
    same rows (1.9 of Swin's 15 s of compile under a profiler)."""
    coeffs = linear_coefficients(offset, variables)
    steps = coeffs[0] if coeffs is not None else _first_steps(offset, variables)
    return tuple(steps) if steps is not None else None


def _first_steps(offset: sympy.Expr, variables: Sequence[sympy.Symbol]) -> list | None:
    """For an offset with div/mod (a view merged or split by a split reduction's chunks), the
    step of each variable from 0 to 1 with the others at 0: whether the first neighbours are
    adjacent in memory, which is what coalescing needs. None when a step is not a number."""
    origin = offset.subs({v: 0 for v in variables})
    steps = []
    for var in variables:
        step = sympy.simplify(offset.subs({v: (1 if v is var else 0) for v in variables}) - origin)
        if not step.is_number:
            return None
        steps.append(step)
    return steps


def unit_row_last(found: list[Access], x_vars: list, x_ranges: list) -> tuple[list, list]:
    """The rows ordered for the heaviest read with a unit-stride row: that row innermost in
    xindex, the others by stride, largest first; unchanged when the strides are not numeric."""
    candidates = []
    for access in found:
        coeffs = linear_coefficients(access.offset, x_vars)
        if coeffs is not None and any(c == 1 for c in coeffs[0]):
            candidates.append((access.weight, coeffs[0]))
    if not candidates or len(x_vars) < 2:
        return x_vars, x_ranges
    _, coeffs = max(candidates, key=lambda c: c[0])
    if not all(sympy.sympify(c).is_number for c in coeffs):
        return x_vars, x_ranges
    # Unit stride last; a row this read does not move with (stride 0) goes outside it.
    order = sorted(range(len(x_vars)), key=lambda i: (coeffs[i] == 1, -int(coeffs[i])))
    return [x_vars[i] for i in order], [x_ranges[i] for i in order]


def reduction_tiling(kernel: FusedKernel, buffers: dict[str, Buffer]) -> ReductionTiling:
    """The tile orientation and row order of a reduction kernel, from the reads of its
    reduction and full-size members (producers inlined)."""
    x_vars, x_ranges = list(kernel.x_vars), list(kernel.x_ranges)
    r_vars = list(kernel.r_vars)
    bodies = [m.body for m in kernel.members if m.role in ("reduction", "full")]
    # A member's own output, read by a kernel-mate, is recomputed or kept in registers, not
    # read from memory; its nominal (row-major) layout must not vote.
    members = {m.node.name for m in kernel.members}
    found = accesses(bodies, {name: b for name, b in buffers.items() if name not in members}, r_vars)
    if not r_vars or not is_outer(found, x_vars, r_vars[-1]):
        return ReductionTiling(x_vars, x_ranges, False)
    x_vars, x_ranges = unit_row_last(found, x_vars, x_ranges)
    return ReductionTiling(x_vars, x_ranges, True)
