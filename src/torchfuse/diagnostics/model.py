"""The report's data model: what one compiled graph became, fused how, and why not more.

Plain dataclasses, filled in by the pipeline (``pipeline.py``) as its stages run and read by the
report's text and HTML (``report.py``, ``html.py``) and by the tools (``tools/``). A leaf: it names
the scheduler's ``FusionDecision`` and imports nothing else of torchfuse, so a change here reaches
only the code that reads or writes these fields.
"""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

from torchfuse.scheduler.decisions import FusionDecision


# ATen ops that only reinterpret memory: eager runs no kernel for them.
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "alias", "detach", "permute", "transpose", "t", "expand",
    "expand_as", "squeeze", "unsqueeze", "slice", "select", "split", "split_with_sizes", "chunk",
    "unbind", "as_strided", "diagonal", "unfold", "narrow", "view_as", "sym_size", "sym_numel",
    "sym_stride", "sym_storage_offset", "getitem", "size", "dim", "contiguous_view", "_reshape_alias",
})


def op_base_name(op: str) -> str:
    """``aten.view.default`` -> ``view``; ``<built-in function getitem>`` -> ``getitem``;
    ``<method 'relu' of ...>`` -> ``relu``; a method name stays as it is."""
    match = re.search(r"(?:function|method) '?(\w+)", op) if op.startswith("<") else None
    if match:
        return match.group(1)
    parts = op.replace("aten::", "aten.").split(".")
    if len(parts) > 1 and parts[0] in ("aten", "prims", "torch", "operator", "_operator"):
        return parts[1]
    return parts[0]


def is_view_op(op: str) -> bool:
    """True for view ops and shape queries: eager runs no kernel for them."""
    return op_base_name(op) in VIEW_OPS


@dataclass(frozen=True)
class BufferAccess:
    """A buffer a kernel reads or writes: its size in bytes (None when a size is symbolic and
    no example value was known) and the size expression as text."""

    name: str
    shape: str  # e.g. "f32[8, s0]"
    bytes: int | None
    size_expr: str = ""  # bytes as an expression of the symbolic sizes, when symbolic


@dataclass
class KernelReport:
    name: str
    kind: str  # "pointwise", "reduction" or "extern"
    ops: list[str]  # ATen ops this kernel runs
    source: str | None = None
    reads: list[BufferAccess] = field(default_factory=list)  # buffers read from memory
    writes: list[BufferAccess] = field(default_factory=list)  # buffers stored to memory
    # What eager moves for the same ops: every op reads all its inputs and writes its output.
    eager_bytes: int | None = None
    # A pointwise kernel that adds into its output at runtime indices (a scatter-add: embedding
    # backward, index_put with accumulate), atomically on a GPU.
    accumulates: bool = False

    @property
    def label(self) -> str:
        """The kind as the report shows it: a scatter-add is named as one."""
        return "scatter" if self.accumulates else self.kind

    @property
    def bytes_read(self) -> int | None:
        return _total(self.reads)

    @property
    def bytes_written(self) -> int | None:
        return _total(self.writes)


def _total(accesses: list[BufferAccess]) -> int | None:
    sizes = [a.bytes for a in accesses]
    return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]


@dataclass(frozen=True)
class AutotuneEntry:
    """How one kernel launch got its block sizes under autotuning (``mode="max-autotune"``)."""

    kernel: str
    sizes: str  # "xnumel x rnumel" of the launch
    config: str  # the config it runs with, e.g. "XBLOCK 8, RBLOCK 512, 8 warps"
    default: str  # the config the default mode uses
    how: str  # "timed", "from disk", "default: <why untimed>" or "not tuned: <why>" (C++ kernels)
    microseconds: float | None = None  # the chosen config's time per run, when timed
    default_microseconds: float | None = None  # the default's, when timed
    candidates: int = 0  # configs timed
    seconds: float = 0.0  # spent choosing (compiling or waiting for candidates, timing)


