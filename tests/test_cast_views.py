"""A cast of a view of a tensor that is also cast whole becomes a view of that cast
(lowering/cast_views.py): T5's softmax backward under autocast."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import DEVICE, compile_strict
from opcheck import check_outputs, floats
from torchfuse.lowering.cast_views import share_casts_of_views

BF16 = torch.bfloat16


def _casts(gm: torch.fx.GraphModule) -> int:
    """Casts to bfloat16 in the graph."""
    return sum(1 for n in gm.graph.nodes
               if n.target == torch.ops.aten._to_copy.default and n.kwargs.get("dtype") == BF16)


def _fx(fn, *args) -> torch.fx.GraphModule:
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
        return make_fx(fn, tracing_mode="fake")(*args)


def _scores(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 8, 8, generator=gen), torch.randn(2, 3, 8, 8, generator=gen)


@pytest.mark.parametrize("whole_first", [True, False], ids=["whole-first", "view-first"])
def test_the_later_cast_becomes_a_view_of_the_earlier(whole_first):
    def fn(a, b):
        x = a * b
        if whole_first:
            return x.to(BF16).sum(0), x.view(6, 8, 8).to(BF16).float() * 2
        part = x.view(6, 8, 8).to(BF16).float() * 2
        return x.to(BF16).sum(0), part

    a, b = _scores()
    gm = _fx(fn, a, b)
    assert _casts(gm) == 2
    assert share_casts_of_views(gm) == 1
    assert _casts(gm) == 1
    for got, want in zip(gm(a, b), fn(a, b)):
        assert torch.equal(got, want)  # the same values: bitwise


def test_casts_the_graph_returns_keep_their_own_memory():
    """Returned, the two casts must not share memory: eager gives each its own, and a change to
    one would show in the other (here through the view the graph returns)."""
    def fn(a, b):
        x = a * b
        return x.to(BF16), x.view(6, 8, 8).to(BF16).transpose(1, 2)

    a, b = _scores()
    gm = _fx(fn, a, b)
    assert share_casts_of_views(gm) == 0
    assert _casts(gm) == 2
    compiled = compile_strict(fn)
    whole, part = compiled(a.to(DEVICE), b.to(DEVICE))
    before = part.clone()
    whole.add_(1)
    assert torch.equal(part, before)


def test_a_base_that_is_not_row_major_keeps_both_casts():
    def fn(a, b):
        x = (a * b).transpose(2, 3)  # a valid view of it splits a dimension, but x is not row-major
        return x.to(BF16), x.view(2, 3, 8, 2, 4).to(BF16)

    gm = _fx(fn, *_scores())
    assert share_casts_of_views(gm) == 0
    assert _casts(gm) == 2


def test_the_batch_sum_of_a_softmax_gradient_reads_its_stored_cast():
    """The score gradient is cast for a matmul (as [B*H, S, S]) and for the bias gradient's batch
    sum (as [B, H, S, S]): the sum reads the stored bfloat16 cast, not the float32 inputs."""
    p = floats((4, 3, 16, 16), torch.float32, specials=[]).softmax(-1).to(DEVICE)
    dp = floats((4, 3, 16, 16), torch.float32, specials=[], seed=1).to(DEVICE)
    v = floats((12, 16, 8), BF16, specials=[], seed=2).to(DEVICE)

    def fn(p, dp, v):
        ds = p * dp - p * (p * dp).sum(-1, keepdim=True)
        attention = torch.bmm(ds.view(12, 16, 16).to(v.dtype), v)  # v.dtype: float64 in the reference
        return attention, ds.to(v.dtype).float().sum(0)

    check_outputs(fn, p, dp, v, compiled=compile_strict(fn), scale_tol=True)
    kernels = [k for g in torchfuse.report().graphs for k in g.kernels if k.kind == "reduction"]
    batch_sum = [k for k in kernels if any(w.shape.endswith("[1, 3, 16, 16]") or w.shape.endswith("[3, 16, 16]")
                                           for w in k.writes)]
    assert batch_sum, torchfuse.report()
    for kernel in batch_sum:
        assert {r.name for r in kernel.reads}.isdisjoint({"arg0_1", "arg1_1"}), (kernel.reads, torchfuse.report())
