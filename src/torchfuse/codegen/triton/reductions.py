"""Reduction combine text for Triton: identities, accumulation and the final reduce."""
from __future__ import annotations

import re

import torch

from torchfuse.codegen.triton.ops import HELPERS as OP_HELPERS
from torchfuse.codegen.triton.printer import compute_dtype, tl_dtype

# Helper functions, emitted in the kernel modules that call them (``helpers_for``); the module
# supplies ``jit`` and ``tl``.
# (The elementwise ones come from ``ops.HELPERS``.)
HELPERS = OP_HELPERS + '''
@jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@jit
def _add(a, b):
    return a + b


@jit
def _prod(a, b):
    return a * b


@jit
def _max(a, b):
    return tl.maximum(a, b)


@jit
def _min(a, b):
    return tl.minimum(a, b)


@jit
def _rescale(old, new):
    # online_softmax.py: exp(old - new), 1 where the maxima are equal (nothing summed yet, or
    # both +inf)
    return tl.where(old == new, 1.0, tl.exp(old - new))


@jit
def _argmax_combine(a, a_index, b, b_index):
    # NaN counts as the largest value; ties go to the smaller index (as in PyTorch).
    a_nan = a != a
    b_nan = b != b
    pick_a = (a > b) | (a_nan & ~b_nan) | ((a == b) & (a_index < b_index)) | (a_nan & b_nan & (a_index < b_index))
    return tl.where(pick_a, a, b), tl.where(pick_a, a_index, b_index)


@jit
def _argmin_combine(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    pick_a = (a < b) | (a_nan & ~b_nan) | ((a == b) & (a_index < b_index)) | (a_nan & b_nan & (a_index < b_index))
    return tl.where(pick_a, a, b), tl.where(pick_a, a_index, b_index)
'''


def _helper_blocks(text: str) -> dict[str, str]:
    """Each ``@jit`` helper of ``text`` by its name."""
    blocks = {}
    for block in text.split("@jit\n")[1:]:
        name = block[len("def "):block.index("(")]
        blocks[name] = "@jit\n" + block.rstrip() + "\n"
    return blocks


_HELPER_BLOCKS = _helper_blocks(HELPERS)
_HELPER_NAME = re.compile(r"\b(" + "|".join(map(re.escape, _HELPER_BLOCKS)) + r")\b")


def helpers_for(source: str) -> str:
    """The helpers ``source`` names, with the helpers they name in turn. Each ``@jit`` function a
    module defines costs its import a ``JITFunction`` (~0.4 ms: source inspection and hashing);
    all twelve in every kernel module were a fifth of MobileNetV3's kernel stage."""
    needed, pending = set(), set(_HELPER_NAME.findall(source))
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending |= set(_HELPER_NAME.findall(_HELPER_BLOCKS[name])) - needed
    return "\n\n".join(block for name, block in _HELPER_BLOCKS.items() if name in needed)


def accumulator_dtype(reduce_op: str, dtype: torch.dtype, input_dtype: torch.dtype) -> torch.dtype:
    """The dtype accumulated in: the input's for arg-reductions, int8 for any/all."""
    if reduce_op in ("argmax", "argmin"):
        return compute_dtype(input_dtype)
    if reduce_op in ("any", "all"):
        return torch.int8
    return compute_dtype(dtype)


def identity(reduce_op: str, dtype: torch.dtype) -> str:
    if reduce_op == "sum" or reduce_op == "any":
        return "0"
    if reduce_op in ("prod", "all"):
        return "1"
    largest = reduce_op in ("min", "argmin")
    if dtype.is_floating_point:
        return 'float("inf")' if largest else 'float("-inf")'
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    if info is None:
        return "1" if largest else "0"
    return str(info.max if largest else info.min)


def combine(reduce_op: str, acc: str, value: str, dtype: torch.dtype) -> str:
    """Elementwise combine of an accumulator tile with a new tile (looped reductions)."""
    if reduce_op == "sum":
        return f"{acc} + {value}"
    if reduce_op == "prod":
        return f"{acc} * {value}"
    if reduce_op in ("max", "any"):
        return f"_max_nan({acc}, {value})" if dtype.is_floating_point else f"tl.maximum({acc}, {value})"
    if reduce_op in ("min", "all"):
        return f"_min_nan({acc}, {value})" if dtype.is_floating_point else f"tl.minimum({acc}, {value})"
    raise ValueError(reduce_op)


def final_reduce(reduce_op: str, tile: str, dtype: torch.dtype, axis: int = 1) -> str:
    """Reduce a tile over its reduced ``axis`` (1 in [XBLOCK, RBLOCK], 0 in an outer
    [RBLOCK, XBLOCK]), keeping that axis as size 1."""
    # Only tl.reduce with our own combine functions: Triton's library reductions are
    # themselves jit functions, which its interpreter cannot call (see docs/decisions.md).
    fn = {"sum": "_add", "prod": "_prod"}.get(reduce_op)
    if reduce_op in ("max", "any"):
        fn = "_max_nan" if dtype.is_floating_point else "_max"
    elif reduce_op in ("min", "all"):
        fn = "_min_nan" if dtype.is_floating_point else "_min"
    if fn is None:
        raise ValueError(reduce_op)
    keep = "[:, None]" if axis == 1 else "[None, :]"
    return f"tl.reduce({tile}, {axis}, {fn}){keep}"


def dtype_text(dtype: torch.dtype) -> str:
    return tl_dtype(dtype)
