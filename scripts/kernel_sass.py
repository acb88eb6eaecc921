"""Instruction mix of saved GPU kernels, compiled for sm_90 without a GPU: which kernels are
bound by their arithmetic rather than by memory?

A kernel whose loop issues several quarter-rate instructions per element cannot move its bytes
at copy bandwidth however it is tiled: MUFU (exp2, reciprocal, square root: sigmoid, GELU,
normalization) and conversions (F2F, or F2FP for two values: the float32 -> bfloat16 roundings
that keep eager's numbers) run at 16 a clock an SM on sm_90, against 128 for float32 adds and
multiplies. This compiles each kernel source saved
by ``fake_cuda_graphs.py --sources`` at the launch its header names (``# launch grid N [X x R]
wW``), reads the SASS of its loops (``cuobjdump -sass``; the whole kernel when it has none),
and prints per element: instructions, MUFU, conversions; then two lower bounds on its time on
an H100: memory (the header's bytes at ``--copy-gbps``, reads once a loading pass) and arithmetic (the busiest of the
issue slots, the float32 pipe, the integer pipe and the quarter-rate unit, over the largest
buffer's elements). ``ALU`` marks kernels whose arithmetic bound is at least ``--flag`` of
their memory bound. Estimates from static counts: a prediction to check with
``time_kernels.py``, not a timing. Checked on the H100 (2026-12-07) on two squeeze-excite pools
of the same shape and launch: measured 66 and 112 us where this says 50 and 62 (bounds, and
the second, with one more rounding an element, is further above its own). Kernels compile
with the runtime's specialization (aligned pointers, sizes divisible by 16 marked so): without
it, flat pointwise kernels loaded one element a thread and their bounds came out ~1.5x high.

    python scripts/fake_cuda_graphs.py --cases efficientnet_b0_infer --full --sources /tmp/eff
    python scripts/kernel_sass.py /tmp/eff/efficientnet_b0_infer_inference/*.py --top 15
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from kernel_registers import cuobjdump  # noqa: E402
from time_kernels import LAUNCH, describe_kernel, guessed_sizes, header_buffers, pointer_buffers  # noqa: E402

SMS, CLOCK_GHZ = 132, 1.755  # H100 SXM under load
# Thread-instructions a clock an SM, compute capability 9.0 (CUDA C++ Programming Guide,
# arithmetic instruction throughput): float32 add/multiply/FMA 128; 32-bit integer add, logic,
# shift and compare 64; MUFU and conversions between 32-bit floats and other types 16.
ISSUE_RATE = 128
FP32 = {"FADD": 128, "FMUL": 128, "FFMA": 128, "FSEL": 64, "FSETP": 64, "FMNMX": 64}
QUARTER = {"MUFU", "F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP"}
QUARTER_RATE = 16
INTEGER_RATE = 64
NOT_ALU = re.compile(r"^(LDG|STG|LDS|STS|LDC|ULDC|BAR|BRA|EXIT|NOP|S2R|S2UR|CS2R|MOV|UMOV|SHFL|RED|ATOM\w*|MEMBAR|DEPBAR|WARPSYNC|BSSY|BSYNC|CALL|RET|U\w+)$")
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)(\S*)\s*([^;]*);")
TRITON_POINTEE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
                  torch.int32: "i32", torch.bool: "i1"}


@dataclasses.dataclass
class Mix:
    """A kernel's instructions per element, by opcode, over its loops (or whole body)."""

    per_element: dict[str, float]

    def count(self, ops: set[str] | None = None) -> float:
        return sum(n for op, n in self.per_element.items() if ops is None or op in ops)

    def clocks_per_element(self) -> float:
        """Lower bound on an SM's clocks per element: the busiest of its issue slots and pipes."""
        alu = {op: n for op, n in self.per_element.items() if not NOT_ALU.match(op)}
        quarter = sum(n for op, n in alu.items() if op in QUARTER) / QUARTER_RATE
        fp32 = sum(n / FP32[op] for op, n in alu.items() if op in FP32)
        integer = sum(n for op, n in alu.items() if op not in QUARTER and op not in FP32) / INTEGER_RATE
        issue = sum(self.per_element.values()) / ISSUE_RATE
        return max(quarter, fp32, integer, issue)


