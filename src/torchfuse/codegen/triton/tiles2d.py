"""2-D tiles for pointwise kernels whose large reads and their store disagree on the contiguous axis.

A pointwise kernel walks one flat ``xindex`` with its store's unit-stride row innermost
(``codegen/layout.py``), so neighbouring lanes of a warp store neighbouring elements. A large
read laid out differently (``x.t() + y``, NCHW <-> NHWC copies, ``k.transpose(-1, -2)
.contiguous()``) is then read with a large stride between lanes: each lane touches its own
32-byte sector for 2-4 useful bytes. Such a kernel is tiled ``[YBLOCK, XBLOCK]`` instead:

- axis 1 (``xindex``, *X*) walks the store's unit-stride row and the rows that continue its
  contiguous run in the store;
- axis 0 (``yindex``, *Y*) walks the read's unit-stride row and the rows continuing that run
  in the read;
- the remaining rows (*Z*, a batch dim) are one scalar per program (``zindex``), so a tile
  never straddles them and both runs stay plain ``xindex`` / ``yindex`` arithmetic.

Each access is then unit-stride along one tile axis. On a GPU Triton's coalescing pass gives
every ``tl.load``/``tl.store`` its own blocked layout, ordered by the contiguity its axis
analysis finds in the pointer (the read's along axis 0, the store's along axis 1), and converts
values between layouts through shared memory; both sides move whole sectors. Only static
sizes with numeric strides are tiled; anything else keeps the 1-D form.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from torchfuse.ir.expr import Expr, Load, loads
from torchfuse.ir.graph import Buffer, Reduction
from torchfuse.ir.symbols import linear_coefficients, product, simplify_index
from torchfuse.scheduler.kernel import FusedKernel

# Both runs must be at least this long to tile: below it the 1-D kernel's strided read touches
# at most 16 regions per warp, and a tile side this short would waste most of its lanes.
MIN_RUN = 16


@dataclass(frozen=True)
class Tile2D:
    """Which kernel rows go where in a ``[YBLOCK, XBLOCK]`` tile (each group outer to inner)."""

    z_vars: tuple[sympy.Symbol, ...]  # one point per program: outside the tile
    z_ranges: tuple[int, ...]
    y_vars: tuple[sympy.Symbol, ...]  # axis 0: the large read's contiguous run
    y_ranges: tuple[int, ...]
    x_vars: tuple[sympy.Symbol, ...]  # axis 1: the store's contiguous run
    x_ranges: tuple[int, ...]

    @property
    def numels(self) -> tuple[int, int, int]:
        """(Z, Y, X): programs per tile position, and the extent of each tile axis."""
        return (int(product(self.z_ranges)), int(product(self.y_ranges)), int(product(self.x_ranges)))


def pointwise_tile(kernel: FusedKernel, buffers: dict[str, Buffer], store_offset: sympy.Expr | None) -> Tile2D | None:
    """The 2-D tiling of a pointwise kernel whose heaviest strided read has another unit-stride
    row than its first store (offset ``store_offset``, in kernel variables), or None when the
    1-D form already reads and writes contiguously (or the sizes are not static)."""
    ranges = _static_ranges(kernel)
    if store_offset is None or ranges is None or len(ranges) < 2 or 0 in ranges.values():
        return None
    variables = list(kernel.x_vars)
    store = _coefficients(store_offset, variables)
    if store is None:
        return None
    lane = _unit_row(store, ranges)
    if lane is None:
        return None
    read = _strided_read(kernel, buffers, variables, lane, ranges)
    if read is None:
        return None
    y_vars = _run(read, ranges, _unit_row(read, ranges), exclude={lane})
    x_vars = _run(store, ranges, lane, exclude=set(y_vars))
    if product(ranges[v] for v in y_vars) < MIN_RUN or product(ranges[v] for v in x_vars) < MIN_RUN:
        return None
    # The rest in the store's order, outer first (by stride, as codegen/layout.py orders rows).
    z_vars = sorted((v for v in variables if v not in x_vars and v not in y_vars), key=lambda v: -store[v])
    return Tile2D(tuple(z_vars), tuple(ranges[v] for v in z_vars), tuple(y_vars), tuple(ranges[v] for v in y_vars),
                  tuple(x_vars), tuple(ranges[v] for v in x_vars))


def _static_ranges(kernel: FusedKernel) -> dict[sympy.Symbol, int] | None:
    ranges = {}
    for var, size in zip(kernel.x_vars, kernel.x_ranges):
        size = sympy.sympify(size)
        if not size.is_Integer:
            return None  # symbolic sizes: the launcher could not size the tile ahead
        ranges[var] = int(size)
    return ranges


def _coefficients(offset: sympy.Expr, variables: list) -> dict[sympy.Symbol, int] | None:
    """Each variable's stride in ``offset``, or None unless it is affine with numeric strides."""
    found = linear_coefficients(sympy.expand(offset), variables)
    if found is None or not all(sympy.sympify(c).is_Integer for c in found[0]):
        return None
    return {v: int(c) for v, c in zip(variables, found[0])}


