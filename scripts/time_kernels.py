"""Time saved kernel sources (gpu_profile.py --sources) over a grid of launch configs (GPU).

A whole model is too slow to sweep configs in: this takes the kernels a profile flagged, as the
profile saved them (their header lists the buffers read and written), builds inputs of those
shapes (floats random, integers and booleans zero, so every gathered index is in range), checks
on the CPU that the first and last programs stay inside them (a kernel that would not is left
out: an illegal address ends the process's CUDA context), compiles every config in the worker pool at once, and times each with CUDA events as
max-autotune does. It prints each kernel's configs fastest first, with GB/s for the bytes of
its buffers, and the default's place.

    python3 scripts/time_kernels.py out/profile/sources_swin_t_train/tf_red_f6f4....py:49152:196 ...

XNUMEL and RNUMEL are the launch's sizes (the wrapper's; for a reduction, the number of outputs
and the length of each row).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from torchfuse.runtime import autotune, kernel_cache, triton_ahead  # noqa: E402
from torchfuse.runtime.launch import Launcher, PointerArg, _cuda_device_and_stream, specialization  # noqa: E402
from torchfuse.runtime.launch_configs import Config, cdiv, default_config, next_power_of_2  # noqa: E402
from torchfuse.runtime.predict import PredictedLaunch  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i64": torch.int64,
          "i32": torch.int32, "b1": torch.bool, "b8": torch.bool}
ACCESS = re.compile(r"BufferAccess\(name='(\w+)', shape='(\w+)\[([\d, ]*)\]'")
MIN_TILE, MAX_TILE = 512, 8192
# TritonKernel.special_step, from the text of the loops: an exp, a library call, a float division
# (without the renderer's op floor, kernel.SPECIAL_STEP_MIN_OPS: a guess, used only where the
# header does not give the launch).
SPECIAL_TEXT = re.compile(r"tl\.exp2?\(|tl\.log2?\(|tl\.sqrt|libdevice\.|[^/]\s/\s")
# The launch fake_cuda_graphs.py --sources writes into a reduction's header: the default config.
LAUNCH = re.compile(r"^# launch grid (\d+) \[(\d+)(?: x (\d+))?\] w(\d+)", re.M)


Spec = tuple[str, torch.dtype, tuple[int, ...]]  # a buffer's name, dtype and shape


def header_buffers(source: str) -> tuple[list[Spec], list[Spec]]:
    """The buffers the header says the kernel reads, and those it writes, first mention kept.
    Headers of ``gpu_profile.py --sources`` say ``reads [...], writes [...]`` on a line; those
    of ``fake_cuda_graphs.py --sources`` have a ``# reads`` or ``# writes`` line a buffer."""
    header = source.split("\n\n", 1)[0]
    if "writes [" in header:
        reads_text, _, writes_text = header.partition("writes [")
    else:
        lines = header.splitlines()
        reads_text = "\n".join(line for line in lines if line.startswith("# reads"))
        writes_text = "\n".join(line for line in lines if line.startswith("# writes"))
    found: list[list[Spec]] = [[], []]
    for text, out in ((reads_text, found[0]), (writes_text, found[1])):
        for name, dtype, dims in ACCESS.findall(text):
            if name not in [n for n, _, _ in out]:
                out.append((name, DTYPES[dtype], tuple(int(d) for d in dims.split(",") if d.strip())))
    return found[0], found[1]


def pointer_buffers(source: str, function: str) -> list[Spec] | str:
    """The buffer behind each pointer parameter, in order: the header lists reads then writes,
    the parameters come in the order the kernel first used them, so the loaded-only pointers
    take the reads in order and the stored ones the writes. A reason instead when that cannot
    be told (a pointer both loaded and stored, or counts that differ)."""
    body = source[source.index(f"def {function}("):]
    pointers = re.findall(r"\b(ptr\d+)\b", body.split("\n", 1)[0])
    stored = set(re.findall(r"tl\.(?:store|atomic_\w+)\((ptr\d+)", body))
    loaded = set(re.findall(r"tl\.load\((ptr\d+)", body))
    if stored & loaded:
        return f"{sorted(stored & loaded)} both loaded and stored"
    reads, writes = header_buffers(source)
    read_pointers = [p for p in pointers if p not in stored]
    write_pointers = [p for p in pointers if p in stored]
    if len(read_pointers) != len(reads) or len(write_pointers) != len(writes):
        return f"{len(reads)} reads and {len(writes)} writes in the header, pointers {pointers}"
    by_pointer = dict(zip(read_pointers, reads)) | dict(zip(write_pointers, writes))
    return [by_pointer[p] for p in pointers]