def sass_of(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout


def loop_ranges(instructions: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """Address ranges of the innermost loops: a branch back to an earlier address closes one."""
    ranges = []
    for address, op, operands in instructions:
        target = re.match(r"\s*`?\(?\.?L?_?x?_?(?:0x)?([0-9a-f]+)", operands) if op == "BRA" else None
        if target and int(target.group(1), 16) < address:
            ranges.append((int(target.group(1), 16), address))
    return [r for r in ranges if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in ranges)]


def instruction_mix(sass: str, elements_per_thread: int) -> tuple[Mix, int]:
    """Opcodes per element a thread processes, counted over the innermost loops (each a pass over
    all elements) or, without loops, over the whole kernel; and the passes that load (loops
    with a global load: a two-pass variance reads its input twice)."""
    instructions = [(int(a, 16), op, operands) for a, op, _, operands in SASS_LINE.findall(sass)]
    ranges = loop_ranges(instructions)
    counts: collections.Counter = collections.Counter()
    for address, op, _ in instructions:
        if not ranges or any(start <= address <= end for start, end in ranges):
            counts[op] += 1
    passes = sum(any(op == "LDG" and start <= address <= end for address, op, _ in instructions)
                 for start, end in ranges)
    return Mix({op: n / elements_per_thread for op, n in counts.items()}), max(1, passes)


def compile_sm90(path: Path) -> tuple[bytes, dict] | str:
    """The kernel's cubin for sm_90 at its header's launch, and that launch; or why not."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from torchfuse.runtime import kernel_cache
    from torchfuse.runtime.launch_configs import DEFAULT_LOOP_STAGES, LOOP_STAGES_PARAM, pointwise_config

    source = path.read_text()
    kernel = describe_kernel(source)
    launch = LAUNCH.search(source)
    if launch is not None:
        grid, xblock, rblock, warps = (int(g) if g else None for g in launch.groups())
    elif re.search(rf"def {kernel.function}\(.*\bxnumel, XBLOCK: tl.constexpr\):", source):
        # A flat pointwise kernel (its launch is not predicted ahead): the launcher's default
        # for its largest buffer.
        reads, writes = header_buffers(source)
        config = pointwise_config(max(math.prod(shape) for _, _, shape in reads + writes))
        grid, (xblock,), rblock, warps = config.grid, config.constexprs, None, config.num_warps
    else:
        return "no launch in its header"
    specs = pointer_buffers(source, kernel.function)
    if isinstance(specs, str):
        return specs
    signature = {f"ptr{i}": "*" + TRITON_POINTEE[dtype] for i, (_, dtype, _) in enumerate(specs)}
    header = source[source.index(f"def {kernel.function}("):].split("\n", 1)[0]
    for name in re.findall(r"\b(\w+numel)\b", header):
        signature[name] = "i32"
    # A looped reduction also takes its row loop's stages: the launcher's default.
    blocks = {"XBLOCK": xblock, "RBLOCK": rblock, LOOP_STAGES_PARAM: DEFAULT_LOOP_STAGES}
    constexprs = {name: size for name, size in blocks.items() if size and f"{name}: tl.constexpr" in header}
    if set(re.findall(r"(\w+): tl\.constexpr", header)) != set(constexprs):
        return f"its block parameters differ from the header's launch ({header.strip()})"
    signature.update({name: "constexpr" for name in constexprs})
    fn = kernel_cache.load_kernel(source, kernel.function, interpret=False)
    attrs = _runtime_specialization(list(signature), specs, guessed_sizes(source, kernel.kind))
    try:
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps})
    except Exception as error:  # noqa: BLE001 - a tool: say which kernel and go on
        return f"compile failed ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
    return compiled.asm["cubin"], {"grid": grid, "xblock": xblock, "rblock": rblock or 1, "warps": warps}


def _runtime_specialization(names: list[str], specs: list, sizes: dict[str, int]) -> dict:
    """Triton's specialization of a launch in the runtime: buffers from PyTorch's allocator are
    16-byte aligned, and a size divisible by 16 is marked so (the JIT does both). Without it
    every load and store compiles to one element a thread (a bound too high by half)."""
    divisible = [["tt.divisibility", 16]]
    attrs = {(i,): divisible for i in range(len(specs))}
    for name, size in sizes.items():
        if name in names and size % 16 == 0:
            attrs[(names.index(name),)] = divisible
    return attrs


def analyse(path: Path, copy_gbps: float) -> dict | str:
    compiled = compile_sm90(path)
    if isinstance(compiled, str):
        return compiled
    cubin, launch = compiled
    reads, writes = header_buffers(path.read_text())
    read, written = _bytes(reads), _bytes(writes)
    elements = max(math.prod(shape) for _, _, shape in reads + writes)
    per_thread = max(1, launch["xblock"] * launch["rblock"] // (32 * launch["warps"]))
    mix, passes = instruction_mix(sass_of(cubin), per_thread)
    alu_us = elements / SMS * mix.clocks_per_element() / (CLOCK_GHZ * 1e3)
    # each loading pass reads the input again (from memory: a pass's rows outgrow L2 here)
    return {"kernel": path.stem, "mb": (read + written) / 1e6, "launch": launch, "mix": mix, "passes": passes,
            "memory_us": (read * passes + written) / (copy_gbps * 1e3), "alu_us": alu_us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="+", type=Path, help="saved kernel sources (index.txt is skipped)")
    parser.add_argument("--top", type=int, default=0, help="only the N largest by bytes moved")
    parser.add_argument("--copy-gbps", type=float, default=3000.0, help="the GPU's measured copy bandwidth")
    parser.add_argument("--flag", type=float, default=0.7, help="mark kernels whose ALU bound is this share of memory's")
    args = parser.parse_args()
    paths = [p for p in args.kernels if p.suffix == ".py"]
    if args.top:
        paths = sorted(paths, key=_header_bytes, reverse=True)[:args.top]
    print(f"{'kernel':<28} {'MB':>7} {'launch':<22} {'passes':>6} {'instr':>6} {'MUFU':>5} {'conv':>5} {'mem us':>7} {'ALU us':>7}")
    for path in paths:
        found = analyse(path, args.copy_gbps)
        if isinstance(found, str):
            print(f"{path.stem:<28} skipped: {found}")
            continue
        mix, launch = found["mix"], found["launch"]
        shape = f"{launch['grid']} [{launch['xblock']} x {launch['rblock']}] w{launch['warps']}"
        flag = "  ALU" if found["alu_us"] >= args.flag * found["memory_us"] else ""
        print(f"{found['kernel']:<28} {found['mb']:7.1f} {shape:<22} {found['passes']:6d} {mix.count():6.1f} "
              f"{mix.count({'MUFU'}):5.2f} {mix.count(QUARTER - {'MUFU'}):5.2f} "
              f"{found['memory_us']:7.1f} {found['alu_us']:7.1f}{flag}")
    return 0


def _bytes(specs: list) -> int:
    return sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in specs)


def _header_bytes(path: Path) -> int:
    reads, writes = header_buffers(path.read_text())
    return _bytes(reads) + _bytes(writes)


if __name__ == "__main__":
    raise SystemExit(main())