def _unit_row(strides: dict[sympy.Symbol, int], ranges: dict[sympy.Symbol, int]) -> sympy.Symbol | None:
    """The row along which an access steps by one element (a row of size 1 moves nothing)."""
    for var, stride in strides.items():
        if stride == 1 and ranges[var] > 1:
            return var
    return None


def _run(strides: dict[sympy.Symbol, int], ranges: dict[sympy.Symbol, int], unit: sympy.Symbol,
         exclude: set) -> list[sympy.Symbol]:
    """``unit`` and the rows continuing its contiguous run in this access (a row whose stride is
    the run's length so far), outer first, leaving out ``exclude``."""
    run, length = [unit], ranges[unit]
    while True:
        follower = next((v for v, s in strides.items()
                         if v not in run and v not in exclude and ranges[v] > 1 and s == length), None)
        if follower is None:
            return run
        run.insert(0, follower)
        length *= ranges[follower]


def _strided_read(kernel: FusedKernel, buffers: dict[str, Buffer], variables: list, lane: sympy.Symbol,
                  ranges: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, int] | None:
    """The strides of the heaviest large direct read that moves along the store's unit row
    ``lane`` by more than one element and has a unit-stride row of its own, or None."""
    numel = int(product(ranges.values()))
    best, best_weight = None, 0
    for buffer, offset in _reads(kernel, buffers):
        weight = int(buffer.numel) if sympy.sympify(buffer.numel).is_Integer else 0
        if weight * 4 < numel or weight <= best_weight:
            continue  # small reads are broadcast and stay in cache
        strides = _coefficients(offset, variables)
        if strides is None or strides[lane] in (0, 1) or _unit_row(strides, ranges) is None:
            continue  # contiguous or broadcast along the lanes already, or no unit row to walk
        best, best_weight = strides, weight
    return best


def _reads(kernel: FusedKernel, buffers: dict[str, Buffer]) -> list[tuple[Buffer, sympy.Expr]]:
    """(buffer, offset in kernel variables) of every direct memory read of the stored members,
    with reads of in-kernel members followed to what they recompute."""
    members = {m.node.name: m for m in kernel.members}
    found: list[tuple[Buffer, sympy.Expr]] = []
    pending: list[Expr] = [m.body for m in kernel.members if m.stored]
    followed: set[Load] = set()  # each member read once: a chain of members read twice stays linear
    while pending:
        for load in loads(pending.pop()):
            member = members.get(load.buffer)
            if member is not None and not isinstance(member.node, Reduction):
                if not load.is_indirect and load not in followed:
                    followed.add(load)
                    pending.append(member.body_at(load.index))
                continue
            buffer = buffers.get(load.buffer)
            if buffer is not None and not load.is_indirect:
                found.append((buffer, simplify_index(buffer.flat_offset(load.index) - buffer.offset)))
    return found
