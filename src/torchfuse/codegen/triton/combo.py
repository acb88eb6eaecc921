"""Combined launches: several small, independent pointwise kernels run by one launch.

A model's step launches many kernels too small to matter on the GPU but not on the host: under
autocast every convolution's weight is cast to bf16 by a kernel of its own (116 a step on
EfficientNet-B0, ~1.5 us of GPU time each, ~25 us of host time each). When such kernels read
nothing another of them writes, one launch can run them all: the combined kernel's programs are
partitioned among its parts, each part running its own kernel's code on its own programs.

Which kernels combine (``plan_launch_groups``): flat pointwise kernels with static sizes
(scatters, 2-D tiles, kernels taking sizes or scalars at runtime keep their own launch) that
write no graph input in place. A kernel moves up to the open group's launch when it reads
nothing written since that launch (by a part, or by anything scheduled in between); else it
opens a group, and a kernel left alone before it may move down to it when nothing in between
reads what it writes or writes what it reads (a backward graph's weight-gradient cast, between
two convolutions' backward and before a reduction, joins the next launch). Moving changes
lifetimes (a result allocated earlier, an input kept longer): a kernel moves past at most
``MAX_EXTERNS_CROSSED`` ATen calls (the cast of the next convolution's weight moves past the
current convolution, not past the model). Groups hold at most ``MAX_PARTS`` kernels (compile
time).

How a combined kernel runs (``render_combo``): each part is its kernel's function with the program
id shifted by ``pid_offset`` (one line differs: ``flat_prologue``), called from a chain of
``if pid < end_i`` on the combined kernel's program id. The parts' boundaries are computed from
``XBLOCK`` in the kernel, and the launch's ``xnumel`` is the parts' sizes each rounded up to
``COMBO_BLOCK``: for every block size up to ``COMBO_BLOCK`` (a power of two, as the launcher and
the autotuner choose) the grid covers every part, and programs past the last part do nothing.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import sympy
import torch

from torchfuse.codegen.triton.kernel import PROGRAM_ID, PROGRAM_ID_64, TritonKernel, flat_prologue
from torchfuse.ir.graph import ScatterAdd
from torchfuse.scheduler.kernel import ExternKernel, FusedKernel

COMBO_BLOCK = 1024  # launch_configs.MAX_POINTWISE_BLOCK: the largest XBLOCK a pointwise launch gets
MAX_PARTS = 32
MAX_EXTERNS_CROSSED = 1


def combinable(kernel: TritonKernel) -> bool:
    """Whether a rendered kernel can be a part of a combined launch."""
    xnumel = sympy.sympify(kernel.xnumel)
    return (kernel.kind == "pointwise" and kernel.tile is None and not kernel.scalar_args and not kernel.size_args
            and xnumel.is_Integer and int(xnumel) > 0 and _prologue(kernel) is not None)


def _prologue(kernel: TritonKernel) -> tuple[str, str] | None:
    """The kernel's program-id line and the program id it uses, or None."""
    for pid in (PROGRAM_ID_64, PROGRAM_ID):
        line = f"    {flat_prologue(pid)}\n"
        if line in kernel.source:
            return line, pid
    return None


@dataclass
class LaunchGroup:
    """Kernels launched as one: ``at`` is the item position where the launch happens (its
    leader's), ``members`` every part's position in the old order."""

    at: int
    members: list[int]
    device: torch.device  # every part's (a launch runs on one GPU)
    written: set[str] = field(default_factory=set)  # since the leader ran, parts included
    externs_crossed: int = 0  # ATen calls between the leader and the last item seen
    leader: _Alone | None = None  # the leader's accesses, should no kernel join it


@dataclass
class _Alone:
    """A combinable kernel left in a launch of its own so far: it may still sink to a later
    group's launch if nothing after it reads what it writes or writes what it reads."""

    position: int
    device: torch.device
    reads: set[str]
    writes: set[str]
    read_after: set[str] = field(default_factory=set)
    written_after: set[str] = field(default_factory=set)
    externs_after: int = 0

    def may_sink(self, reads: set[str], writes: set[str]) -> bool:
        """Whether it can run alongside (at the place of) a kernel with these accesses."""
        return (self.externs_after <= MAX_EXTERNS_CROSSED and not self.reads & (self.written_after | writes)
                and not self.writes & (self.read_after | reads | self.written_after | writes))


