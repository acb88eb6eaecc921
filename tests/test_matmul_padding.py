"""16-bit CUDA matmuls with an odd row length get a result with aligned rows (lowering/matmul_padding.py):
an ``out=`` matmul into padded-stride memory, the operands as they are (no padded weight copy)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import assert_close, compile_strict
from torchfuse.lowering.matmul_padding import (addmm_into_padded_rows, mm_into_padded_rows, pad_unaligned_matmuls,
                                              padded_output_strides)

aten = torch.ops.aten


def lm_head_and_biased(a, w, bias):
    return torch.mm(a, w.t()), torch.addmm(bias, a, w.t()), torch.addmm(bias.narrow(0, 0, 8).unsqueeze(1), a.narrow(0, 0, 8), w.narrow(0, 0, 8).t())


def _traced_for_cuda(fn, *shapes, dtype=torch.bfloat16):
    """``fn`` traced with fake CUDA tensors (no GPU needed): the rewrite decides on the metadata."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(shape, dtype=dtype, device="cuda") for shape in shapes]
    return make_fx(fn, tracing_mode="fake")(*fakes)


def test_rewrite_pads_the_rows_and_gives_eager_values_and_layout():
    gm = _traced_for_cuda(lm_head_and_biased, (4096, 768), (50257, 768), (50257,))
    assert pad_unaligned_matmuls(gm) == 2  # the [8, 8] addmm is too small to pay off
    padded = [n for n in gm.graph.nodes if n.target in (mm_into_padded_rows, addmm_into_padded_rows)]
    assert [tuple(n.meta["val"].stride()) for n in padded] == [(50264, 1)] * 2
    assert not any(n.target is aten.constant_pad_nd.default for n in gm.graph.nodes)  # no padded weight
    # The rewritten graph is device-agnostic: run it on the CPU against the original function.
    gen = torch.Generator().manual_seed(0)
    a, w, bias = (torch.randn(shape, generator=gen).bfloat16() for shape in ((64, 768), (50257, 768), (50257,)))
    for got, want in zip(gm(a, w, bias), lm_head_and_biased(a, w, bias)):
        assert got.stride() == want.stride()
        assert torch.equal(got, want)


