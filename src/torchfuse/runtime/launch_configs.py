"""The default launch config of every generated Triton kernel: its grid, block sizes, warps and
row-loop stages, from the launch's sizes (the tile policy; ``launch.py`` launches with them).

Each constant below carries the measurement that chose it. ``mode="max-autotune"`` times a few
neighbours of these defaults (``autotune_configs.py``); ``scripts/ab_policy.py`` replaces a
constant of this module per variant to compare policies on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from torchfuse.codegen.triton.kernel import LOOP_STAGES_PARAM, TRANSCENDENTAL_STEP
from torchfuse.codegen.triton.tiling import MIN_PROGRAMS, OUTER_MIN_XBLOCK

MAX_POINTWISE_BLOCK = 1024
MAX_PERSISTENT_TILE = 4096  # elements of one [XBLOCK, RBLOCK] tile held in registers
LOOPED_RBLOCK = 1024
# Warps and tiles from what Triton does with them (scripts/sweep_configs.py on the H200, bf16):
# Triton gives a [1, RBLOCK] load (a norm's weight, read once a program) its own layout, one
# element a thread once warps * 32 * 8 > RBLOCK, and moves it into the tile's layout through
# shared memory with barriers. Short rows therefore take one warp per 256 elements of a row and
# ~1024 elements a warp: ConvNeXt's LayerNorm over 200704 rows of 192 took 268 us with [16 x 256]
# and 8 warps, 48 us with [4 x 256] and one warp; a softmax over rows of 49 637 us with [64 x 64],
# 8 warps, 364 us with [16 x 64], one warp (305 us with [8 x 64]). Longer rows keep 8 warps.
SHORT_ROW_RBLOCK = 512
SHORT_ROW_WARP_TILE = 1024
# Looped rows with rows enough to fill the GPU: one row a program, 2048 of it a step, 8 warps.
# On the H100 (scripts/ab_policy.py, 2026-12-07) against [4 x 512]: a layer norm over [8192,
# 16384] bf16, which reads each row several times, 332 -> 224 us (a program's row, 32 KB, is
# still in L2 when it reads it again; four rows were 128 KB; measured with its statistics in
# one loop, a form since reverted: two loops took 345 us at [4 x 512]); the cross-entropy
# forward over [4096, 50257] 385 -> 363 us. ([2 x 1024] 301, [1 x 1024] 259 on the layer norm.
# An earlier [1 x 1024] with 4 warps had lost to [4 x 512] on a cross-entropy backward, H200.)
LOOPED_ROWS_TILE = (1, 2048)
# Steps of a looped reduction's row in flight (``Config.num_stages``; more than 1: the loads of
# later steps go to shared memory by asynchronous copies while this one computes). 1 (a plain
# loop) by default: on the H100 (2026-12-07, ab_policy.py) 3 stages took a layer norm over
# [8192, 16384] from 278 to 227 us but the two-loop batch-norm statistics from 138 to 160 us, at
# the same tiles; with 2 warps and [64 x 64] the statistics reached 122 us against 140 at the
# default. Stages change which tile is best, so max-autotune times them with their tiles.
DEFAULT_LOOP_STAGES = 1
# Outer reductions (codegen/triton/tiling.py): lanes walk the rows. 128 rows of bf16 are 256
# contiguous bytes per reduced index; XBLOCK shrinks to OUTER_MIN_XBLOCK to reach MIN_PROGRAMS.
# A looped tile holds OUTER_TILE elements, or FEW_PROGRAMS_TILE when the grid is still smaller
# than MIN_PROGRAMS at the fewest lanes: those few programs take fewer, longer steps. (4096 for
# every grid, measured on the H200: a column sum 63 -> 58 us, channels-last batch-norm
# statistics 63 -> 93 us.)
OUTER_XBLOCK, OUTER_TILE, FEW_PROGRAMS_TILE = 128, 2048, 4096
# A looped outer program has one tile of loads in flight at a time, so a grid of a few programs
# an SM is bound by memory latency, not bandwidth: bytes in flight ~ programs x tile bytes, and
# ~1 us of latency makes 4 KB tiles at 2-3 programs an SM ~1.2 TB/s (EfficientNet's squeeze-
# excite pools on the H200: 288 and 384 programs of [64 x 32] / [32 x 64] bf16 tiles, 1.0-1.2
# TB/s). Grids under 2 x MIN_PROGRAMS take tiles of IN_FLIGHT_ELEMENTS / grid, up to MAX_OUTER_TILE.
IN_FLIGHT_ELEMENTS, MAX_OUTER_TILE = 1 << 21, 8192
# Those tiles suit a step of one load and one accumulator. A heavy step, holding many tiles at
# once (``TritonKernel.live_tiles``: its accumulators and its loads that vary along both axes),
# spills or runs one program an SM at that size: the tile shrinks to about HEAVY_STEP_ELEMENTS
# over all its live tiles, not below HEAVY_MIN_TILE, keeping HEAVY_MIN_RBLOCK reduced rows (the
# lanes give way first), with a warp per 128 elements. Measured on the H100
# (scripts/time_kernels.py, Swin-T training): two LayerNorms' weight and bias gradients (4
# accumulators, 7 loads) 240 -> 79 us at [64 x 8], 4 warps, instead of [128 x 64], 8 warps (255
# registers, spilling); the relative-position bias gradient sums (1 accumulator, 5-6 loads) 174
# -> 75 and 147 -> 67 us; T5's persistent bias-gradient sum over a batch of 16 (7 live tiles)
# 340 -> 280 us at [32 x 16], 1 warp (a persistent tile takes a warp per 512 elements). Steps of
# one or two tiles keep the tiles above. 8192 rather than 4096 elements over the live tiles,
# measured on the H100 (scripts/ab_policy.py, 2026-12-07): an RMSNorm weight gradient (4 live
# tiles) 198 -> 154 us; the channels-last batch-norm backward's split first stages (5 live
# tiles) over 16 channels 120 / 103 -> 75 / 59 us and over 64 channels 253 / 205 -> 188 / 122;
# the one-program second stage of batch-norm statistics over 24 channels (7 live tiles) 42 ->
# 24 us. A first stage of batch-norm statistics over 256 channels lost, 41 -> 47 us (measured
# in a one-loop form since reverted, 5 live tiles). 16384 went too far (RMSNorm: 277 us).
# Persistent steps keep 4096, where T5's sum was measured; 8192 is unmeasured there.
HEAVY_STEP_ELEMENTS, HEAVY_MIN_TILE, HEAVY_MIN_RBLOCK = 8192, 512, 8
HEAVY_PERSISTENT_ELEMENTS = 4096
# A heavy looped step computing transcendental functions of each element (kernel.TRANSCENDENTAL_STEP:
# Swin's relative-position bias gradients recompute a softmax, exp and a division an element,
# under 7 live tiles) keeps the 4096 measured first: on the H100 (scripts/time_kernels.py,
# 2026-12-07, ninth session) 8192 gave it [128 x 8] with 8 warps, 142.3 us, where 4096 gives
# [64 x 8] with 4 warps, 70.6 us, the best of 108 configs (the sixth session measured 75 and 67
# us for the two such kernels at 4096). The steps 8192 was measured on have no such functions.
HEAVY_TRANSCENDENTAL_ELEMENTS = 4096
# The grid a looped outer reduction of a light step (one or two live tiles) shrinks its lanes to
# fill (down to OUTER_MIN_XBLOCK): three programs an SM, not two. Measured on the H100
# (scripts/ab_policy.py, 2026-12-07): EfficientNet's squeeze-excite pool over [128, 144, 56, 56]
# channels-last (288 programs of [64 x 128] -> 576 of [32 x 64]) 101 -> 68 us, where splitting
# it into chunks (1152 programs) took 73. Filling to four an SM gained nothing where the grid
# had 512 programs already (a column sum 47.7 -> 48.7 us), and heavy steps lost or stayed:
# RMSNorm's weight gradient 512 -> 1024 programs 153 -> 214 us, batch-norm statistics and
# backward over 64 channels level. Heavy steps keep MIN_PROGRAMS.
LOOPED_OUTER_MIN_PROGRAMS = 3 * MIN_PROGRAMS // 2
# A light looped outer step that computes special functions of each element (a squeeze-excite
# pool over a BN + SiLU: two MUFU instructions and two roundings an element) is bound by that
# arithmetic's latency, not by bytes in flight: it wants many small programs. Measured on the
# H100 (scripts/time_kernels.py, 2026-12-07, EfficientNet-B0's pools, 60 configs each):
# [XBLOCK 16 x RBLOCK 64], 8 warps, is within 2% of the best of each: 113.5 -> 81.0 us (576
# programs of [32 x 64] before), 66.9 -> 57.7 (384 of [32 x 256]), 76.0 -> 70.1 (512 of
# [128 x 32]). Steps without them keep the tiles above (batch-norm statistics: 140 us at its
# [64 x 16], 135 at the best), and so do short steps: a pool over a SiLU alone lost at this
# tile, 65.3 -> 70.2 us (kernel.SPECIAL_STEP_MIN_OPS). 16 bf16 lanes are a 32-byte sector.
SPECIAL_STEP_TILE = (16, 64)  # (XBLOCK, RBLOCK)
# A looped outer step that neither SPECIAL_STEP_TILE nor the heavy-step rule shrinks (one or
# two live tiles, or a few whose tile fits HEAVY_STEP_ELEMENTS), on a grid of MIN_PROGRAMS or
# more, with its row loop pipelined: (warps, stages), half the tile's reduced rows; None: the
# tiles above with a plain loop. Measured on the H100 (scripts/time_kernels.py, 2026-12-07,
# ninth session), four of MobileNetV3 training's batch-norm + hard-swish backward sums (4 live
# tiles): [128 x 8] with 2 warps and 3 stages against the default [128 x 16] with 8 warps and a
# plain loop, 58.0 -> 40.2 us (97 MB), 43.9 -> 37.2 (102 MB), 36.1 -> 27.9 (68 MB), 35.4 ->
# 28.0 (73 MB): each within 3% of the best of 120 configs. With 3 stages the loads of two later
# steps are in flight while one computes, so a smaller tile and fewer warps keep as many bytes
# moving.
LIGHT_OUTER_PIPELINE: tuple[int, int] | None = (2, 3)
SMALL_KERNEL = 1 << 16  # elements
# 2-D tiled pointwise kernels (codegen/triton/tiles2d.py): tiles of up to 64 x 64, each side
# kept at 32 or more when shrinking to fill the GPU (a warp's 32 lanes along either run).
TILE_SIDE, TILE_MIN_SIDE = 64, 32
# Kernels over one flat xindex, launched with pointwise_config. A "scatter" adds into its output
# with atomics: each launch adds again, so it must never be launched twice for one call (to
# time block sizes, say) on live buffers.
FLAT_KINDS = frozenset({"pointwise", "scatter"})


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Config:
    """One launch's grid and compile-time block sizes."""

    grid: int
    constexprs: tuple[int, ...]  # XBLOCK (and RBLOCK), in the kernel's parameter order
    num_warps: int
    # A looped reduction's row-loop stages, its LOOP_STAGES parameter (codegen/triton/kernel.py);
    # None: DEFAULT_LOOP_STAGES. Kernels without a row loop have no such parameter.
    num_stages: int | None = None
    names: tuple[str, ...] = ("XBLOCK", "RBLOCK")  # of the constexprs (a 2-D tile: YBLOCK, XBLOCK)

    def blocks(self) -> dict[str, int]:
        """The block sizes by parameter name."""
        return dict(zip(self.names, self.constexprs))

    def kernel_constexprs(self, looped: bool) -> dict[str, int]:
        """The kernel's constexpr arguments by name, in its parameter order: the block sizes, and
        for a kernel with a row loop (``looped``) its stages."""
        values = self.blocks()
        if looped:
            values[LOOP_STAGES_PARAM] = self.num_stages or DEFAULT_LOOP_STAGES
        return values

    def launch_options(self) -> dict[str, int]:
        """The compile options a launch with this config passes to Triton."""
        return {"num_warps": self.num_warps}


