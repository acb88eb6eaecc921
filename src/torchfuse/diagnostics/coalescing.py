"""How a generated Triton kernel's loads and stores meet memory, worked out without a GPU.

The kernel's index lines (``xindex = ...``, ``rindex = ...``, a 2-D tile's ``yindex``) and the
offsets of its ``tl.load`` / ``tl.store`` / ``tl.atomic_add`` calls are evaluated with numpy, for
the block sizes the launcher picks, one program at a time. Gathered offsets (an embedding row)
use stand-in loaded values: equal where lanes load the same element. This is our own generated
text (``codegen/triton``), so a small stand-in for ``triton.language`` covers what index lines
use.

Neighbouring lanes of a warp hold neighbouring elements of a tile's last axis (of either axis
for a 2-D tiled pointwise kernel, where Triton gives each access its own layout), so:

- ``unit_stride``: whether an access steps by one element along an axis (coalesced);
- ``sector_use``: of each 32-byte sector a warp's 32 lanes touch, the share they use (1.0 when
  coalesced, 1/16 for 2-byte elements one sector apart).

``tests/test_coalescing.py`` checks layout cases with these; ``scripts/kernel_widths.py
--sectors`` reports a whole model's worst accesses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from torchfuse.runtime.launch import Launcher

INDEX_NAMES = ("pid", "xtiles", "ytiles", "zindex", "yindex", "xindex", "xchunk", "xlane", "rindex")
WARP = 32
SECTOR_BYTES = 32


class Values(np.ndarray):
    """Stand-in values loaded from memory (int64), with Triton's ``.to``."""

    def to(self, dtype, bitcast=False):
        return self.astype(dtype).view(Values)


class Pointer:
    """A kernel's pointer argument: ``ptrN + offsets`` is an address block."""

    def __add__(self, offsets):
        return np.asarray(offsets)


class _ProgramId(int):
    def to(self, dtype):
        return self


class FakeTriton:
    """The part of ``triton.language`` index lines and offsets use, on numpy arrays, for one
    program (``pid``)."""

    int64 = np.int64
    int32 = np.int32
    float32 = np.float32
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    where = staticmethod(np.where)

    def __init__(self, pid: int = 0) -> None:
        self.pid = pid

    @staticmethod
    def arange(start, end):
        return np.arange(start, end, dtype=np.int64).view(Values)

    def program_id(self, axis):
        return _ProgramId(self.pid)

    @staticmethod
    def load(offsets, mask=None, other=None):
        """Stand-in values: a hash of the element's offset, so lanes loading one element (the
        token id of a row) agree and other elements differ."""
        return ((np.asarray(offsets).astype(np.int64) * 2654435761 + 12345) % 30011).view(Values)

    @staticmethod
    def broadcast_to(value, shape):
        return value


class Definitions(dict):
    """A kernel's assignments (``tmp5 = ...``), evaluated when an expression first names one:
    the locals of ``eval``, on top of the tile's ``scope``."""

    def __init__(self, source: str, scope: dict, tl: FakeTriton) -> None:
        super().__init__(scope)
        self.tl = tl
        self.lines = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(tmp\d+) = (.*)$", source, re.M)}

    def __missing__(self, name: str):
        if name not in self.lines:
            raise KeyError(name)
        self[name] = eval(self.lines[name], {"tl": self.tl}, self)  # our own generated text
        return self[name]


@dataclass(frozen=True)
class Access:
    kind: str  # "load", "store" or "atomic_add"
    buffer: Any  # ir.graph.Buffer
    offsets: np.ndarray  # element offsets, broadcast to the tile's shape
    mask: np.ndarray  # the tile's lanes inside the launch (xmask & rmask, or a tile's ymask & xmask)


def launcher(kernel) -> Launcher:
    """The launcher the wrapper builds for a rendered ``TritonKernel`` (for its config)."""
    return Launcher(None, kernel.kind, kernel.persistent, direct=False, outer=kernel.outer, tile=kernel.tile,
                    live_tiles=kernel.live_tiles, special_step=kernel.special_step, chunk_lanes=kernel.chunk_lanes)