def plan_launch_groups(items: Sequence[FusedKernel | ExternKernel], kernels: dict[str, TritonKernel],
                       in_place: dict[str, str]) -> list[LaunchGroup]:
    """Groups of two or more kernels that can run as one launch; see the module docstring.

    A combinable kernel joins the open group (moving up to its launch) when it reads nothing
    written since that launch; else it opens a new group, which earlier kernels left alone may
    join by moving down to it (nothing between reads what they write or writes what they read).
    """
    groups: list[LaunchGroup] = []
    open_group: LaunchGroup | None = None
    alone: list[_Alone] = []
    for position, item in enumerate(items):
        reads, writes = _accesses(item, kernels, in_place)
        if isinstance(item, FusedKernel) and _can_be_part(item, kernels, in_place):
            if (open_group is not None and len(open_group.members) < MAX_PARTS and open_group.device == item.device
                    and open_group.externs_crossed <= MAX_EXTERNS_CROSSED and not reads & open_group.written):
                open_group.members.append(position)
                open_group.written |= writes
                _seen(alone, reads, writes, extern=False)
                continue
            if open_group is not None and len(open_group.members) == 1:  # its leader was left alone
                alone.append(open_group.leader)
            sinking = [k for k in alone if k.device == item.device and k.may_sink(reads, writes)][:MAX_PARTS - 1]
            alone = [k for k in alone if k not in sinking]
            _seen(alone, reads, writes, extern=False)
            open_group = LaunchGroup(position, sorted([k.position for k in sinking] + [position]), item.device,
                                     set(writes).union(*(k.writes for k in sinking)),
                                     leader=None if sinking else _Alone(position, item.device, reads, writes))
            groups.append(open_group)
            continue
        _seen(alone, reads, writes, extern=isinstance(item, ExternKernel))
        if open_group is not None:
            open_group.written |= writes
            open_group.externs_crossed += isinstance(item, ExternKernel)
            if open_group.leader is not None:
                _seen([open_group.leader], reads, writes, extern=isinstance(item, ExternKernel))
    return [g for g in groups if len(g.members) > 1]


def _seen(alone: list[_Alone], reads: set[str], writes: set[str], extern: bool) -> None:
    """Record an item that runs after the kernels left alone (dropping those it pins down)."""
    for kernel in alone:
        kernel.read_after |= reads
        kernel.written_after |= writes
        kernel.externs_after += extern
    alone[:] = [k for k in alone if k.externs_after <= MAX_EXTERNS_CROSSED
                and not k.reads & k.written_after and not k.writes & k.read_after]


def _can_be_part(item: FusedKernel, kernels: dict[str, TritonKernel], in_place: dict[str, str]) -> bool:
    kernel = kernels.get(item.name)
    return (isinstance(kernel, TritonKernel) and combinable(kernel)
            and not any(m.node.name in in_place for m in item.members))


def _accesses(item: FusedKernel | ExternKernel, kernels: dict[str, TritonKernel],
              in_place: dict[str, str]) -> tuple[set[str], set[str]]:
    """The buffers an item reads and the memory it writes (an in-place store writes its input)."""
    if isinstance(item, ExternKernel):
        reads = set(item.node.reads())
        writes = {b.name for b in item.node.outputs}
        schema = getattr(item.node.target, "_schema", None)
        if schema is None or schema.is_mutable:
            writes |= reads  # an op that may write its arguments: nothing moves past it reading them
        return reads, writes
    kernel = kernels.get(item.name)
    reads = set(getattr(kernel, "pointer_args", ())) | set(getattr(kernel, "scalar_args", ()))
    bases = {m.node.base for m in item.members if isinstance(m.node, ScatterAdd)}  # added into
    stored = {m.node.name for m in item.members if m.stored}
    writes = stored | {in_place[name] for name in stored if name in in_place}
    return reads - stored, writes | bases


