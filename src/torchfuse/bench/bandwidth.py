"""How close each generated GPU kernel of a model comes to the memory bandwidth.

A kernel's bytes are what the report says it moves (``KernelReport.reads`` and ``writes``: the
buffers it loads from and stores to memory, each counted once per launch); its time is the
profiler's (``bench/profile.py``). Bytes over time, against a device-to-device copy measured in
the same process, say whether a kernel is memory-bound and near the limit or leaves bandwidth
unused (a bad tile, too few programs, strided access). Issue 16's bar: every generated kernel that
moves 64 MB or more reaches 70% of copy bandwidth.

Buffer sizes overstate what a gather moves (an embedding lookup or a cross-entropy's label
pick reads a few elements of a large buffer), so such kernels can show more than the copy
bandwidth; kernels whose reads are all whole do not.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

from torchfuse.bench.profile import KernelTime

BIG_KERNEL_BYTES = 64 << 20
TARGET_SHARE = 0.70


@dataclass(frozen=True)
class KernelBandwidth:
    name: str
    us_per_call: float
    bytes: int  # per call (the mean, for a kernel that runs at several sizes)
    gbs: float  # GB/s (1e9 bytes a second)
    share: float  # of the copy bandwidth

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_function_name(source: str | None) -> str | None:
    """The Triton function a kernel's source launches (``tf_...``), the name the profiler shows;
    the shared helpers (``_add``, ``_round_bf16``) come before it."""
    for line in (source or "").splitlines():
        if line.startswith("def tf_"):
            return line[4:].split("(")[0]
    return None


def generated_kernel_bytes(graphs: Iterable[Any]) -> dict[str, list[int]]:
    """Function name -> the bytes each of its kernels moves a launch, for the generated kernels of
    the report's ``graphs`` (one case's graphs: a size-generic kernel, a flat pointwise one say,
    runs at several sizes under one name). Names with a kernel of unknown size are left out."""
    found: dict[str, list[int | None]] = {}
    for graph in graphs:
        for kernel in graph.kernels:
            name = kernel_function_name(kernel.source)
            if name is not None:
                read, written = kernel.bytes_read, kernel.bytes_written
                found.setdefault(name, []).append(None if read is None or written is None else read + written)
    return {name: sizes for name, sizes in found.items() if None not in sizes}  # type: ignore[misc]


def bytes_per_call(sizes: list[int], calls: float) -> float | None:
    """The mean bytes of a profiled kernel's calls: exact when its kernels all move the same, or
    when each runs equally often (the calls a multiple of the kernels); None otherwise."""
    if len(set(sizes)) == 1:
        return float(sizes[0])
    whole = round(calls)
    if whole and abs(calls - whole) < 1e-6 and whole % len(sizes) == 0:
        return sum(sizes) / len(sizes)
    return None


def kernel_bandwidths(kernels: Iterable[KernelTime], sizes: dict[str, list[int]], copy_gbs: float) -> list[KernelBandwidth]:
    """The bandwidth of each profiled kernel whose bytes are known, slowest share first."""
    rows = []
    for kernel in kernels:
        if kernel.name not in sizes or kernel.calls <= 0 or kernel.ms <= 0:
            continue
        moved = bytes_per_call(sizes[kernel.name], kernel.calls)
        if moved is None:
            continue
        seconds = kernel.ms / 1e3 / kernel.calls
        gbs = moved / seconds / 1e9
        rows.append(KernelBandwidth(kernel.name, seconds * 1e6, int(moved), gbs,
                                    gbs / copy_gbs if copy_gbs else float("nan")))
    return sorted(rows, key=lambda row: row.share)


def worst_big_kernels(rows: list[KernelBandwidth], count: int = 3) -> list[KernelBandwidth]:
    """The ``count`` kernels moving ``BIG_KERNEL_BYTES`` or more that come least close to the copy."""
    return [row for row in rows if row.bytes >= BIG_KERNEL_BYTES][:count]


def format_bandwidths(case: str, rows: list[KernelBandwidth], count: int = 3) -> str:
    """One line per case: its worst big kernels, marked where they miss ``TARGET_SHARE``."""
    worst = worst_big_kernels(rows, count)
    if not worst:
        return f"{case}: no generated kernel moves {BIG_KERNEL_BYTES >> 20} MB or more"
    parts = [f"{row.name} {row.bytes / 2**20:.0f} MB in {row.us_per_call:.1f} us = {row.gbs:.0f} GB/s "
             f"({100 * row.share:.0f}%{'' if row.share >= TARGET_SHARE else ' < 70%'})" for row in worst]
    return f"{case}: worst kernels of {BIG_KERNEL_BYTES >> 20} MB or more: " + "; ".join(parts)
