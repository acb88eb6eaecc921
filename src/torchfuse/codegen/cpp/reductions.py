"""Reduction accumulators for C++: identities, per-element updates and results.

Each reduction of a row keeps one accumulator, updated in the innermost reduced loop under
``#pragma omp simd reduction(...)``: one partial per SIMD lane, combined at the end of the
loop. float32 (and half) sums are *chunked*: a float32 partial per chunk of ``TF_CHUNK``
elements (so at most TF_CHUNK / lanes sequential float32 additions per lane), folded into
a float64 accumulator per row. That keeps the inner loop at float32 speed while the error no
longer grows with the row length (a plain float32 accumulator loses digits as rows grow;
a float64 one costs a conversion per element). Max and min keep a separate NaN flag,
because OpenMP's ``max`` reduction (like ``maxps``) drops NaN. Integer sums and products
accumulate in unsigned types, so overflow wraps as in ATen.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torchfuse.codegen.cpp.printer import compute_dtype, literal, value_type


@dataclass(frozen=True)
class Accumulator:
    """How one reduction accumulates, as C++ text templates."""

    reduce_op: str
    dtype: torch.dtype  # the compute dtype of the values reduced
    acc_type: str  # C++ type of the accumulator
    identity: str
    omp_op: str | None  # operator of the OpenMP reduction clause; None: not vectorizable
    tracks_nan: bool = False
    part_type: str | None = None  # C++ type of a chunk's partial; None: not chunked

    @property
    def is_arg(self) -> bool:
        return self.reduce_op in ("argmax", "argmin")


def accumulator(reduce_op: str, out_dtype: torch.dtype, input_dtype: torch.dtype) -> Accumulator:
    """The accumulator of a reduction producing ``out_dtype`` from values of ``input_dtype``."""
    if reduce_op in ("argmax", "argmin"):
        dtype = compute_dtype(input_dtype)
        largest = reduce_op == "argmin"
        return Accumulator(reduce_op, dtype, value_type(dtype), _extreme(dtype, largest), None)
    if reduce_op in ("any", "all"):
        identity = "0" if reduce_op == "any" else "1"
        return Accumulator(reduce_op, torch.bool, "uint8_t", identity, "|" if reduce_op == "any" else "&")
    dtype = compute_dtype(out_dtype)
    ctype = value_type(dtype)
    if reduce_op in ("sum", "prod"):
        identity = "0" if reduce_op == "sum" else "1"
        omp = "+" if reduce_op == "sum" else "*"
        if dtype.is_floating_point:
            chunked = reduce_op == "sum" and dtype == torch.float32
            return Accumulator(reduce_op, dtype, "double" if chunked else ctype, identity, omp, False,
                               "float" if chunked else None)
        unsigned = "uint64_t" if dtype.itemsize == 8 else "uint32_t"
        return Accumulator(reduce_op, dtype, unsigned, identity, omp)
    if reduce_op in ("max", "min"):
        identity = _extreme(dtype, reduce_op == "min")
        return Accumulator(reduce_op, dtype, ctype, identity, reduce_op, dtype.is_floating_point)
    raise NotImplementedError(f"reduction {reduce_op} in a C++ kernel")


def _extreme(dtype: torch.dtype, largest: bool) -> str:
    if dtype.is_floating_point:
        return literal(float("inf") if largest else float("-inf"), dtype)
    if dtype == torch.bool:
        return "true" if largest else "false"
    info = torch.iinfo(dtype)
    return literal(info.max if largest else info.min, dtype)


@dataclass(frozen=True)
class Slot:
    """Where an accumulator lives: a variable, or one element of per-row arrays (``at``).

    An accumulator ``acc1`` has companions ``acc1_nan`` (max/min) and ``acc1_index``
    (argmax/argmin); for arrays they are indexed alike, ``acc1_nan[l]``.
    """

    name: str
    at: str = ""  # "[l]" for an element of arrays

    @property
    def value(self) -> str:
        return f"{self.name}{self.at}"

    @property
    def nan(self) -> str:
        return f"{self.name}_nan{self.at}"

    @property
    def index(self) -> str:
        return f"{self.name}_index{self.at}"


def update(acc: Accumulator, slot: Slot, value: str, index: str = "") -> list[str]:
    """Statements folding one element ``value`` (at reduced position ``index``) into ``slot``."""
    part = slot.value
    if acc.is_arg:
        return _pick(acc, slot, value, f"(int64_t)({index})")
    if acc.reduce_op in ("any", "all"):
        op = "|" if acc.reduce_op == "any" else "&"
        return [f"{part} = {part} {op} (uint8_t)({value} != 0);"]
    if acc.reduce_op == "sum":
        return [f"{part} += ({acc.part_type or acc.acc_type})({value});"]
    if acc.reduce_op == "prod":
        return [f"{part} *= ({acc.acc_type})({value});"]
    if acc.reduce_op in ("max", "min"):
        cmp = ">" if acc.reduce_op == "max" else "<"
        lines = [f"{part} = {value} {cmp} {part} ? {value} : {part};"]
        if acc.tracks_nan:
            lines.append(f"{slot.nan} = {slot.nan} | (uint8_t)({value} != {value});")
        return lines
    raise ValueError(acc.reduce_op)


def _pick(acc: Accumulator, slot: Slot, value: str, index: str) -> list[str]:
    """argmax/argmin in order: a later element wins only if strictly better, so the first
    extreme (and the first NaN) wins, as in PyTorch."""
    cmp = ">" if acc.reduce_op == "argmax" else "<"
    pick = f"({value} {cmp} {slot.value})"
    if acc.dtype.is_floating_point:
        pick = f"({pick} | (({value} != {value}) & ({slot.value} == {slot.value})))"
    return [f"{{ const bool pick = {pick};", f"  {slot.value} = pick ? {value} : {slot.value};",
            f"  {slot.index} = pick ? {index} : {slot.index}; }}"]


def combine(acc: Accumulator, total: Slot, part: Slot) -> list[str]:
    """Fold a later partial (a chunk's, or a later thread's range) into ``total``."""
    if acc.is_arg:
        return _pick(acc, total, part.value, part.index)
    if acc.reduce_op in ("sum", "prod"):
        op = "+" if acc.reduce_op == "sum" else "*"
        return [f"{total.value} = {total.value} {op} ({acc.acc_type}){part.value};"]
    if acc.reduce_op in ("any", "all"):
        op = "|" if acc.reduce_op == "any" else "&"
        return [f"{total.value} = {total.value} {op} {part.value};"]
    cmp = ">" if acc.reduce_op == "max" else "<"
    lines = [f"{total.value} = {part.value} {cmp} {total.value} ? {part.value} : {total.value};"]
    if acc.tracks_nan:
        lines.append(f"{total.nan} = {total.nan} | {part.nan};")
    return lines


def declarations(acc: Accumulator, name: str, part: bool = False, length: str = "") -> list[str]:
    """Declare an accumulator (``part``: a chunk's partial) at its identity; with ``length``,
    arrays of that many accumulators (one per row of a tile)."""
    ctype = acc.part_type if part else acc.acc_type
    decls = [(ctype, name, acc.identity)]
    if acc.tracks_nan:
        decls.append(("uint8_t", f"{name}_nan", "0"))
    if acc.is_arg:
        decls.append(("int64_t", f"{name}_index", "0"))
    if not length:
        return [f"{t} {n} = {v};" for t, n, v in decls]
    lines = [f"{t} {n}[{length}];" for t, n, _ in decls]
    inits = " ".join(f"{n}[l] = {v};" for _, n, v in decls)
    return lines + [f"for (int64_t l = 0; l < {length}; ++l) {{ {inits} }}"]


def clauses(acc: Accumulator, name: str) -> list[str]:
    """OpenMP reduction clauses for an accumulator of a simd loop."""
    found = [f"reduction({acc.omp_op}:{name})"]
    if acc.tracks_nan:
        found.append(f"reduction(|:{name}_nan)")
    return found


def result(acc: Accumulator, slot: Slot, out_dtype: torch.dtype) -> str:
    """The reduction's value (in ``out_dtype``'s compute type) from its accumulator."""
    if acc.is_arg:
        return slot.index
    if acc.reduce_op in ("any", "all"):
        return f"({slot.value} != 0)"
    target = value_type(out_dtype)
    if acc.tracks_nan:
        nan = literal(float("nan"), compute_dtype(out_dtype))
        return f"({slot.nan} ? {nan} : ({target}){slot.value})"
    if out_dtype == torch.bool:
        return f"({slot.value} != 0)"
    return f"({target})({slot.value})"