def has_row_loop(fn: Any) -> bool:
    """Whether ``fn`` (a generated kernel) takes its row loop's stages (``LOOP_STAGES_PARAM``)."""
    return LOOP_STAGES_PARAM in getattr(fn, "arg_names", ())


def pointwise_config(xnumel: int) -> Config:
    block = min(MAX_POINTWISE_BLOCK, max(16, next_power_of_2(xnumel)))
    return Config(cdiv(xnumel, block), (block,), 4 if block >= 256 else 2)


def tile_config(znumel: int, ynumel: int, xnumel: int) -> Config:
    """Grid and (YBLOCK, XBLOCK) of a 2-D tiled pointwise kernel: ``znumel`` tile positions of a
    ``ynumel`` x ``xnumel`` plane, one program per tile, shrunk like the other kernels while the
    grid has fewer than MIN_PROGRAMS programs."""
    yblock = min(TILE_SIDE, max(16, next_power_of_2(ynumel)))
    xblock = min(TILE_SIDE, max(16, next_power_of_2(xnumel)))

    def grid() -> int:
        return znumel * cdiv(ynumel, yblock) * cdiv(xnumel, xblock)

    if znumel * ynumel * xnumel >= SMALL_KERNEL:
        while grid() < MIN_PROGRAMS and max(yblock, xblock) > TILE_MIN_SIDE:
            if yblock >= xblock:
                yblock //= 2
            else:
                xblock //= 2
    return Config(grid(), (yblock, xblock), 8 if yblock * xblock >= 4096 else 4, names=("YBLOCK", "XBLOCK"))