def index_lines(source: str) -> dict[str, str]:
    """The right-hand sides of the lines defining the program's indices (the last one of each),
    in the order they are first defined."""
    found = {}
    for line in source.splitlines():
        match = re.match(rf"\s*({'|'.join(INDEX_NAMES)}) = (.*)$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _calls(source: str, ops: str) -> Iterator[tuple[str, str, str, str]]:
    """(op, pointer, offset text, the rest of the line) of every ``tl.<op>(ptrN + (...)``."""
    for match in re.finditer(rf"tl\.({ops})\((ptr\d+) \+ \(", source):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        line_end = source.find("\n", end)
        yield match.group(1), match.group(2), source[match.end():end - 1], source[end:line_end if line_end >= 0 else None]


def offset_texts(source: str) -> list[tuple[str, str, str]]:
    """(load, store or atomic_add, pointer, offset text) for every ``tl.load/tl.store/
    tl.atomic_add(ptrN + (...)``."""
    return [(op, pointer, offset) for op, pointer, offset, _ in _calls(source, "load|store|atomic_add")]


def load_texts(source: str) -> list[tuple[str, str, str]]:
    """(pointer, offset text, mask text or "") of every ``tl.load(ptrN + (...), mask, other=0)``."""
    found = []
    for _, pointer, offset, rest in _calls(source, "load"):
        mask = rest[2:rest.index(", other=")] if rest.startswith(", ") and ", other=" in rest else ""
        found.append((pointer, offset, mask))
    return found


def accesses_at(kernel, buffers: dict, pid: int, roffset: int = 0, strict: bool = True) -> Iterator[Access]:
    """Every load and store of rendered ``kernel`` for program ``pid`` at loop offset ``roffset``;
    unless ``strict``, those whose offsets use what the stand-in cannot evaluate are left out."""
    xnumel, rnumel = int(kernel.xnumel), int(kernel.rnumel)
    blocks = launcher(kernel).config(xnumel, rnumel).blocks()
    tl = FakeTriton(pid)
    scope = {"tl": tl, "roffset": roffset, **blocks}
    try:
        for name, text in index_lines(kernel.source).items():
            scope[name] = eval(text, scope)  # our own generated text
    except NameError:  # a combined launch's parts (codegen/triton/combo.py): not modelled
        if strict:
            raise
        return
    xindex = scope["xindex"]
    rindex = scope.get("rindex", np.zeros((1,) * np.ndim(xindex), np.int64))
    if kernel.tile is not None:
        _, ynumel, x_extent = kernel.tile
        mask = (scope["yindex"] < ynumel) & (xindex < x_extent)
    else:
        mask = (xindex < xnumel) & (rindex < max(rnumel, 1))
    pointers = {f"ptr{i}": name for i, name in enumerate(kernel.pointer_args)}
    names = Definitions(kernel.source, {**scope, "rindex": rindex, "xmask": xindex < xnumel,
                                        "rmask": rindex < max(rnumel, 1), **{p: Pointer() for p in pointers}}, tl)
    mask = np.asarray(mask)
    for kind, pointer, text in offset_texts(kernel.source):
        try:
            offsets = np.broadcast_to(np.asarray(eval(text, {"tl": tl}, names)), mask.shape)
        except (AttributeError, NameError, KeyError, TypeError, ValueError):
            if strict:
                raise
            continue
        yield Access(kind, buffers[pointers[pointer]], offsets, mask)


def unit_stride(offsets: np.ndarray, mask: np.ndarray, axis: int) -> tuple[bool, np.ndarray]:
    """Whether ``offsets`` step by 1 between neighbours along ``axis`` of the tile (at most one
    jump in 32, between lanes inside the launch), and the steps seen."""
    ahead = [slice(None)] * mask.ndim
    behind = [slice(None)] * mask.ndim
    ahead[axis], behind[axis] = slice(1, None), slice(None, -1)
    both = mask[tuple(ahead)] & mask[tuple(behind)]
    steps = (offsets[tuple(ahead)] - offsets[tuple(behind)])[both]
    return not (steps.size and np.mean(steps != 1) > 1 / 32), steps


def sector_use(offsets: np.ndarray, mask: np.ndarray, itemsize: int, axis: int) -> float:
    """Of the 32-byte sectors that each run of 32 lanes along ``axis`` touches, the share of
    bytes used, over the tile (1.0 when there is nothing inside the launch)."""
    lanes = np.moveaxis(offsets, axis, -1).astype(np.int64) * itemsize
    inside = np.moveaxis(mask, axis, -1)
    used = touched = 0
    for row, keep in zip(lanes.reshape(-1, lanes.shape[-1]), inside.reshape(-1, inside.shape[-1])):
        for start in range(0, row.size, WARP):
            addresses = np.unique(row[start:start + WARP][keep[start:start + WARP]])
            if addresses.size:
                used += addresses.size * itemsize
                touched += np.unique(addresses // SECTOR_BYTES).size * SECTOR_BYTES
    return used / touched if touched else 1.0


def worst_sector_use(kernel, buffers: dict, min_elements: int, programs: int = 3) -> list[tuple[str, str, float]]:
    """(kind, buffer name, share of sector bytes used) of each access of at least
    ``min_elements`` elements, on the axis it uses best, worst over a few programs (first,
    middle, last) at loop offset 0; sorted worst first."""
    config = launcher(kernel).config(int(kernel.xnumel), int(kernel.rnumel))
    axes = (1, 0) if kernel.tile is not None else (-1,)
    worst: dict[tuple[str, str], float] = {}
    for pid in sorted({0, config.grid // 2, config.grid - 1})[:programs]:
        for access in accesses_at(kernel, buffers, pid, strict=False):
            if int(access.buffer.numel) < min_elements:
                continue
            use = max(sector_use(access.offsets, access.mask, access.buffer.dtype.itemsize, axis) for axis in axes)
            key = (access.kind, access.buffer.name)
            worst[key] = min(worst.get(key, 1.0), use)
    return sorted(((kind, name, use) for (kind, name), use in worst.items()), key=lambda row: row[2])
