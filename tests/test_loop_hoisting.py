"""Loop-invariant values of a looped Triton reduction are computed once, before the loop
(codegen/scope.py, ``CseWriter._home``): arithmetic on a reduction's result (a row's mean) used
by a later loop. Memory loads stay in the loop (an empty row's loop never reads). Before, they were recomputed at every step of the
loop over the row; a variance's ``div_rn`` mean there made batch-norm kernels on the H200 up to
2x slower. The results must not change: checked against float64 on the interpreter."""
from __future__ import annotations

import re

import pytest
import torch

import torchfuse
from conftest import compile_strict
from opcheck import check_outputs, fallbacks, floats

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def loop_bodies(source: str) -> list[list[str]]:
    """The lines of each ``for roffset`` loop of a kernel's source."""
    bodies, current, depth = [], None, None
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip())
        if current is not None and line.strip() and indent <= depth:
            bodies.append(current)
            current = None
        if line.strip().startswith("for roffset in range"):
            current, depth = [], indent
        elif current is not None and line.strip():
            current.append(line.strip())
    if current is not None:
        bodies.append(current)
    return bodies


def looped_sources() -> list[str]:
    sources = [k.source or "" for g in torchfuse.report().graphs for k in g.kernels]
    return [s for s in sources if "for roffset in range" in s]


def register_arithmetic(line: str) -> bool:
    """A statement computing only from a register and constants (a row's mean or scale)."""
    return re.search(r"= (tl\.div_rn\(red\d+, |\(red\d+ [-+*/] [\d.]+\))", line) is not None


def test_batch_norm_statistics_divide_once_per_row():
    """Channels-last batch-norm statistics over 6272 elements a channel (a looped reduction):
    the mean's div_rn sits before the loops, and the output matches."""
    torchfuse.reset()

    def fn(x, weight, bias):
        return torch.nn.functional.hardswish(torch.nn.functional.batch_norm(x, None, None, weight, bias, True))

    x = (floats((8, 32, 28, 28), torch.float32, specials=[], seed=3) * 2 + 1).to(memory_format=torch.channels_last)
    weight, bias = floats((32,), torch.float32, specials=[], seed=6), floats((32,), torch.float32, specials=[], seed=7)
    check_outputs(fn, x, weight, bias, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    assert not fallbacks()
    sources = looped_sources()
    assert sources, "the statistics were expected to loop over their 6272 elements"
    for source in sources:
        for body in loop_bodies(source):
            assert not any(register_arithmetic(line) for line in body), (body, source)
    assert any("tl.div_rn(red" in source for source in sources)


def test_a_later_loop_uses_the_first_loops_result_computed_once():
    """Rows long enough to loop: the max (a register) scaled by a constant is used inside the
    second loop, computed outside it; an empty row still gives eager's result."""
    torchfuse.reset()

    def fn(x, empty):
        shifted = x - x.amax(1, keepdim=True) / 3.0
        return shifted.exp().sum(1), torch.logsumexp(empty, 1), empty.amax(0) if empty.shape[1] else empty.sum(1)

    x = floats((5, 30000), torch.float32, specials=[], seed=4)
    empty = torch.empty(4, 0)
    check_outputs(fn, x, empty, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    sources = looped_sources()
    assert sources
    assert any("(red" in line and "/ 3.0" in line for source in sources for line in source.splitlines())
    for source in sources:
        for body in loop_bodies(source):
            assert not any(register_arithmetic(line) for line in body), body
