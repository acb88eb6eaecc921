"""Loop-invariant values of a looped Triton reduction are computed once, before the loop
(codegen/scope.py, ``CseWriter._home``): arithmetic on a reduction's result (a row's mean) used
by a later loop, and loads of kernel inputs at an index without the loop's variable (a
per-channel scale, a gathered table entry), with the arithmetic on them. Before, they were
recomputed at every step of the loop over the row: a variance's ``div_rn`` mean made batch-norm
kernels on the H200 up to 2x slower, and a squeeze-excite pool that loaded four per-channel values
and took a square root a step ran at 24% of copy bandwidth. Loads at the row's index stay in the
loop (an empty row's loop never reads), as do loads of an empty buffer. The results must not
change: checked against float64 on the interpreter."""
from __future__ import annotations

import re

import pytest
import torch

import torchfuse
from torchfuse.codegen.triton import split
from conftest import compile_strict
from opcheck import check_outputs, fallbacks, floats

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def loop_bodies(source: str) -> list[list[str]]:
    """The lines of each loop of a kernel's source over its row's blocks (``roffset``, or ``rstep``
    for one walking them backwards)."""
    bodies, current, depth = [], None, None
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip())
        if current is not None and line.strip() and indent <= depth:
            bodies.append(current)
            current = None
        if re.match(r"for (roffset|rstep) in (tl\.)?range\(", line.strip()):
            current, depth = [], indent
        elif current is not None and line.strip():
            current.append(line.strip())
    if current is not None:
        bodies.append(current)
    return bodies


def looped_sources() -> list[str]:
    sources = [k.source or "" for g in torchfuse.report().graphs for k in g.kernels]
    return [s for s in sources if re.search(r"for roffset in (tl\.)?range\(", s)]


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


def test_per_channel_loads_and_their_arithmetic_leave_the_loop(monkeypatch):
    """An inference batch norm + SiLU pooled over 3136 positions of channels-last activations
    (EfficientNet's squeeze-excite): the outer reduction's per-channel mean, variance, weight and
    bias, and the square root and reciprocal on them, come before the loop; a gathered table
    entry (a relative position bias) and its index too. Unsplit (a split's first stages here
    hold their rows in one tile). An empty batch still gives eager's."""
    torchfuse.reset()
    monkeypatch.setattr(split, "POLICY", split.SplitPolicy(min_elements=1 << 40))

    def fn(x, mean, var, weight, bias, table, index, scores):
        pooled = torch.nn.functional.silu(torch.nn.functional.batch_norm(x, mean, var, weight, bias)).mean((2, 3))
        biased = scores + table[index].view(7, 7, -1).permute(2, 0, 1)
        return pooled, biased.sum(0)

    x = floats((4, 24, 56, 56), torch.float32, specials=[], seed=11).to(memory_format=torch.channels_last)
    mean, bias = floats((24,), torch.float32, specials=[], seed=12), floats((24,), torch.float32, specials=[], seed=13)
    var, weight = floats((24,), torch.float32, specials=[], seed=14).abs() + 0.5, floats((24,), torch.float32, specials=[], seed=15)
    table = floats((13, 3), torch.float32, specials=[], seed=16)
    index = torch.randint(0, 13, (49,), generator=torch.Generator().manual_seed(17))
    scores = floats((3000, 3, 7, 7), torch.float32, specials=[], seed=18)
    compiled = compile_strict(fn, options={"target": "triton"})
    check_outputs(fn, x, mean, var, weight, bias, table, index, scores, compiled=compiled, scale_tol=True)
    assert not fallbacks()
    sources = looped_sources()
    pooling = [s for s in sources if "sqrt" in s]
    assert pooling, "the pooling over 3136 positions was expected to loop"
    for source in pooling:
        for body in loop_bodies(source):
            assert not any("sqrt" in line or re.search(r"tl\.load\(ptr\d+ \+ \(+xindex % 24\)", line) for line in body), body
    gathers = [s for s in sources if "ptr" in s and "* 3)" in s]
    for source in gathers:
        for body in loop_bodies(source):
            assert not any(re.search(r"\(tmp\d+\) \* 3", line) for line in body), body
    empty = x[:0]
    check_outputs(fn, empty, mean, var, weight, bias, table, index, scores[:0], compiled=compiled, scale_tol=True)
