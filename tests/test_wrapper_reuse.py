"""The wrapper hands a dead buffer to a later one of the same size (runtime/wrapper.py), without a
``.view`` when the shapes already agree (a view is ~1 us of host time at every step)."""
from __future__ import annotations

import ast
import re

import pytest
import torch

import torchfuse
from conftest import compile_strict
from opcheck import check_outputs, floats
from test_combo_launch import _assert_like_eager, _model_and_input
from test_split_reductions import SMALL
from torchfuse.codegen.triton import split

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


@pytest.fixture(autouse=True)
def small_split(monkeypatch):  # split small reductions, so each makes a partial buffer
    monkeypatch.setattr(split, "POLICY", SMALL)


def _reuses() -> list[str]:
    return [line.strip() for g in torchfuse.report().graphs for line in g.wrapper_source.splitlines()
            if "reuse dead buffer" in line]


def test_partials_of_the_same_shape_are_reused_without_a_view():
    """Three centerings in a row: each mean's partials take the previous one's dead buffer."""
    def fn(x):
        a = (x - x.mean((0, 2, 3), keepdim=True)).relu()
        b = (a - a.mean((0, 2, 3), keepdim=True)).relu()
        return b - b.mean((0, 2, 3), keepdim=True)

    torchfuse.reset()
    x = floats((4, 6, 9, 7), torch.float32, specials=[], seed=12).to(memory_format=torch.channels_last)
    check_outputs(fn, x, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    reuses = _reuses()
    assert len(reuses) >= 2 and not any(".view(" in line for line in reuses), reuses



def _overwrites() -> list[str]:
    return [line.strip() for g in torchfuse.report().graphs for line in g.wrapper_source.splitlines()
            if "overwrites the dead buffer" in line]


@pytest.mark.parametrize("transposed", [False, True], ids=["same_element", "transposed"])
def test_a_triton_kernel_overwrites_a_dead_buffer_it_reads_element_by_element(transposed):
    """The last reader of an intermediate writes its result over it when it reads each element
    exactly where it stores (``TritonKernel.in_place``); a transposed read must not (a program
    would overwrite elements another program has yet to read)."""
    def fn(x, w):
        a = torch.sin(x) * 3
        m = a @ w  # a is stored: the matmul reads it, then the last kernel
        return ((a.t() if transposed else a) + m).cos()

    torchfuse.reset()
    x, w = floats((40, 40), torch.float32, specials=[], seed=13), floats((40, 40), torch.float32, specials=[], seed=14)
    check_outputs(fn, x, w, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    assert len(_overwrites()) == (0 if transposed else 1), _overwrites()


def test_channels_last_buffers_are_reused_at_the_same_layout():
    """A dead channels-last buffer is handed to a later one of the same shape and strides (no
    new allocation; a row-major buffer of the same size would need other strides, so none is)."""

    torchfuse.reset()
    model, x = _model_and_input(seed=7)
    model = torch.nn.Sequential(*model, *_model_and_input(seed=8)[0])
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
        got = compile_strict(model, options={"target": "triton"})(x)
    _assert_like_eager(got, model, x)
    source = torchfuse.report().graphs[-1].wrapper_source
    layouts = {name: (ast.literal_eval(shape), ast.literal_eval(strides)) for name, shape, strides in
               re.findall(r"(buf\d+) = tf_empty_\w+\((\([^)]*\)), (\([^)]*\))", source)}
    reused = [old for old in re.findall(r"= (buf\d+); del buf\d+  # reuse dead buffer", source) if old in layouts]
    channels_last = [old for old in reused if layouts[old][1] != tuple(torch.empty(layouts[old][0]).stride())]
    assert channels_last, source
