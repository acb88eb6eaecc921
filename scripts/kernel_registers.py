"""Registers and spills of a micro case's generated kernels, compiled for sm_90 without a GPU.

A persistent reduction holds its tile in registers; too many registers a thread cut how many
programs an SM runs at once and so the bytes in flight (a memory-bound kernel's speed). ptxas
decides that at compile time, which needs no GPU: this compiles each kernel of a micro case for
sm_90 in the worker pool, for its default launch config and the candidates given, and prints
``cuobjdump -res-usage``'s registers and spills a thread, and the programs an SM can hold by
registers (65536 a SM).

    python scripts/kernel_registers.py short_rows_layer_norm
    python scripts/kernel_registers.py window_softmax --warps 1,2,4,8 --xblocks 2,4,8,16
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse import pipeline  # noqa: E402
from torchfuse.bench.patterns import BY_NAME  # noqa: E402
from torchfuse.runtime import binary_cache, compile_pool, kernel_cache, launch, launch_configs, triton_ahead  # noqa: E402
from torchfuse.runtime.predict import Unpredicted, predict_launches  # noqa: E402

REGISTERS_PER_SM = 65536


def cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers a thread, spilled bytes: stack and local memory) of the cubin's kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([cuobjdump(), "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+) .*?LOCAL:(\d+)", text)
    return int(usage.group(1)), int(usage.group(2)) + int(usage.group(3))  # spills go to the stack


def memory_instructions(ptx: str) -> str:
    """The kernel's global loads and stores by form, e.g. ``ld.v4.b32 x2, st.b16 x8``: the widths
    say whether Triton vectorized them (16 bytes a thread: ``v4.b32``)."""
    forms: dict[str, int] = {}
    for op, suffix in re.findall(r"\b(ld|st)\.global((?:\.[\w]+)*)", ptx):
        parts = [p for p in suffix.split(".") if p and not p.startswith(("L1", "L2", "cs", "ca", "cg", "lu", "cv", "wb", "wt", "nc"))]
        form = ".".join([op, *parts])
        forms[form] = forms.get(form, 0) + 1
    return ", ".join(f"{form} x{count}" for form, count in sorted(forms.items()))


def candidates(default: launch_configs.Config, xblocks: list[int], warps: list[int]) -> list[launch_configs.Config]:
    found = [default]
    for xblock in xblocks or [default.constexprs[0]]:
        for warp in warps or [default.num_warps]:
            blocks = (xblock, *default.constexprs[1:])
            config = dataclasses.replace(default, constexprs=blocks, num_warps=warp)
            if config not in found:
                found.append(config)
    return found


def capture_states() -> list:
    """Set up a compile-only run (a fresh cache, launches that do nothing) and return the list
    the pipeline appends each compiled graph's state to."""
    os.environ.setdefault("TORCHFUSE_COMPILE_WORKERS", "2")
    # A fresh cache: a graph found on disk would skip the pipeline's stages this script watches.
    os.environ["TORCHFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel_registers_")
    launch.Launcher.__call__ = lambda self, *a, **k: None  # compile only: nothing runs on the CPU
    captured: list = []
    pipeline.STAGES = pipeline.STAGES + [("spy", captured.append)]
    return captured


def sm90_binaries(state, candidates_of=None):
    """(kernel, predicted launch, loader, compiled binary or None when its compile failed) for
    each predicted kernel of a captured pipeline ``state``, compiled for sm_90 in the worker
    pool: its default config, then those ``candidates_of(kernel, default)`` adds."""
    kernels = {n: dataclasses.replace(k, device="cuda") for n, k in state.kernels.items()}
    fns = {n: kernel_cache.load_kernel(k.source, k.function, interpret=False) for n, k in kernels.items()}
    predictions = predict_launches(state.graph, state.plan, kernels, state.example_inputs)
    configs = None if candidates_of is None else {
        n: candidates_of(kernels[n], triton_ahead.default_config(kernels[n], p))
        for n, p in predictions.items() if not isinstance(p, Unpredicted)}
    ready = triton_ahead.compile_ahead(kernels, fns, predictions, target=triton_ahead.Target("cuda", 90, 32),
                                       configs=configs)
    for name, (predicted, loaders) in ready.items():
        for loader in loaders:
            if loader.future is not None and not compile_pool.wait(loader.future)["ok"]:
                yield kernels[name], predicted, loader, None
                continue
            entry = binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
            yield kernels[name], predicted, loader, triton_ahead.load_compiled(loader.fn, loader.spec, entry)


def ptx_of(binary) -> str:
    ptx = binary.asm.get("ptx", "")
    return ptx if isinstance(ptx, str) else ptx.decode()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", help="a micro case of bench/patterns.py")
    parser.add_argument("--size", default="bench")
    parser.add_argument("--xblocks", default="", help="XBLOCKs to compile besides the default")
    parser.add_argument("--warps", default="", help="warps to compile besides the default")
    parser.add_argument("--ptx", default="", help="a folder to write each binary's PTX to")
    args = parser.parse_args()
    xblocks = [int(x) for x in args.xblocks.split(",") if x]
    warps = [int(x) for x in args.warps.split(",") if x]
    captured = capture_states()
    pattern = BY_NAME[args.case]
    torchfuse.compile(pattern.fn, options={"target": "triton"})(*pattern.make_inputs("cpu", torch.bfloat16, args.size))
    for state in captured:
        shown = None
        for kernel, predicted, loader, binary in sm90_binaries(
                state, lambda kernel, default: candidates(default, xblocks, warps)):
            first = kernel is not shown
            if first:
                shown = kernel
                print(f"{kernel.function} ({kernel.kind}{', persistent' if kernel.persistent else ''}"
                      f"{', outer' if kernel.outer else ''}) xnumel {predicted.xnumel} rnumel {predicted.rnumel}")
            if binary is None:
                print(f"  {loader.config}: compile failed")
                continue
            registers, spills = resource_usage(binary.kernel)
            threads = 32 * loader.config.num_warps
            resident = min(REGISTERS_PER_SM // max(registers * threads, 1), 2048 // threads, 32)
            marker = " (default)" if first else ""
            ptx = ptx_of(binary)
            print(f"  {loader.config.blocks()} warps {loader.config.num_warps}: {registers} registers, "
                  f"{spills} spill bytes, {resident} programs an SM by registers{marker}\n"
                  f"    global memory: {memory_instructions(ptx)}")
            if args.ptx:
                os.makedirs(args.ptx, exist_ok=True)
                blocks = "_".join(f"{k}{v}" for k, v in loader.config.blocks().items())
                with open(os.path.join(args.ptx, f"{kernel.function}_{blocks}_w{loader.config.num_warps}.ptx"), "w") as f:
                    f.write(ptx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
