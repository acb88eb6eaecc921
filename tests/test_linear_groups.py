"""Linear layers on a shared input become one matmul (frontend/linear_groups.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, compile_strict
from torchfuse.diagnostics.report import report
from torchfuse.frontend import linear_groups


@pytest.fixture(autouse=True)
def merge_everywhere(monkeypatch):
    monkeypatch.setenv("TORCHFUSE_MERGE_LINEARS", "1")  # on CPU graphs too, where it is off by default


def _matmuls() -> int:
    """ATen matmul calls in the graphs compiled so far by this test."""
    return sum(line.count("aten.mm.default") + line.count("aten.addmm.default")
               for g in report().graphs for line in g.wrapper_source.splitlines() if line.lstrip().startswith("# extern"))


def _params(gen: torch.Generator, *shapes) -> list[torch.Tensor]:
    return [(torch.randn(*s, generator=gen, dtype=torch.float64) / s[-1] ** 0.5).to(DEVICE).requires_grad_()
            for s in shapes]


def block(x, wq, bq, wk, bk, wv, bv, wg, wu, wo, other):
    """Attention-style projections (with biases), a gated MLP (without), and a linear on another input."""
    q, k, v = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
    heads = lambda t: t.view(2, 80, 3, 4).transpose(1, 2)  # noqa: E731 - split the features into heads
    attn = torch.softmax(heads(q) @ heads(k).transpose(-1, -2), -1) @ heads(v)
    h = attn.transpose(1, 2).reshape(2, 80, 12) + x
    mlp = F.silu(F.linear(h, wg)) * F.linear(h, wu)
    return F.linear(mlp, wo) + F.linear(other, wo[:, :12]).sum()


def test_projections_on_one_input_share_a_matmul_and_match_eager_forward_and_backward():
    """Small weights, and 160 rows (at least ROWS_PER_FEATURE per output feature of each group,
    36 and 40): the weights' copy is cheap and both groups merge."""
    gen = torch.Generator().manual_seed(11)
    x, other = [torch.randn(2, 80, 12, generator=gen, dtype=torch.float64).to(DEVICE).requires_grad_() for _ in range(2)]
    params = _params(gen, (12, 12), (12,), (12, 12), (12,), (12, 12), (12,), (20, 12), (20, 12), (12, 20))
    before, matmuls_before = sum(linear_groups.merged.values()), _matmuls()
    out = compile_strict(block, dynamic=False)(x, *params, other)  # weights of symbolic sizes do not merge
    want = block(x, *params, other)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.square().sum(), [x, other, *params])
    want_grads = torch.autograd.grad(want.square().sum(), [x, other, *params])
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected)
    assert sum(linear_groups.merged.values()) - before == 2  # q/k/v and gate/up; `other`'s is alone
    assert linear_groups.merged["3x12+12+12"] >= 1 and linear_groups.merged["2x20+20"] >= 1
    assert "3x12+12+12" in str(report())  # the report says what was merged
    # Forward and backward: 12 matmuls where the 7 linears alone made 21.
    assert _matmuls() - matmuls_before <= 12


def test_a_view_the_split_outputs_refuse_traces_the_graph_unmerged():
    """``q.view(-1)`` needs a contiguous ``q``; as a slice of the merged output it is not, so
    aot_autograd refuses the merged graph, and the original is traced instead."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(48, 6, generator=gen, dtype=torch.float64).to(DEVICE)
    wq, wk = _params(gen, (6, 6), (6, 6))

    def fn(x, wq, wk):
        return F.linear(x, wq).view(-1) * 2 + F.linear(x, wk).view(-1)

    before, merged_before = sum(linear_groups.refused.values()), sum(linear_groups.merged.values())
    out = compile_strict(fn, dynamic=False)(x, wq, wk)
    torch.testing.assert_close(out, fn(x, wq, wk))
    assert sum(linear_groups.refused.values()) == before + 1
    assert sum(linear_groups.merged.values()) == merged_before  # only traced merges count
    assert "traced unmerged: " in str(report()) and "Cannot view" in str(report()), str(report())


def test_only_compatible_calls_merge():
    """Different input features or dtypes, a bias on one member only, or a weight computed after
    the group's first call keep their own matmuls."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(64, 8, generator=gen, dtype=torch.float64).to(DEVICE)
    w1, w2, b2 = _params(gen, (5, 8), (5, 8), (5,))
    w3 = w1.detach().float().requires_grad_()

    def fn(x, w1, w2, b2, w3):
        a = F.linear(x, w1)
        w4 = w2 * 2  # computed after ``a``: cannot join a group placed at ``a``
        return a, F.linear(x, w2, b2), F.linear(x.float(), w3), F.linear(x, w4)

    before = sum(linear_groups.merged.values())
    out = compile_strict(fn, dynamic=False)(x, w1, w2, b2, w3)
    for got, want in zip(out, fn(x, w1, w2, b2, w3)):
        torch.testing.assert_close(got, want)
    assert sum(linear_groups.merged.values()) == before


