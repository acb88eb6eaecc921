"""Every generated kernel of a bench case, compiled for sm_90 on the CPU: how wide its global
loads and stores are, largest kernels first. No GPU needed.

Triton vectorizes an access (16 bytes a thread: ``ld.global.v4.b32``) only where its axis
analysis proves each thread's elements contiguous and aligned; anything it cannot see through
(a ``tl.minimum`` in an index, a remainder of a remainder) turns the access into one
instruction per element, and a memory-bound kernel then runs well below copy bandwidth. This
lists, for each kernel, the bytes it moves and its global memory instructions by width, and
marks with ``NARROW`` the kernels whose loads of 2- or 4-byte elements are mostly one element
an instruction. Not every narrow load is a defect: a gather, a per-channel value broadcast to
a tile, rows whose length breaks 16-byte alignment. The mark says where to look.

``--sectors`` also gives each kernel's worst large access by the share of its 32-byte sectors a
warp uses (``diagnostics/coalescing.py``: 100% coalesced, 6% for bf16 elements a sector apart),
marked ``SCATTERED`` below 50%: a read across the lanes that no width shows.

    python scripts/kernel_widths.py llama_block_train
    python scripts/kernel_widths.py mobilenetv3_train --quick --top 20 --sectors
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import torchfuse  # noqa: E402
from kernel_registers import capture_states, ptx_of, sm90_binaries  # noqa: E402
from torchfuse.bench.bandwidth import kernel_function_name  # noqa: E402
from torchfuse.bench.suites import all_cases  # noqa: E402
from torchfuse.diagnostics.coalescing import worst_sector_use  # noqa: E402

SECTOR_MIN_ELEMENTS = 1 << 20  # accesses of smaller buffers stay in L2
ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[\w]+)*)")


def access_widths(ptx: str) -> dict[str, dict[int, int]]:
    """{"ld"/"st": {bytes an instruction moves: instructions}} of the kernel's global accesses."""
    found: dict[str, dict[int, int]] = {"ld": {}, "st": {}}
    for op, suffix in ACCESS.findall(ptx):
        parts = suffix.split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        bits = next((int(p[1:]) for p in parts if re.fullmatch(r"[bfus]\d+", p)), 8)
        width = lanes * bits // 8
        found[op][width] = found[op].get(width, 0) + 1
    return found


def is_narrow(widths: dict[int, int]) -> bool:
    """Most load instructions move one 2- or 4-byte element (and none is wide enough to say
    the kernel's main accesses are vectorized)."""
    narrow = sum(n for w, n in widths.items() if w in (2, 4))
    wide = sum(n for w, n in widths.items() if w >= 8)
    return narrow > 2 * wide


def compile_case(name: str, quick: bool) -> list:
    """The pipeline states of every graph the case's step compiles for the Triton target."""
    captured = capture_states()
    case = next(c for c in all_cases() if c.name == name)
    workload = case.build(torch.device("cpu"), quick)
    step = workload.make_step(lambda fn: torch.compile(fn, backend=torchfuse.backend, options={"target": "triton"}))
    step()
    return captured


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", help="a case of torchfuse bench (its CPU build, at bench sizes)")
    parser.add_argument("--quick", action="store_true", help="the case's quick sizes")
    parser.add_argument("--top", type=int, default=40, help="kernels to list, largest first")
    parser.add_argument("--sectors", action="store_true", help="each kernel's worst access by sector use")
    args = parser.parse_args()
    os.environ.setdefault("TORCHFUSE_COMPILE_WORKERS", str(os.cpu_count() or 2))
    states = compile_case(args.case, args.quick)
    sizes = {kernel_function_name(k.source): (k.bytes_read or 0) + (k.bytes_written or 0)
             for g in torchfuse.report().graphs for k in g.kernels if k.source}
    rows = []
    for state in states:
        for kernel, _, loader, binary in sm90_binaries(state):
            if binary is None:
                continue
            widths = access_widths(ptx_of(binary))
            worst = worst_sector_use(kernel, state.graph.buffers, SECTOR_MIN_ELEMENTS)[:1] if args.sectors else []
            rows.append((sizes.get(kernel.function, 0), kernel, loader.config, widths, worst))
    rows.sort(key=lambda r: -r[0])
    for size, kernel, config, widths, worst in rows[:args.top]:
        shape = lambda d: " ".join(f"{w}Bx{n}" for w, n in sorted(d.items()))  # noqa: E731
        mark = "NARROW " if is_narrow(widths["ld"]) else ""
        sectors = "".join(f" {'SCATTERED ' if use < 0.5 else ''}{kind} {buffer} {use:.0%} of sectors"
                          for kind, buffer, use in worst)
        print(f"{mark:7}{size / 2**20:9.2f} MB {kernel.function} {kernel.kind}"
              f"{' outer' if kernel.outer else ''}{' persistent' if kernel.persistent else ''} "
              f"{config.blocks()} loads [{shape(widths['ld'])}] stores [{shape(widths['st'])}]{sectors}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