def render_combo(name: str, parts: Sequence[TritonKernel]) -> TritonKernel:
    """One kernel running ``parts`` (combinable kernels that read nothing another part writes)
    on consecutive ranges of its programs. The parts' sizes are arguments, so groups of the same
    kernels (every block of a network casting its weights) share one source and one binary."""
    functions: dict[str, str] = {}  # part function name -> its source (identical parts once)
    pointer_args: list[str] = []
    ends, calls = [], []
    for i, part in enumerate(parts):
        function = f"{part.function}_part"
        functions.setdefault(function, _part_source(part, function))
        pointers = [f"ptr{len(pointer_args) + j}" for j in range(len(part.pointer_args))]
        pointer_args += part.pointer_args
        before = f"end{i - 1} + " if i else ""
        ends.append(f"    end{i} = {before}(n{i} + XBLOCK - 1) // XBLOCK")
        calls.append(f"    {'if' if i == 0 else 'elif'} pid < end{i}:")
        calls.append(f"        {function}({', '.join(pointers)}, n{i}, {f'end{i - 1}' if i else 0}, XBLOCK)")
    params = ([f"ptr{j}" for j in range(len(pointer_args))] + [f"n{i}" for i in range(len(parts))]
              + ["xnumel", "XBLOCK: tl.constexpr"])
    body = "\n".join([f'    """combined launch of {len(parts)} pointwise kernels"""',
                      f"    pid = {PROGRAM_ID}", *ends, *calls]) + "\n"
    digest = hashlib.sha256("\n".join([*functions.values(), ", ".join(params), body]).encode()).hexdigest()[:16]
    function = f"tf_cmb_{digest}"
    source = "\n\n".join([*functions.values(), f"@jit\ndef {function}({', '.join(params)}):\n{body}"])
    sizes = [int(part.xnumel) for part in parts]
    padded = sum(-(-size // COMBO_BLOCK) * COMBO_BLOCK for size in sizes)
    origins = list(dict.fromkeys(origin for part in parts for origin in part.origins))
    return TritonKernel(name, source, pointer_args, [], sympy.Integer(padded), sympy.Integer(0), "pointwise", False,
                        origins, [], parts[0].device, function, int_args=sizes,
                        parts=tuple(part.name for part in parts))


def _part_source(part: TritonKernel, function: str) -> str:
    """The part's kernel as a function of the combined kernel: renamed, with its program ids
    starting at ``pid_offset``."""
    found = _prologue(part)
    assert found is not None, f"{part.name} is not combinable"
    line, pid = found
    source = part.source.replace(line, f"    {flat_prologue(f'({pid} - pid_offset)')}\n", 1)
    header = f"def {part.function}("
    assert header in source and "XBLOCK: tl.constexpr):" in source, f"unexpected kernel header in {part.name}"
    source = source.replace(header, f"def {function}(", 1)
    return source.replace(", XBLOCK: tl.constexpr):", ", pid_offset, XBLOCK: tl.constexpr):", 1)


def combine_launches(items: list, kernels: dict[str, TritonKernel],
                     in_place: dict[str, str]) -> tuple[list, dict[str, tuple[str, ...]], dict[str, TritonKernel]]:
    """Plan the groups and render their kernels: (the items with each group's parts moved
    together to its launch, combined kernel name -> its parts' names in launch order, combined
    kernels by name)."""
    groups = plan_launch_groups(items, kernels, in_place)
    if not groups:
        return items, {}, {}
    parts_of = {group.at: group.members for group in groups}
    moved = {position for group in groups for position in group.members}
    ordered, launch_groups, combined = [], {}, {}
    for position, item in enumerate(items):
        if position in parts_of:
            name = f"combo{len(combined)}"
            parts = [items[p] for p in parts_of[position]]
            ordered += parts
            launch_groups[name] = tuple(p.name for p in parts)
            combined[name] = render_combo(name, [kernels[p.name] for p in parts])
        elif position not in moved:
            ordered.append(item)
    return ordered, launch_groups, combined