def out_of_range(kernel: types.SimpleNamespace, specs: list[Spec], config: Config) -> list[str]:
    """Accesses of the first and last programs (first and last loop steps) past their buffer,
    worked out on the CPU (diagnostics/coalescing.py): launching them would fault the GPU."""
    from torchfuse.diagnostics.coalescing import accesses_at, offset_texts

    shaped = types.SimpleNamespace(**vars(kernel), pointer_args=[n for n, _, _ in specs])
    # Gathered offsets use stand-ins for the loaded indices; the inputs here hold zeros instead.
    gathered = {specs[int(pointer[3:])][0] for _, pointer, text in offset_texts(kernel.source)
                if re.search(r"\btmp\d+\b", text)}
    buffers = {n: types.SimpleNamespace(name=n, numel=math.prod(shape), dtype=d) for n, d, shape in specs}
    rblock = config.blocks().get("RBLOCK", 1)
    problems = []
    for pid in sorted({0, config.grid - 1}):
        for roffset in sorted({0, max(0, kernel.rnumel - 1) // rblock * rblock}):
            for access in accesses_at(shaped, buffers, pid, roffset, strict=False):
                if access.buffer.name in gathered:
                    continue
                mask = np.broadcast_to(access.mask, access.offsets.shape)
                if mask.any() and (access.offsets[mask].max() >= access.buffer.numel or access.offsets[mask].min() < 0):
                    problems.append(f"{access.kind} of {access.buffer.name} (program {pid}, step {roffset})")
    return problems


def guessed_sizes(source: str, kind: str) -> dict[str, int]:
    """The launch's sizes as the header's buffers suggest them: a pointwise kernel runs over its
    largest buffer; a reduction has as many outputs as its smallest stored buffer has elements
    and rows of the largest buffer's elements over those (a split reduction's first stage is
    guessed wrong; the guess only decides which sizes are taken as divisible by 16)."""
    reads, writes = header_buffers(source)
    largest = max(math.prod(shape) for _, _, shape in reads + writes)
    if kind != "reduction" or not writes:
        return {"xnumel": largest}
    outputs = min(math.prod(shape) for _, _, shape in writes)
    return {"xnumel": outputs, "rnumel": largest // outputs if outputs and largest % outputs == 0 else 1}


def make_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda").to(dtype)
    return torch.zeros(shape, dtype=dtype, device="cuda")


def _first_loop(body: str) -> str:
    """The lines of a kernel's first row loop (``for roffset ...`` and what it indents)."""
    lines = body[body.index("for roffset"):].splitlines()
    depth = len(lines[0]) - len(lines[0].lstrip())
    loop = [lines[0]]
    for line in lines[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= depth:
            break
        loop.append(line)
    return "\n".join(loop)


def describe_kernel(source: str) -> types.SimpleNamespace:
    function = re.search(r"^def (tf_\w+)\(", source, re.M).group(1)
    body = source[source.index(f"def {function}("):]
    reduction = "RBLOCK" in body.split("\n", 1)[0]
    # TritonKernel.live_tiles, from the text: accumulators or reduced tiles, and loads masked
    # along both axes.
    live = len(re.findall(r"= tl\.full\(\[(RBLOCK, XBLOCK|XBLOCK, RBLOCK)\]|\btile\d+ = tl\.where", body))
    live += len(re.findall(r"tl\.load\([^\n]*xmask & rmask", body))
    looped = reduction and "for roffset" in body
    chunks = re.search(r"^\s*if (\d+) % XBLOCK == 0:", body, re.M)  # codegen/triton/chunks.py
    return types.SimpleNamespace(
        function=function, source=source, tile=None, live_tiles=live if reduction else 0,
        chunk_lanes=int(chunks.group(1)) if chunks else 0,
        special_step=looped and SPECIAL_TEXT.search(_first_loop(body)) is not None,
        kind="reduction" if reduction else "pointwise",
        persistent=reduction and "for roffset" not in body,
        outer="tl.arange(0, XBLOCK)[None, :]" in body)


def config_grid(kernel: types.SimpleNamespace, xnumel: int, rnumel: int, stages: tuple[int, ...] = (1,)) -> list[Config]:
    """The default, then power-of-two tiles of MIN_TILE to MAX_TILE elements with 1 (persistent)
    or 2 to 8 warps; a looped reduction's RBLOCK from 8 to 64 (outer) or to its row (inner),
    each with every count of ``stages`` for its row loop."""
    default = header_launch(kernel.source, xnumel) or default_config(
        kernel.kind, kernel.persistent, kernel.outer, None, xnumel, rnumel, kernel.live_tiles, kernel.special_step,
        kernel.chunk_lanes)
    if kernel.kind != "reduction":
        return [default]
    found = [default]
    if kernel.persistent:
        rblocks, warp_counts = [default.constexprs[1]], (1, 2, 4, 8)
    else:
        longest = 64 if kernel.outer else min(1024, next_power_of_2(rnumel))
        rblocks, warp_counts = [2 ** i for i in range(3, 11) if 2 ** i <= longest], (2, 4, 8)
    for rblock in rblocks:
        for xblock in (2 ** i for i in range(12)):
            if not MIN_TILE <= xblock * rblock <= MAX_TILE or xblock > 2 * xnumel:
                continue
            for warps in warp_counts:
                for count in (stages if not kernel.persistent else (1,)):
                    config = Config(cdiv(xnumel, xblock), (xblock, rblock), warps, None if count == 1 else count)
                    if config not in found:
                        found.append(config)
    return found


def header_launch(source: str, xnumel: int) -> Config | None:
    """The reduction launch the header names, when it is one over ``xnumel`` outputs."""
    found = LAUNCH.search(source)
    if found is None or found.group(3) is None:
        return None
    grid, xblock, rblock, warps = (int(g) for g in found.groups())
    return Config(grid, (xblock, rblock), warps) if grid == cdiv(xnumel, xblock) else None


def sweep(path: str, xnumel: int | None, rnumel: int | None, keep: int, stages: tuple[int, ...] = (1,)) -> dict:
    source = Path(path).read_text()
    kernel = describe_kernel(source)
    if xnumel is None:
        guess = guessed_sizes(source, kernel.kind)
        xnumel, rnumel = guess["xnumel"], guess.get("rnumel", 0)
    fn = kernel_cache.load_kernel(source, kernel.function, interpret=False)
    kernel.xnumel, kernel.rnumel = xnumel, rnumel
    specs = pointer_buffers(source, kernel.function)
    configs = config_grid(kernel, xnumel, rnumel, stages)
    problems = [specs] if isinstance(specs, str) else out_of_range(kernel, specs, configs[0])
    if problems:
        print(f"\n{kernel.function}: not timed: {'; '.join(problems[:4])}")
        return {"kernel": kernel.function, "error": problems}
    args = tuple(make_tensor(dtype, shape) for _, dtype, shape in specs)
    moved = sum(a.numel() * a.element_size() for a in args)
    launch = PredictedLaunch(xnumel, rnumel, tuple(PointerArg(a.dtype, a.data_ptr() % 16 == 0) for a in args))
    launcher = Launcher(fn, kernel.kind, kernel.persistent, outer=kernel.outer, live_tiles=kernel.live_tiles,
                        special_step=kernel.special_step, chunk_lanes=kernel.chunk_lanes)
    launcher.current_device, launcher.current_stream = _cuda_device_and_stream()
    ready = triton_ahead.compile_ahead({kernel.function: kernel}, {kernel.function: fn},
                                       {kernel.function: launch}, configs={kernel.function: configs})
    for loader in ready.get(kernel.function, (None, []))[1]:
        launcher.prepare(xnumel, rnumel, launch.args, loader, loader.config)
    key = (torch.cuda.current_device(), xnumel, rnumel, *specialization(args))
    timings = []
    for config in configs:
        try:
            _, run = autotune._runner(launcher, key, config, xnumel, rnumel, list(args))
            timings.append((config, autotune.cuda_timer(run, config) * 1e6))
        except Exception as error:  # noqa: BLE001 - e.g. out of shared memory: that config is out
            print(f"  {autotune.describe(config)}: {type(error).__name__}: {str(error)[:120]}")
    default_us = timings[0][1]
    ordered = sorted(timings, key=lambda t: t[1])
    print(f"\n{kernel.function} ({'persistent' if kernel.persistent else 'looped'}"
          f"{', outer' if kernel.outer else ''}) {xnumel} x {rnumel}, {moved / 1e6:.0f} MB; "
          f"default {autotune.describe(timings[0][0])}: {default_us:.1f} us "
          f"({moved / default_us / 1e3:.0f} GB/s), rank {ordered.index(timings[0]) + 1} of {len(timings)}")
    for config, us in ordered[:keep]:
        print(f"  {us:8.1f} us {moved / us / 1e3:7.0f} GB/s  {autotune.describe(config)}")
    return {"kernel": kernel.function, "xnumel": xnumel, "rnumel": rnumel, "bytes": moved,
            "timings": [(autotune.describe(c), us) for c, us in timings]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernels", nargs="+", help="FILE:XNUMEL:RNUMEL, or FILE alone: the sizes its header's "
                                                   "buffers suggest (guessed_sizes)")
    parser.add_argument("--keep", type=int, default=10, help="configs printed per kernel")
    parser.add_argument("--stages", default="1", help="row-loop stage counts timed with every looped tile, e.g. 1,3")
    parser.add_argument("--out", default=None, help="a JSON file for every timing")
    options = parser.parse_args()
    stages = tuple(int(n) for n in options.stages.split(","))
    results = []
    for item in options.kernels:
        path, *sizes = item.split(":")
        xnumel, rnumel = (int(n) for n in sizes) if sizes else (None, None)
        results.append(sweep(path, xnumel, rnumel, options.keep, stages))
        sys.stdout.flush()
    if options.out:
        Path(options.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
