"""The launch configurations ``mode="max-autotune"`` times for one kernel: a few around the default.

A generated kernel's block sizes are ``tl.constexpr`` (``launch.py``), so every candidate runs
the same source; only the tile and the warps that share it change. Candidates stay close to
the default (``launch_configs.pointwise_config`` / ``reduction_config``), which is always the first: a
handful of neighbours where the default's heuristics are known to be unsure, not a grid search.

- *Warps* (x2, /2): with ``num_warps`` warps over a block of B elements each thread holds
  B / (32 * num_warps) consecutive elements, which sets the width of its loads: 16-byte vector
  loads need 4 float32 or 8 bf16 elements per thread. Which count gives 16-byte loads depends
  on the dtype, and whether more warps (latency hiding) beat wider loads depends on the GPU.
- *Block sizes* (x2, /2): fewer, larger programs amortise index math and the final store of a
  reduction; more, smaller ones fill the SMs better. The default aims at two programs per SM.
- *Loop stages* (looped reductions only, ``Config.num_stages``): the row loop is a ``tl.range``
  whose ``num_stages`` is the kernel's ``LOOP_STAGES`` parameter; with more than one, the loads of
  later steps are in flight while a step computes. It helps some kernels and hurts others at the
  same tile (``launch_configs.DEFAULT_LOOP_STAGES``), and changes which tile is best (MobileNetV3's
  batch-norm statistics: 140 us at the default, 163 with 3 stages there, 122 with 3 stages at four
  times the row block and a quarter of the warps; H100). So up to ``STAGED_CANDIDATES`` configs
  beyond the others pipeline the default's tile and two with longer steps and fewer warps.
  (Triton's compile option ``num_stages`` pipelines only loads that feed a ``dot``: no
  generated kernel has one, and every value of it compiled the same binary.)

What the index math requires of every candidate (``codegen/triton/kernel.py``): blocks are
powers of two (``tl.arange``); a *persistent* reduction's RBLOCK covers its whole row (``rindex
= tl.arange(0, RBLOCK)`` with no loop), so RBLOCK is never changed there; everything else is
masked (``xmask``, ``rmask``) and correct for any power of two. Outer tiles ([RBLOCK, XBLOCK],
``tiling.py``) keep at least ``OUTER_MIN_XBLOCK`` rows on the lanes (a performance bound: fewer
would read less than a 32-byte sector per warp). Kernels with 32-bit indexing must not
index past 2**31: a candidate's grid never reaches further than int32 allows. Tiny kernels
(under ``TUNE_MIN_ELEMENTS``) are launch-bound and get the default alone.
"""
from __future__ import annotations

from torchfuse.codegen.triton.tiling import OUTER_MIN_XBLOCK
from torchfuse.runtime.launch_configs import Config, cdiv, next_power_of_2, pointwise_config, reduction_config

TUNE_MIN_ELEMENTS = 1 << 14  # xnumel * rnumel below which the launch, not the tile, is the cost
MAX_CANDIDATES = 7  # the default and up to six neighbours (then the staged ones, below)
STAGED_CANDIDATES = 3  # looped reductions: pipelined row loops
PIPELINED_STAGES = 3
MAX_TILE = 8192  # elements of one tile held in registers (the default's largest is 4096)
MAX_POINTWISE_BLOCK = 4096
MAX_WARPS = 16
INT32_REACH = 2**31 - 1  # the last index a 32-bit ``pid * XBLOCK + arange`` may reach


def candidate_configs(kind: str, persistent: bool, outer: bool, xnumel: int, rnumel: int,
                      live_tiles: int = 0, special_step: int = 0, chunk_lanes: int = 0) -> list[Config]:
    """The configs to time for one launch, the default first, without duplicates.

    Args:
        kind: "pointwise" or "reduction"; any other kind gets none (its tiling is unknown here:
            the tuner keeps the launcher's default).
        persistent: a reduction holding its whole row in one tile.
        outer: a reduction tiled [RBLOCK, XBLOCK], the lanes along the rows.
        xnumel, rnumel: the launch's sizes (rnumel is 0 for pointwise kernels).
        live_tiles: a reduction's tiles live in one step (``TritonKernel.live_tiles``).
        special_step: a looped step computes special functions (``TritonKernel.special_step``).
        chunk_lanes: the default's XBLOCK divides it (``TritonKernel.chunk_lanes``); the
            neighbours may not (the kernel is correct at any XBLOCK, and they are timed).
    """
    staged: list[Shape] = []
    if kind == "pointwise":
        default = pointwise_config(xnumel)
        shapes = _pointwise_neighbours(default)
    elif kind == "reduction":
        default = reduction_config(persistent, xnumel, rnumel, outer, live_tiles, special_step, chunk_lanes)
        shapes = _persistent_neighbours(default) if persistent else _looped_neighbours(default)
        staged = [] if persistent else _staged_neighbours(default)
    else:
        return []
    if xnumel * max(rnumel, 1) < TUNE_MIN_ELEMENTS:
        return [default]
    found = [default]
    for group, limit in ((shapes, MAX_CANDIDATES), (staged, MAX_CANDIDATES + STAGED_CANDIDATES)):
        for xblock, rblock, warps, stages in group:
            config = _make(xnumel, xblock, rblock, warps, stages)
            if len(found) < limit and config not in found and _valid(config, kind, persistent, outer, xnumel, rnumel):
                found.append(config)
    return found


