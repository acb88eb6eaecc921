"""How a split reduction is oriented when its reads disagree (codegen/triton/split.py, tiling.py).

A batch norm's backward reads the gradient in one layout and x in another, in two reductions
(``sum(dy)``, ``sum(dy * x)``) that the scheduler fuses only if they split alike. They vote
together, a read shared by both counts once, and a read through a merged view (div/mod in its
offset) still votes by its first step.
"""
from __future__ import annotations

import pytest
import sympy
import torch

import torchfuse
from conftest import compile_strict
from opcheck import check_outputs, fallbacks, floats
from torchfuse.codegen.triton import split
from torchfuse.codegen.triton.tiling import Access, orientation_votes
from torchfuse.ir.symbols import FloorDiv, ModIndex
from test_split_reductions import SMALL

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")



@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    monkeypatch.setattr(split, "POLICY", SMALL)


def _reduction_kernels() -> list:
    return [k for g in torchfuse.report().graphs for k in g.kernels if k.kind == "reduction"]


@pytest.mark.parametrize("shape", [(4, 6, 9, 7), (3, 5, 11, 13)], ids=["even", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gradient_statistics_of_mixed_layouts_split_alike_and_fuse(shape, dtype):
    dy = floats(shape, dtype, specials=[], seed=3)  # NCHW, as a gradient may come back
    x = floats(shape, dtype, specials=[], seed=4).to(memory_format=torch.channels_last)

    def fn(dy, x):
        g, v = dy.float(), x.float()
        return g.sum((0, 2, 3)), (g * (v - 0.25)).sum((0, 2, 3))

    torchfuse.reset()
    check_outputs(fn, dy, x, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    assert not fallbacks(), fallbacks()
    notes = [note for g in torchfuse.report().graphs for note in g.split_reductions]
    assert len(notes) == 2 and len({note.split(": ", 1)[1] for note in notes}) == 1, notes  # the same split
    assert all("(outer)" in note for note in notes), notes  # a tie: interleaved chunks serve both reads
    # One first stage for both (it reads dy once), then a second stage each.
    kernels = _reduction_kernels()
    readers = [k for k in kernels if {"arg0_1", "arg1_1"} <= {access.name for access in k.reads}]
    assert len(kernels) == 3 and len(readers) == 1, torchfuse.report()


def test_a_read_through_a_merged_view_votes_by_its_first_step():
    x, r = sympy.symbols("x r", integer=True, nonnegative=True)
    nchw = ModIndex(FloorDiv(r, 7), 9) * 7 + ModIndex(x, 6) * 63 + FloorDiv(r, 63) * 378 + ModIndex(r, 7)
    channels_last = ModIndex(x, 6) + 6 * r
    assert orientation_votes([Access(nchw, 100)], [x], r) == (100, 0)
    assert orientation_votes([Access(channels_last, 100)], [x], r) == (0, 100)
    assert orientation_votes([Access(nchw, 100), Access(channels_last, 100)], [x], r) == (100, 100)
    symbolic = ModIndex(r, sympy.Symbol("s0", positive=True, integer=True))
    assert orientation_votes([Access(symbolic, 100)], [x], r) == (0, 0)  # no numeric step: no vote


def test_a_reduction_over_a_stored_producer_is_sized_for_its_direct_read():
    """``y`` is a graph output, so the scheduler stores it and the column sum reads it row-major
    (outer, one program per 32 outputs); through the copy its leaf read of ``x`` is inner (one
    program per output: enough). The split must plan for the read the renderer may really get."""
    x = floats((768, 40), torch.float32, specials=[], seed=5)

    def fn(x):
        y = x.t().contiguous() * 2
        return y, y.sum(0)

    torchfuse.reset()
    check_outputs(fn, x, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    notes = [note for g in torchfuse.report().graphs for note in g.split_reductions]
    assert len(notes) == 1 and "into 768" in notes[0], notes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_an_inner_split_whose_gradient_walks_the_outputs_puts_the_chunks_first(dtype):
    """Swin's patch-embedding LayerNorm weight gradient: x (NCHW, the larger vote with its row
    statistics) walks the reduced positions, g (NHWC) the channels. It splits inner with partials
    [S, C]: programs next in launch order take the next channels of one chunk (split.py)."""
    x = floats((3, 6, 9, 7), dtype, specials=[], seed=5)
    g = floats((3, 9, 7, 6), dtype, specials=[], seed=6)
    mean, rstd = floats((3, 9, 7, 1), torch.float32, specials=[], seed=7), floats((3, 9, 7, 1), torch.float32,
                                                                                  specials=[], seed=8).abs() + 0.5

    def fn(g, x, mean, rstd):
        return (g.float() * ((x.permute(0, 2, 3, 1).float() - mean) * rstd)).sum((0, 1, 2))

    torchfuse.reset()
    check_outputs(fn, g, x, mean, rstd, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    assert not fallbacks(), fallbacks()
    (note,) = [note for graph in torchfuse.report().graphs for note in graph.split_reductions]
    assert "(outer)" not in note, note
    (first,) = [k for graph in torchfuse.report().graphs for k in graph.kernels
                if k.kind == "reduction" and {"arg0_1", "arg1_1"} <= {access.name for access in k.reads}]
    (partials,) = first.writes
    assert partials.shape.endswith(", 6]"), partials  # [S, C]: the channels last