@dataclass
class GraphReport:
    name: str
    kind: str  # "forward", "backward" or "inference"
    target: str
    kernels: list[KernelReport] = field(default_factory=list)
    decisions: list[FusionDecision] = field(default_factory=list)  # refused fusions
    fusions: list[FusionDecision] = field(default_factory=list)  # fusions made
    fallbacks: list[str] = field(default_factory=list)  # ATen ops run without a lowering
    fallback_reasons: dict[str, str] = field(default_factory=dict)  # op -> why its rule declined it
    # How a graph that mixes devices keeps each kernel on one device: CPU scalars passed by
    # value, CPU kernels built for the CPU, buffers copied to the device that reads them.
    device_notes: list[str] = field(default_factory=list)
    # Reductions run in two stages because one kernel would leave the GPU idle (Triton).
    split_reductions: list[str] = field(default_factory=list)
    # Launches that run several small independent pointwise kernels (codegen/triton/combo.py):
    # the combined kernel's name -> the kernels it runs.
    combined_launches: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None  # set when compiling failed and the graph runs with ATen
    stage_seconds: dict[str, float] = field(default_factory=dict)
    aten_ops: list[str] = field(default_factory=list)  # ops of the input graph, in order
    ir_text: str = ""
    wrapper_source: str = ""
    compile_id: str | None = None  # Dynamo's "frame/attempt" id, links the graph to a function
    input_buffers: list[str] = field(default_factory=list)  # graph inputs, in call order
    output_buffers: list[str] = field(default_factory=list)
    eager_bytes: int | None = None  # bytes all ops of the graph move when run eagerly
    # Outputs returned with other strides than traced (a padded matmul result a forward graph
    # saves for its backward): position -> strides, reported to aot_autograd.
    output_strides: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Inputs whose real strides differ from the traced ones (a backward's saved tensors that the
    # forward returned padded): lowering/input_strides.py.
    input_strides: list[str] = field(default_factory=list)
    # GPU kernel name -> where its binary comes from: "compiled ahead" (in the worker pool, or
    # from the disk cache, before the first run) or "at its first launch: <why>" (Triton's JIT)
    binaries: dict[str, str] = field(default_factory=dict)
    # mode="reduce-overhead": "recorded", "replayed", and "default path: <reason>" -> calls
    # (or "not used: <reason>" when the graph cannot use CUDA graphs at all).
    cudagraphs: collections.Counter = field(default_factory=collections.Counter)
    # Autotuning (max-autotune): one entry per tuned launch, filled at first launches.
    autotune: list[AutotuneEntry] = field(default_factory=list)

    @property
    def eager_kernel_count(self) -> int:
        """Kernels eager PyTorch launches for this graph: its ops that are not views."""
        return sum(1 for op in self.aten_ops if not is_view_op(op))

    @property
    def bytes_moved(self) -> int | None:
        """Bytes the compiled kernels read and write (None if a size is unknown)."""
        sizes = [k.bytes_read for k in self.kernels] + [k.bytes_written for k in self.kernels]
        return None if not self.kernels or any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]

    @property
    def generated_kernels(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.kind != "extern"]

    def __str__(self) -> str:
        if self.kind == "eager":
            return (f"{self.name} (CPU): {len(self.aten_ops)} ops run as captured, unfused "
                    "(no C++ compiler was found, or aot_autograd failed on it: see the warning)")
        lines = [f"{self.name} ({self.kind}, target={self.target}): {len(self.generated_kernels)} generated kernels, "
                 f"{len(self.kernels) - len(self.generated_kernels)} ATen calls, from {len(self.aten_ops)} ATen ops"]
        if self.error:
            lines.append(f"  FELL BACK TO ATEN: {self.error}")
        for kernel in self.kernels:
            lines.append(f"  {kernel.name:<10} {kernel.label:<10} {', '.join(kernel.ops)}")
        for decision in self.decisions:
            lines.append(f"  not fused: {decision}")
        if self.fallbacks:
            lines.append(f"  no lowering (ran as ATen): {', '.join(sorted(set(self.fallbacks)))}")
            for op, reason in sorted(self.fallback_reasons.items()):
                lines.append(f"    {op}: {reason}")
        for note in self.device_notes:
            lines.append(f"  devices: {note}")
        if self.binaries:
            ahead = sum(1 for where in self.binaries.values() if where == "compiled ahead")
            lines.append(f"  GPU binaries: {ahead} of {len(self.binaries)} compiled ahead of the first run")
            for kernel, where in self.binaries.items():
                if where != "compiled ahead":
                    lines.append(f"    {kernel}: {where}")
        if self.cudagraphs:
            counts = ", ".join(f"{reason}: {n}" for reason, n in self.cudagraphs.items())
            lines.append(f"  CUDA graphs: {counts}")
        lines += _autotune_lines(self.autotune)
        for note in self.split_reductions:
            lines.append(f"  split: {note}")
        for launch, parts in self.combined_launches.items():
            lines.append(f"  one launch ({launch}): {', '.join(parts)}")
        if self.stage_seconds:
            times = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.stage_seconds.items())
            lines.append(f"  compile time: {times}")
        return "\n".join(lines)


def _autotune_lines(entries: list[AutotuneEntry]) -> list[str]:
    """A summary of the graph's autotuning, then each launch whose config is not the default."""
    if not entries:
        return []
    timed = [e for e in entries if e.how == "timed"]
    counts = [f"{len(timed)} launch{'' if len(timed) == 1 else 'es'} timed ({sum(e.candidates for e in timed)} candidates, "
              f"{sum(e.seconds for e in timed):.2f} s)",
              f"{sum(1 for e in entries if e.how == 'from disk')} from disk",
              f"{sum(1 for e in entries if e.how.startswith('default'))} kept their default untimed"]
    untuned = sorted({e.how for e in entries if e.how.startswith("not tuned")})
    lines = [f"  autotune: {', '.join(counts)}" + "".join(f"; {why}" for why in untuned)]
    for entry in entries:
        if entry.config != entry.default:
            speed = (f" ({entry.microseconds:.1f} us against {entry.default_microseconds:.1f})"
                     if entry.microseconds is not None and entry.default_microseconds is not None else "")
            lines.append(f"    {entry.kernel} [{entry.sizes}] {entry.how}: {entry.config}{speed}, "
                         f"default {entry.default}")
    return lines