Shape = tuple[int, "int | None", int, "int | None"]  # XBLOCK, RBLOCK (None: pointwise), warps, stages


def _pointwise_neighbours(default: Config) -> list[Shape]:
    (block,), warps = default.constexprs, default.num_warps
    return [(block, None, warps * 2, None), (block, None, warps // 2, None), (block * 2, None, warps, None),
            (block * 2, None, warps * 2, None), (block // 2, None, warps, None), (block // 2, None, warps // 2, None)]


def _persistent_neighbours(default: Config) -> list[Shape]:
    """RBLOCK stays: it must cover the row."""
    (xblock, rblock), warps = default.constexprs, default.num_warps
    return [(xblock, rblock, warps * 2, None), (xblock, rblock, warps // 2, None),
            (xblock * 2, rblock, warps, None), (xblock * 2, rblock, warps * 2, None),
            (xblock // 2, rblock, warps, None), (xblock // 2, rblock, warps // 2, None)]


def _looped_neighbours(default: Config) -> list[Shape]:
    (xblock, rblock), warps = default.constexprs, default.num_warps
    return [(xblock, rblock, warps // 2, None), (xblock, rblock * 2, warps * 2, None), (xblock, rblock // 2, warps, None),
            (xblock, rblock, warps * 2, None), (xblock * 2, rblock // 2, warps, None),
            (xblock // 2, rblock * 2, warps, None)]


def _staged_neighbours(default: Config) -> list[Shape]:
    """Pipelined row loops: the default's tile, and steps two and four times as long with half
    and a quarter of the warps (fewer threads, each with more of the row's loads in flight)."""
    (xblock, rblock), warps = default.constexprs, default.num_warps
    return [(xblock, rblock, warps, PIPELINED_STAGES), (xblock, rblock * 2, warps // 2, PIPELINED_STAGES),
            (xblock, rblock * 4, warps // 4, PIPELINED_STAGES)]


def _make(xnumel: int, xblock: int, rblock: int | None, warps: int, stages: int | None) -> Config:
    constexprs = (xblock,) if rblock is None else (xblock, rblock)
    return Config(cdiv(xnumel, max(xblock, 1)), constexprs, warps, stages)


def _valid(config: Config, kind: str, persistent: bool, outer: bool, xnumel: int, rnumel: int) -> bool:
    """Whether the kernel computes the right result with ``config``, and it is worth timing."""
    xblock = config.constexprs[0]
    tile = xblock * (config.constexprs[1] if len(config.constexprs) > 1 else 1)
    if not (_power_of_two(xblock) and 1 <= config.num_warps <= MAX_WARPS):
        return False
    if config.grid * xblock > INT32_REACH + 1:  # 32-bit kernels index pid * XBLOCK + arange
        return False
    if config.num_warps * 32 > tile:  # every thread holds at least one element
        return False
    if kind == "pointwise":
        return 16 <= xblock <= min(MAX_POINTWISE_BLOCK, max(16, next_power_of_2(xnumel)))
    rblock = config.constexprs[1]
    if not _power_of_two(rblock) or tile > MAX_TILE or xblock > next_power_of_2(xnumel):
        return False
    if persistent and rblock < rnumel:  # no loop: the tile must hold the whole row
        return False
    if rblock > max(2, next_power_of_2(rnumel)):  # a chunk longer than the row reads only masked lanes
        return False
    return not outer or xblock >= min(OUTER_MIN_XBLOCK, next_power_of_2(xnumel))


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0