@pytest.mark.parametrize("n", [7, 13, 16])
@pytest.mark.parametrize("bias_shape", ["row", "matrix", "column", "scalar"])
def test_padded_calls_split_the_columns_and_keep_beta_and_alpha(n, bias_shape):
    """The aligned columns and the rest are two matmuls; every bias shape addmm broadcasts."""
    gen = torch.Generator().manual_seed(n)
    a, b = torch.randn(5, 16, generator=gen), torch.randn(16, n, generator=gen)
    bias = torch.randn({"row": (n,), "matrix": (5, n), "column": (5, 1), "scalar": ()}[bias_shape], generator=gen)
    width = -(-n // 4) * 4 + 4
    got = addmm_into_padded_rows(bias, a, b, width, beta=0.5, alpha=2.0)
    assert got.shape == (5, n) and got.stride() == (width, 1)
    torch.testing.assert_close(got, torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
    torch.testing.assert_close(mm_into_padded_rows(a, b, width), torch.mm(a, b))


@pytest.mark.parametrize("reason, shapes, dtype", [
    ("aligned already", ((4096, 768), (50256, 768), (50256,)), torch.bfloat16),
    ("float32", ((4096, 768), (50257, 768), (50257,)), torch.float32),
    ("odd inner dim", ((4096, 767), (50257, 767), (50257,)), torch.bfloat16),
])
def test_rewrite_leaves_other_matmuls_alone(reason, shapes, dtype):
    gm = _traced_for_cuda(lambda a, w, b: torch.addmm(b, a, w.t()), *shapes, dtype=dtype)
    assert pad_unaligned_matmuls(gm) == 0, reason


@pytest.mark.gpu
def test_odd_width_matmul_on_the_gpu_matches_eager_and_returns_the_padded_rows():
    """Inference: the returned logits are the padded result (rows of 1008), what the graph
    computes from them has eager's strides."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(512, 256, generator=gen).to("cuda", torch.bfloat16)
    w = torch.randn(1001, 256, generator=gen).to("cuda", torch.bfloat16)

    def fn(a, w):
        logits = a @ w.t()
        return logits, torch.relu(logits) * 2

    got, want = compile_strict(fn)(a, w), fn(a, w)
    assert got[0].stride() == (1008, 1) and got[1].stride() == want[1].stride()
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    # The matmul writes rows of 1008 elements; no padded copy of the weight is made.
    ops = [op for g in torchfuse.report().graphs for k in g.kernels for op in k.ops]
    assert any("mm_into_padded_rows" in op for op in ops) and not any("constant_pad_nd" in op for op in ops), ops


def test_an_inference_result_only_returned_keeps_the_padded_stride():
    """No copy of a result the graph only returns (the copy doubled GPT-2's logits at the peak):
    eager's values and shape, a row stride of the padded width."""
    gm = _traced_for_cuda(lambda a, w: torch.mm(a, w.t()), (4096, 768), (50257, 768))
    assert pad_unaligned_matmuls(gm, padded_from=0) == 1
    assert not any(n.target is aten.clone.default for n in gm.graph.nodes)
    gen = torch.Generator().manual_seed(1)
    a, w = (torch.randn(shape, generator=gen).bfloat16() for shape in ((64, 768), (50257, 768)))
    got, want = gm(a, w), a @ w.t()
    assert got.shape == want.shape and got.stride() == (50264, 1)
    assert torch.equal(got, want)


def test_a_result_returned_through_a_reshape_of_its_rows_keeps_the_padded_stride():
    """GPT-2's logits leave the graph as ``_unsafe_view(mm, [batch, tokens, vocab])``."""
    def lm_head(a, w):
        return torch.ops.aten._unsafe_view(torch.mm(a, w.t()), [2, 8, 50257])

    # 16 rows: above the rewrite's size floor, and a CPU bf16 matmul of seconds, not minutes
    gm = _traced_for_cuda(lm_head, (16, 768), (50257, 768))
    assert pad_unaligned_matmuls(gm, padded_from=0) == 1
    assert not any(n.target is aten.clone.default for n in gm.graph.nodes)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (list, tuple)) else out
    assert out.target is aten.view.default and out.meta["val"].stride() == (8 * 50264, 50264, 1)
    gen = torch.Generator().manual_seed(4)
    a, w = (torch.randn(shape, generator=gen).bfloat16() for shape in ((16, 768), (50257, 768)))
    got, want = gm(a, w), lm_head(a, w)
    assert got.shape == want.shape and torch.equal(got, want)


def test_a_reshape_across_rows_keeps_eager_layout():
    gm = _traced_for_cuda(lambda a, w: torch.mm(a, w.t()).reshape(-1), (4096, 768), (50257, 768))
    assert pad_unaligned_matmuls(gm, padded_from=0) == 1
    assert any(n.target is aten.clone.default for n in gm.graph.nodes)


def test_a_result_also_read_in_the_graph_is_returned_padded_and_read_through_the_copy():
    """The output is the padded result; the graph's own readers read the contiguous copy (which
    their kernels inline). Outputs before ``padded_from`` (a forward graph's user outputs), and
    every output when it is None, keep eager's layout."""
    def returned_and_used(a, w):
        logits = torch.mm(a, w.t())
        return logits, logits.float().logsumexp(1), logits.view(2, 8, 50257)

    gen = torch.Generator().manual_seed(5)
    a, w = (torch.randn(shape, generator=gen).bfloat16() for shape in ((16, 768), (50257, 768)))
    want = returned_and_used(a, w)
    for padded_from, padded in ((0, {0, 2}), (1, {2}), (3, set()), (None, set())):
        gm = _traced_for_cuda(returned_and_used, (16, 768), (50257, 768))
        assert pad_unaligned_matmuls(gm, padded_from=padded_from) == 1
        assert any(n.target is aten.clone.default for n in gm.graph.nodes)  # logsumexp reads it
        assert set(padded_output_strides(gm)) == padded
        got = gm(a, w)
        for position, (g, e) in enumerate(zip(got, want)):
            assert torch.equal(g, e)
            if g.dim() > 1:
                assert (g.stride()[-2] == 50264) == (position in padded), (padded_from, position, g.stride())


def test_a_view_the_padded_strides_cannot_take_keeps_the_copy():
    """A view merging rows into a longer last dim cannot read padded rows: that output stays."""
    gm = _traced_for_cuda(lambda a, w: torch.mm(a, w.t()).view(2048, 2, 50257), (4096, 768), (50257, 768))
    assert pad_unaligned_matmuls(gm, padded_from=0) == 1
    assert padded_output_strides(gm) == {0: (2 * 50264, 50264, 1)}
    flat = _traced_for_cuda(lambda a, w: torch.mm(a, w.t()).view(-1), (4096, 768), (50257, 768))
    assert pad_unaligned_matmuls(flat, padded_from=0) == 1
    assert padded_output_strides(flat) == {} and any(n.target is aten.clone.default for n in flat.graph.nodes)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [(), (2,)], ids=["2d", "3d"])
def test_gpt2_like_logits_are_held_once_at_the_peak(batch):
    """An LM head's logits returned from an inference graph: one result at the peak, not two,
    and no padded copy of the weight (77 MB at GPT-2's size): the peak is eager's (the padded
    rows add 7 columns, 29 KB, to the 206 MB result). A 3-D input makes the logits a view of
    the matmul's result ([2, 1024, 50257]), as in GPT-2."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(*batch, 2048 // (batch[0] if batch else 1), 768, generator=gen).to("cuda", torch.bfloat16)
    w = torch.randn(50257, 768, generator=gen).to("cuda", torch.bfloat16)

    def head(a, w):
        return torch.nn.functional.linear(torch.nn.functional.gelu(a), w)

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.no_grad():
            out = fn(a, w)
        torch.cuda.synchronize()
        return out, torch.cuda.max_memory_allocated() - before

    compiled = compile_strict(head)
    with torch.no_grad():
        compiled(a, w)  # compile outside the measured call
    want, eager_peak = peak(head)
    del want
    got, compiled_peak = peak(compiled)
    # cuBLAS sums the padded matmul in another order than eager's: compare both with float64.
    with torch.no_grad():
        exact = torch.nn.functional.linear(torch.nn.functional.gelu(a.double()), w.double())
        eager_error = (head(a, w).double() - exact).abs().max().item()
        error = (got.double() - exact).abs().max().item()
    assert error <= 1.5 * eager_error, (error, eager_error)
    del exact
    assert got.stride()[-2:] == (50264, 1)
    padded_rows = 2048 * 7 * 2
    assert compiled_peak <= eager_peak + padded_rows + (1 << 20), (compiled_peak, eager_peak)


def test_a_forward_graph_pads_its_saved_outputs_only_when_aot_autograd_collects_strides():
    """A forward graph's outputs from the first saved one on may be padded only while
    aot_autograd collects the forward's output strides (it restrides the backward's inputs with
    them); the strides reported are one entry per output, None for the unchanged ones."""
    from types import SimpleNamespace

    from torch._guards import TracingContext, tracing

    from torchfuse import pipeline
    from torchfuse.diagnostics.model import GraphReport

    def forward(a, w):  # the loss (a user output), then the logits saved for the backward
        logits = torch.mm(a, w.t())
        return logits.float().logsumexp(1).sum(), logits

    assert pipeline.padded_outputs_from("forward") is None  # no tracing context: nothing padded
    assert pipeline.padded_outputs_from("inference") == 0
    assert pipeline.padded_outputs_from("backward") is None
    context = TracingContext(None)
    context.fw_metadata = SimpleNamespace(num_forward=1)
    with tracing(context):
        assert pipeline.padded_outputs_from("forward") is None  # strides not collected
        context.output_strides = []
        assert pipeline.padded_outputs_from("forward") == 1
        gm = _traced_for_cuda(forward, (4096, 768), (50257, 768))
        assert pad_unaligned_matmuls(gm, padded_from=pipeline.padded_outputs_from("forward")) == 1
        report = GraphReport("g", "forward", "triton", output_strides=padded_output_strides(gm))
        pipeline._report_output_strides(pipeline.CompileState(gm, [], None, "triton", report))
        assert context.output_strides == [None, (50264, 1)]


@pytest.mark.gpu
def test_a_training_step_saves_the_padded_logits_and_its_backward_reads_them():
    """BERT's LM head and loss in training: the forward saves the padded logits (no contiguous
    copy), aot_autograd gives the backward graph those strides, and the loss and every gradient
    are eager's against a float64 step."""
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(2048, 256, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    w = (torch.randn(3001, 256, generator=gen) * 0.05).to("cuda", torch.bfloat16).requires_grad_()
    b = (torch.randn(3001, generator=gen) * 0.1).to("cuda", torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 3001, (2048,), generator=gen).cuda()

    def loss_of(h, w, b):
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w, b).float(), labels)

    def step(fn, *params):
        loss = fn(*params)
        return (loss, *torch.autograd.grad(loss, params))

    compiled = torchfuse.compile(loss_of, options={"strict": True})
    got, want = step(compiled, h, w, b), step(loss_of, h, w, b)
    reference = step(loss_of, *(p.detach().double().requires_grad_() for p in (h, w, b)))
    assert_close(list(got), list(want), torch.bfloat16, reference=list(reference))
    forward = next(g for g in torchfuse.report().graphs if g.kind == "forward")
    assert list(forward.output_strides.values()) == [(3008, 1)], forward.output_strides
    # no generated kernel writes a contiguous copy of the logits (readers inline the padded
    # result; the matmul, an extern, writes the padded one)
    written = [w.shape for k in forward.kernels if k.kind != "extern" for w in k.writes]
    assert "bf16[2048, 3001]" not in written, written
