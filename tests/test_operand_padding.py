"""16-bit CUDA matmuls whose operands have unaligned rows multiply zero-padded copies
(lowering/operand_padding.py): BERT's LM-head backward, ``g @ W`` and ``g.t() @ x`` with ``g``
[tokens, 30522], shares one padded ``g``; the bias gradient ``g.sum(0)`` reads it too."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import assert_close, to_float64
from torchfuse.lowering.operand_padding import pad_unaligned_operands

aten = torch.ops.aten


def lm_head_backward(logits, w, x):
    g = torch.softmax(logits.float(), dim=-1).to(logits.dtype)  # a generated producer of g
    return g @ w, g.t() @ x, g.sum(0)


def _traced_for_cuda(fn, *shapes, dtype=torch.bfloat16):
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(shape, dtype=dtype, device="cuda") for shape in shapes]
    return make_fx(fn, tracing_mode="fake")(*fakes)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_lm_head_backward_shares_one_padded_gradient_and_keeps_eager_values():
    gm = _traced_for_cuda(lm_head_backward, (8192, 30522), (30522, 768), (8192, 768))
    assert pad_unaligned_operands(gm) == 2
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    # g padded once along its columns (shared by both products and the sum), W along its rows
    assert sorted(tuple(n.args[1]) for n in pads) == [(0, 0, 0, 6), (0, 6)]
    g_pad = next(n for n in pads if tuple(n.args[1]) == (0, 6))
    assert len([u for u in g_pad.users]) == 3  # two transposed/direct matmul reads and the sum's slice
    products = [n for n in gm.graph.nodes if n.target is aten.mm.default]
    assert [tuple(n.meta["val"].shape) for n in products] == [(8192, 768), (30528, 768)]
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert [tuple(o.meta["val"].shape) for o in outputs] == [(8192, 768), (30522, 768), (30522,)]
    assert [o.meta["val"].stride() for o in outputs[:2]] == [(768, 1), (768, 1)]
    # device-agnostic: run the rewritten graph on the CPU against the function, float64 deciding
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen).bfloat16() for s in ((64, 30522), (30522, 768), (64, 768))]
    got, want = gm(*args), lm_head_backward(*args)
    reference = lm_head_backward(*to_float64(args))
    for a, e in zip(got, want):
        assert a.stride() == e.stride()
    assert_close(list(got), list(want), reference=list(reference))


def test_the_padded_copy_is_made_at_its_first_matmul_and_earlier_sums_read_the_source():
    def weight_first(w, g, x):
        early = g.sum(0)  # before any matmul: reads g itself
        return early, g @ w, g.t() @ x

    gm = _traced_for_cuda(weight_first, (30522, 768), (8192, 30522), (8192, 768))
    assert pad_unaligned_operands(gm) == 2
    order = [n for n in gm.graph.nodes]
    first_mm = next(i for i, n in enumerate(order) if n.target is aten.mm.default)
    pads = [i for i, n in enumerate(order) if n.target is aten.constant_pad_nd.default]
    assert all(first_mm - 4 <= i < first_mm for i in pads)  # next to the first matmul, not at the inputs
    total = next(n for n in order if n.target is aten.sum.dim_IntList)
    assert total.args[0].op == "placeholder"  # the early sum still reads g
    gm.graph.lint()


@pytest.mark.parametrize("why, fn, shapes, dtype", [
    ("aligned", lambda g, w, x: (g @ w, g.t() @ x), ((8192, 30528), (30528, 768), (8192, 768)), torch.bfloat16),
    ("float32", lambda g, w, x: (g @ w, g.t() @ x), ((8192, 30522), (30522, 768), (8192, 768)), torch.float32),
    ("small", lambda g, w, x: (g @ w, g.t() @ x), ((8, 30), (30, 16), (8, 16)), torch.bfloat16),
])
def test_matmuls_that_need_no_padding_are_left_alone(why, fn, shapes, dtype):
    gm = _traced_for_cuda(fn, *shapes, dtype=dtype)
    assert pad_unaligned_operands(gm) == 0, why


def test_addmm_with_a_full_bias_keeps_its_rows_but_pads_k():
    fn = lambda bias, row, g, w: (torch.addmm(bias, g.t(), w), torch.addmm(row, g.t(), w))  # noqa: E731
    gm = _traced_for_cuda(fn, (30522, 768), (768,), (8192, 30522), (8192, 768))
    assert pad_unaligned_operands(gm) == 1  # only the row-broadcast bias allows the extra rows


def test_cpu_matmuls_are_not_padded():
    gm = make_fx(lambda g, w: g @ w)(torch.randn(8192, 30522, dtype=torch.bfloat16)[:4], torch.randn(30522, 8, dtype=torch.bfloat16))
    assert pad_unaligned_operands(gm) == 0


@pytest.mark.gpu
def test_bert_lm_head_training_step_pads_and_matches_float64():
    torch.manual_seed(0)
    head = torch.nn.Linear(768, 30522).cuda()
    x = torch.randn(1024, 768, device="cuda", requires_grad=True)
    labels = torch.randint(0, 30522, (1024,), device="cuda")

    def step(fn):
        for t in (x, *head.parameters()):
            t.grad = None
        with torch.autocast("cuda", torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(fn(x).float(), labels)
        loss.backward()
        return [loss.detach(), x.grad, *(p.grad for p in head.parameters())]

    eager = step(head)
    compiled = step(torchfuse.compile(head, options={"strict": True}))
    head64 = torch.nn.Linear(768, 30522).cuda().double()
    head64.load_state_dict(head.state_dict())
    x64 = x.detach().double().requires_grad_()
    loss64 = torch.nn.functional.cross_entropy(head64(x64), labels)
    loss64.backward()
    assert_close(compiled, eager, torch.bfloat16, reference=[loss64.detach(), x64.grad, head64.weight.grad, head64.bias.grad])
    backward = [g for g in torchfuse.report().graphs if g.kind == "backward"]
    assert backward and "30528" in backward[-1].wrapper_source  # the padded gradient's width