def reduction_config(persistent: bool, xnumel: int, rnumel: int, outer: bool = False,
                     live_tiles: int = 0, special_step: int = 0, chunk_lanes: int = 0) -> Config:
    """Grid and (XBLOCK, RBLOCK) of a reduction: ``outer`` tiles are [RBLOCK, XBLOCK] with the
    lanes along the rows; inner ones [XBLOCK, RBLOCK], a whole row (persistent) or RBLOCK of
    it at a time (looped). ``live_tiles``: the tiles one step holds (0: unknown, taken as few);
    ``special_step``: a looped step computes special functions of each element (kernel.SPECIAL_STEP
    or TRANSCENDENTAL_STEP; 0: none); ``chunk_lanes``: XBLOCK must divide it (``align_to_chunks``)."""
    if outer:
        config = _outer_config(persistent, xnumel, rnumel, live_tiles, special_step)
        return align_to_chunks(config, chunk_lanes, xnumel, rnumel, persistent)
    if persistent:
        rblock = max(2, next_power_of_2(rnumel))
        if rblock <= SHORT_ROW_RBLOCK:
            return _short_rows_config(xnumel, rnumel, rblock)
        xblock = max(1, min(next_power_of_2(xnumel), MAX_PERSISTENT_TILE // rblock, 64))
    elif rnumel >= LOOPED_RBLOCK and xnumel >= LOOPED_ROWS_TILE[0] * MIN_PROGRAMS:
        xblock, rblock = LOOPED_ROWS_TILE
    else:
        rblock = min(LOOPED_RBLOCK, max(2, next_power_of_2(rnumel)))
        # Rows shorter than a chunk (looped because their length is symbolic) share a program.
        xblock = max(1, min(next_power_of_2(xnumel), LOOPED_RBLOCK // rblock, 64))
    xblock = _fill_the_gpu(xnumel, rnumel, xblock, 1)
    return Config(cdiv(xnumel, xblock), (xblock, rblock), 8 if rblock * xblock >= 2048 else 4)


def _short_rows_config(xnumel: int, rnumel: int, rblock: int) -> Config:
    """A persistent reduction over rows of at most SHORT_ROW_RBLOCK: a warp per 256 elements of a
    row (so a row-invariant [1, RBLOCK] load keeps the tile's layout), about SHORT_ROW_WARP_TILE
    elements a warp (half that below 128: rows of 49 measured best at [8 x 64])."""
    warps = max(1, rblock // 256)
    per_warp = SHORT_ROW_WARP_TILE if rblock >= 128 else SHORT_ROW_WARP_TILE // 2
    xblock = max(1, min(next_power_of_2(xnumel), per_warp * warps // rblock))
    xblock = _fill_the_gpu(xnumel, rnumel, xblock, 1)
    return Config(cdiv(xnumel, xblock), (xblock, rblock), warps)


def _outer_config(persistent: bool, xnumel: int, rnumel: int, live_tiles: int, special_step: int = 0) -> Config:
    xblock = min(OUTER_XBLOCK, max(2, next_power_of_2(xnumel)))
    heavy_elements = HEAVY_STEP_ELEMENTS
    if persistent:
        heavy_elements = HEAVY_PERSISTENT_ELEMENTS
    elif special_step >= TRANSCENDENTAL_STEP:
        heavy_elements = HEAVY_TRANSCENDENTAL_ELEMENTS
    heavy_tile = _heavy_step_tile(live_tiles, heavy_elements)
    if persistent:
        rblock = max(2, next_power_of_2(rnumel))
        # A few reduced elements (a grouped-query heads' gradient sums 4) would make tiles of a
        # few hundred elements, [4 x 128]: 0.6 TB/s on the H200. The lanes grow instead, to
        # OUTER_TILE elements a tile, as a looped outer step holds.
        xblock = min(max(xblock, OUTER_TILE // rblock), max(2, next_power_of_2(xnumel)))
        xblock = _fill_the_gpu(xnumel, rnumel, xblock, OUTER_MIN_XBLOCK)
        xblock = max(2, min(xblock, MAX_PERSISTENT_TILE // rblock))
        if heavy_tile and rblock >= 16 and rblock * xblock > heavy_tile:  # (fewer: the lanes grew, above)
            xblock = max(min(xblock, OUTER_MIN_XBLOCK), heavy_tile // rblock)
            return Config(cdiv(xnumel, xblock), (xblock, rblock), max(1, min(8, rblock * xblock // 512)))
        if rblock < 16:
            # Warps beyond XBLOCK / 256 lie along the reduced axis (a warp's lanes take 8
            # contiguous bf16 each): every program then reduces across warps through shared
            # memory. The grouped-query heads' sum of 4, [4 x 512]: 589 us with 8 warps, 41 us
            # with 1 or 2 on the H200.
            return Config(cdiv(xnumel, xblock), (xblock, rblock), max(1, min(8, xblock // 256)))
    elif special_step and not heavy_tile:
        xblock = min(SPECIAL_STEP_TILE[0], max(2, next_power_of_2(xnumel)))
        rblock = max(2, min(next_power_of_2(rnumel), SPECIAL_STEP_TILE[1]))
        return Config(cdiv(xnumel, xblock), (xblock, rblock), 8 if rblock * xblock >= 1024 else 4)
    else:
        # A looped program takes rnumel / RBLOCK steps one after the other, however small the
        # kernel: fewer lanes a program buy more programs and longer steps (a batch norm's second
        # stage, 72 outputs x 896 partials, was one program of 56 steps a loop: 133 us on the H200).
        xblock = _fill_the_gpu(xnumel, rnumel, xblock, OUTER_MIN_XBLOCK, small_too=True,
                               programs=MIN_PROGRAMS if heavy_tile else LOOPED_OUTER_MIN_PROGRAMS)
        tile = _outer_loop_tile(cdiv(xnumel, xblock))
        if heavy_tile and tile > heavy_tile:
            xblock = max(min(xblock, OUTER_MIN_XBLOCK), min(xblock, heavy_tile // HEAVY_MIN_RBLOCK))
            rblock = max(2, min(next_power_of_2(rnumel), heavy_tile // xblock))
            return Config(cdiv(xnumel, xblock), (xblock, rblock), max(1, min(8, rblock * xblock // 128)))
        rblock = max(2, min(next_power_of_2(rnumel), tile // xblock))
        if LIGHT_OUTER_PIPELINE is not None and cdiv(xnumel, xblock) >= MIN_PROGRAMS:
            warps, stages = LIGHT_OUTER_PIPELINE
            return Config(cdiv(xnumel, xblock), (xblock, max(2, rblock // 2)), warps, num_stages=stages)
    return Config(cdiv(xnumel, xblock), (xblock, rblock), 8 if rblock * xblock >= 2048 else 4)


def align_to_chunks(config: Config, chunk_lanes: int, xnumel: int, rnumel: int, persistent: bool) -> Config:
    """``config`` with an XBLOCK that divides ``chunk_lanes`` (0: unchanged), so that every lane of
    a program is in one chunk of rows (codegen/triton/chunks.py: the chunk's values load once a
    row, not once an element); a looped tile keeps its elements, in more reduced rows."""
    xblock, rblock = config.constexprs
    if not chunk_lanes or chunk_lanes % xblock == 0:
        return config
    aligned = min(xblock, chunk_lanes & -chunk_lanes)  # the largest power of 2 dividing it
    if not persistent:
        rblock = max(2, min(next_power_of_2(rnumel), rblock * (xblock // aligned)))
    return replace(config, grid=cdiv(xnumel, aligned), constexprs=(aligned, rblock))


def _heavy_step_tile(live_tiles: int, elements: int) -> int:
    """The largest tile for a step holding ``live_tiles`` tiles of ``elements`` in all; 0 (no
    bound) for one or two."""
    if live_tiles <= 2:
        return 0
    return max(HEAVY_MIN_TILE, 1 << max(1, elements // live_tiles).bit_length() - 1)


def _outer_loop_tile(grid: int) -> int:
    """Elements a looped outer program loads a step, for a grid of ``grid`` programs: OUTER_TILE,
    FEW_PROGRAMS_TILE under MIN_PROGRAMS, and enough for IN_FLIGHT_ELEMENTS over the grid
    under 2 x MIN_PROGRAMS."""
    tile = OUTER_TILE if grid >= MIN_PROGRAMS else FEW_PROGRAMS_TILE
    if grid < 2 * MIN_PROGRAMS:
        tile = max(tile, min(MAX_OUTER_TILE, next_power_of_2(cdiv(IN_FLIGHT_ELEMENTS, grid))))
    return tile


def _fill_the_gpu(xnumel: int, rnumel: int, xblock: int, floor: int, small_too: bool = False,
                  programs: int = MIN_PROGRAMS) -> int:
    """Halve XBLOCK, not below ``floor``, while the grid has fewer than ``programs`` programs
    (kernels of fewer than SMALL_KERNEL elements keep their tiles, the launch dominates, unless
    ``small_too``)."""
    if xnumel * max(rnumel, 1) < SMALL_KERNEL and not small_too:
        return xblock
    while xblock > floor and cdiv(xnumel, xblock) < programs:
        xblock //= 2
    return xblock


def default_config(kind: str, persistent: bool, outer: bool, tile: tuple[int, int, int] | None,
                   xnumel: int, rnumel: int, live_tiles: int = 0, special_step: int = 0,
                   chunk_lanes: int = 0) -> Config:
    """The config of a launch when nothing is tuned (``tile_config`` / ``pointwise_config`` /
    ``reduction_config``): what a ``Launcher`` launches and what ``triton_ahead`` compiles."""
    if tile is not None:
        return tile_config(*tile)
    if kind in FLAT_KINDS:
        return pointwise_config(xnumel)
    return reduction_config(persistent, xnumel, rnumel, outer, live_tiles, special_step, chunk_lanes)
