"""Lane-uniform row chunks in outer reductions: values of a whole chunk of rows loaded once.

An outer reduction's rows enter ``xindex`` row-major, the unit-stride row innermost
(``tiling.py``). With two or more rows, ``xindex = chunk * C + lane``, where ``C`` is the size
of the innermost rows: a split's first stage (``split.py``: chunk ``s`` of ``S`` over ``C``
outputs), a channels-last batch norm over ``N`` and ``C``, T5's position-bias gradient (a sum
over the batch of ``[H, Q, K]`` scores: ``C`` is K). Reads indexed by the chunk alone are
per-row values of the reduced data: a layer norm's mean and rstd in its weight gradient (one
per token, for all ``C`` channels of it), a softmax's max and sum per query. Written with
``xindex // C`` they are loaded and their address computed at every element of the tile;
Swin's patch-embedding weight gradients did that for six statistics and a window-partition
gather of five divisions, and ran at 3x the SASS count's bounds (H100, 2026-12-07).

When ``C % XBLOCK == 0`` every lane of a program is in one chunk, so the kernel names it
once: ``xchunk`` is the program's scalar, ``xlane`` the lanes' offset in it, and a read
indexed by ``xchunk`` and ``rindex`` is a ``[RBLOCK, 1]`` column (its mask ``xcmask`` a
``[1, 1]`` block, true on every program of the grid). Otherwise (a block size that straddles
chunks) the same names are ``xindex // C`` and ``xindex % C``, as before. The test is on
constexprs, so Triton compiles one branch. Coarser rows (``xindex // M`` with ``M`` a multiple
of ``C``) become ``xchunk // (M / C)``, finer lanes (``xindex % M``, ``M`` dividing ``C``)
``xlane % M``.

``C`` is the smallest product of innermost row sizes that is a static multiple of
``MIN_CHUNK_LANES``; such kernels launch with an ``XBLOCK`` that divides ``C``
(``TritonKernel.chunk_lanes``; the launcher's default, ``launch_configs.align_to_chunks``):
fewer lanes than that would read a row's elements in part-used 32-byte sectors (16 bytes of
bfloat16 at 8 lanes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from torchfuse.codegen.triton.tiling import OUTER_MIN_XBLOCK
from torchfuse.ir.symbols import FloorDiv, ModIndex, product

XCHUNK = sympy.Symbol("xchunk", integer=True, nonnegative=True)
XLANE = sympy.Symbol("xlane", integer=True, nonnegative=True)
CHUNK_MASK = "xcmask"  # the mask of a read indexed by the chunk (expressions.LOOP_KEYS: "c")
MIN_CHUNK_LANES = OUTER_MIN_XBLOCK  # 64 bytes of bfloat16 a row


@dataclass
class RowChunks:
    """An outer reduction's rows as ``chunk * lanes + lane`` (``lanes`` a static size)."""

    xindex: sympy.Symbol
    lanes: int
    names: set[str] = field(default_factory=set)  # of XCHUNK and XLANE, those a rewritten index used

    @property
    def chunked(self) -> bool:
        """Whether a read is indexed by the chunk (else the kernel stays as it was)."""
        return XCHUNK.name in self.names

    def rewrite(self, index: sympy.Expr) -> sympy.Expr:
        """``index`` with ``xindex // lanes`` as ``xchunk`` and ``xindex % lanes`` as ``xlane``
        (and coarser divisions, finer remainders, through them)."""
        rewritten = index.replace(self._of_xindex, self._through_chunk)
        self.names |= {s.name for s in rewritten.free_symbols} & {XCHUNK.name, XLANE.name}
        return rewritten

    def _of_xindex(self, expr: sympy.Expr) -> bool:
        return isinstance(expr, (FloorDiv, ModIndex)) and expr.args[0] == self.xindex and expr.args[1].is_Integer

    def _through_chunk(self, expr: sympy.Expr) -> sympy.Expr:
        divisor = int(expr.args[1])
        if isinstance(expr, FloorDiv) and divisor % self.lanes == 0:
            return FloorDiv(XCHUNK, divisor // self.lanes)
        if isinstance(expr, ModIndex) and self.lanes % divisor == 0:
            return ModIndex(XLANE, divisor)
        return expr

    def prologue(self, pid: str, suffix: str) -> list[str]:
        """The lines that define the names used, after ``xmask``'s (``suffix``: how a range of
        rows enters the tile): ``xlane`` alone is ``xindex % lanes``, as it was."""
        lanes = self.lanes
        if not self.chunked:
            return [f"xlane = xindex % {lanes}"] if self.names else []
        return [f"if {lanes} % XBLOCK == 0:  # every lane of this program is in one chunk of rows",
                f"    xchunk = ({pid} * XBLOCK) // {lanes}",
                f"    xlane = ({pid} * XBLOCK) % {lanes} + tl.arange(0, XBLOCK){suffix}",
                # [1, 1], not a scalar: Triton's interpreter (3.6) makes a scalar & a block
                # an int32 mask, which its loads refuse.
                f"    {CHUNK_MASK} = {pid} * XBLOCK + tl.full([1, 1], 0, tl.int32) < xnumel",
                "else:",
                f"    xchunk = xindex // {lanes}",
                f"    xlane = xindex % {lanes}",
                f"    {CHUNK_MASK} = xmask"]


def row_chunks(xindex: sympy.Symbol, outer: bool, x_ranges: list) -> RowChunks | None:
    """The chunks of an outer reduction with two or more rows: the fewest innermost rows whose
    static size is a multiple of MIN_CHUNK_LANES, below all of them; None for other kernels."""
    if not outer:
        return None
    for first in range(len(x_ranges) - 1, 0, -1):
        lanes = sympy.sympify(product(x_ranges[first:]))
        if not lanes.is_Integer:
            return None
        if int(lanes) % MIN_CHUNK_LANES == 0:
            chunks = sympy.sympify(product(x_ranges[:first]))
            return RowChunks(xindex, int(lanes)) if chunks != 1 else None
    return None