def test_a_modules_projections_merge_with_dynamic_batch_sizes():
    """Module parameters keep static sizes under ``dynamic=True``; with a symbolic batch the
    rows are unknown, so the group merges where autocast casts its weights anyway (a training
    step under AMP), and each new batch size runs the same merged graph."""
    gen = torch.Generator().manual_seed(14)
    torch.manual_seed(14)
    proj = torch.nn.ModuleList([torch.nn.Linear(16, 8) for _ in range(3)]).to(DEVICE)

    def fn(x):
        q, k, v = (p(x) for p in proj)
        return (q * k).sum(-1, keepdim=True) * v

    compiled = compile_strict(fn, dynamic=True)
    before = sum(linear_groups.merged.values())
    for batch in (3, 5, 9):
        x = torch.randn(batch, 16, generator=gen).to(DEVICE).requires_grad_()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out, want = compiled(x), fn(x)
        torch.testing.assert_close(out.float(), want.float(), rtol=3e-2, atol=3e-2)
        (got,) = torch.autograd.grad(out.float().sum(), x)
        (expected,) = torch.autograd.grad(want.float().sum(), x)
        torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)
    assert sum(linear_groups.merged.values()) - before >= 1


def test_weights_are_concatenated_only_where_it_is_cheap(monkeypatch):
    """Without a cast, merging copies the group's weights every call: in training, small weights
    (8 KB here) merge whatever the rows; without gradients, or larger (the bound lowered below
    them), a 16-row input (under 4 rows per output feature) keeps its matmuls. Under autocast
    each weight is cast anyway, the concatenation goes with the cast, and the call merges."""
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(16, 32, generator=gen).to(DEVICE)
    w1, w2 = [(torch.randn(32, 32, generator=gen) / 6).to(DEVICE).requires_grad_() for _ in range(2)]

    def fn(x, w1, w2):
        return F.linear(x, w1) * F.linear(x, w2)

    def merges(*args) -> int:
        torch._dynamo.reset()
        before = sum(linear_groups.merged.values())
        torch.testing.assert_close(compile_strict(fn, dynamic=False)(*args), fn(*args))
        return sum(linear_groups.merged.values()) - before

    assert merges(x, w1, w2) == 1
    with torch.no_grad():
        assert merges(x, w1, w2) == 0
    monkeypatch.setattr(linear_groups, "MAX_COPIED_WEIGHT_BYTES", 2 * w1.numel() * w1.element_size() - 1)
    assert merges(x, w1, w2) == 0
    torch._dynamo.reset()
    before = sum(linear_groups.merged.values())
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        got, want = compile_strict(fn, dynamic=False)(x, w1, w2), fn(x, w1, w2)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert sum(linear_groups.merged.values()) == before + 1


def test_projections_the_graph_returns_keep_their_own_matmuls():
    """Merged, returned projections would be slices of one tensor with one version counter: an
    in-place change to one could trip autograd's check on another that the backward saved,
    where eager's separate tensors would not. Calls whose results (or views of them) the graph
    returns stay apart; here only ``v``, used inside, has no partner left to merge with."""
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(8, 16, generator=gen).to(DEVICE)
    wq, wk, wv = [(torch.randn(16, 16, generator=gen) / 4).to(DEVICE).requires_grad_() for _ in range(3)]

    def fn(x, wq, wk, wv):
        q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
        return q, k.transpose(0, 1), (q * k * v).sum()

    before = sum(linear_groups.merged.values())
    got, want = compile_strict(fn, dynamic=False)(x, wq, wk, wv), fn(x, wq, wk, wv)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert sum(linear_groups.merged.values()) == before
