"""Shape-generic kernels: sizes are kernel arguments, so new shapes reuse compiled kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, assert_close, compile_strict
from torchfuse.runtime import kernel_cache


def block(x, w):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return F.silu(h) + 1


def test_dynamic_batch_and_sequence_dims():
    compiled = compile_strict(block, dynamic=True)
    w = torch.randn(48, device=DEVICE)
    for batch, seq in [(2, 5), (3, 7), (4, 11)]:
        x = torch.randn(batch, seq, 48, device=DEVICE)
        assert_close(compiled(x, w), block(x, w), reference=block(x.double(), w.double()))
    assert len(torchfuse.report().graphs) == 1  # one graph served every shape


def test_recompile_for_new_shape_reuses_compiled_kernels():
    def fn(x):
        y = torch.softmax(x * 0.5, -1)
        if x.shape[0] > 4:  # a guard on the shape: Dynamo recompiles across this line
            return y * 2
        return y

    compiled = compile_strict(fn, dynamic=True)
    compiled(torch.randn(3, 7, device=DEVICE))
    first = kernel_cache.stats.compiled
    compiled(torch.randn(6, 7, device=DEVICE))  # new graph (the branch), same softmax kernel source
    assert len(torchfuse.report().graphs) == 2
    new_sources = kernel_cache.stats.compiled - first
    # The second graph adds only the kernel for `* 2` fused after softmax, or nothing new for
    # the softmax itself: at most one new source, never one per shape.
    assert new_sources <= 1
    before = kernel_cache.stats.compiled
    torchfuse.reset()
    compile_strict(fn, dynamic=True)(torch.randn(2, 9, device=DEVICE))  # a fresh compile of a seen graph
    assert kernel_cache.stats.compiled == before


def test_mixed_float_and_integer_sums_with_symbolic_lengths():
    """A float32 sum (chunked partials) next to an integer count in one kernel: the count's
    chunk fold once added the accumulator to itself under dynamic shapes (counts doubled)."""
    fn = lambda x: (x.sum(), (x > 0).sum(), x.sum(-1), (x > 0).sum(-1), x.mean())  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    for shape in [(3, 1000), (2, 5000), (1, 300), (4, 7)]:
        x = torch.randn(shape, device=DEVICE)
        for got, want, ref in zip(compiled(x), fn(x), fn(x.double())):
            assert_close(got, want, reference=ref if want.is_floating_point() else None)


def test_cross_entropy_with_dynamic_shapes():
    fn = lambda x, t: (F.cross_entropy(x, t), F.cross_entropy(x, t, reduction="sum"))  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    for rows, vocab in [(8, 100), (12, 130), (300, 77)]:
        x, t = torch.randn(rows, vocab, device=DEVICE), torch.randint(0, vocab, (rows,), device=DEVICE)
        t[::5] = -100  # ignored positions change the count
        for got, want, ref in zip(compiled(x, t), fn(x, t), fn(x.double(), t)):
            assert_close(got, want, reference=ref)


def test_size_arithmetic_that_goes_negative_keeps_python_semantics():
    """roll's decomposition computes (n - shift) % n on sizes: negative when shift > n. C and
    Triton truncate where Python floors, so such size arithmetic must be printed sign-safe."""
    fn = lambda x: (torch.roll(x, 3, 1) + torch.roll(x, -2, 0), torch.roll(x, 5, 1))  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    for shape in [(7, 13), (4, 3), (5, 2)]:  # 2 and 3 columns: shift 5 > n
        x = torch.randn(shape, device=DEVICE).t().contiguous().t()
        for got, want in zip(compiled(x), fn(x)):
            assert_close(got, want)


def test_variance_and_interpolation_with_symbolic_sizes():
    fn = lambda x: (x.var(-1), x.std(0, correction=0), F.interpolate(x[None, None], scale_factor=2))  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    for shape in [(5, 9), (7, 4)]:
        x = torch.randn(shape, device=DEVICE)
        for got, want, ref in zip(compiled(x), fn(x), fn(x.double())):
            assert_close(got, want, reference=ref)
    assert not any(g.fallbacks for g in torchfuse.report().graphs)  # true_divide, convert_element_type lowered


def _batch_norm_relu(x, w, b):
    return torch.relu(F.batch_norm(x, None, None, w, b, training=True))


def test_a_float_of_sizes_is_computed_as_python_does():
    """A training batch norm's backward scales by ``1.0 / (N * H * W)``: with symbolic sizes a
    SymFloat (torch's ``FloatTrueDiv`` of an ``IntTrueDiv``), once printed as an integer index
    and refused on both targets (and by the wrapper, for an ATen call's argument). Kernels now
    compute it from the sizes in float64, the wrapper in Python's own arithmetic."""
    compiled = compile_strict(_batch_norm_relu, dynamic=True)
    for shape in [(2, 4, 6, 6), (3, 4, 5, 7)]:
        x = torch.randn(shape, device=DEVICE).contiguous(memory_format=torch.channels_last).requires_grad_()
        w, b = torch.randn(4, device=DEVICE, requires_grad=True), torch.randn(4, device=DEVICE, requires_grad=True)
        grad_out = torch.randn(shape, device=DEVICE)
        actual = torch.autograd.grad(compiled(x, w, b), (x, w, b), grad_out)
        expected = torch.autograd.grad(_batch_norm_relu(x, w, b), (x, w, b), grad_out)
        wide = [t.detach().double().requires_grad_() for t in (x, w, b)]
        reference = torch.autograd.grad(_batch_norm_relu(*wide), wide, grad_out.double())
        for a, e, r in zip(actual, expected, reference):
            assert_close(a, e, reference=r)
    backward = [k.source or "" for g in torchfuse.report().graphs if g.kind == "backward" for k in g.kernels]
    assert any("tl.float64" in source or "static_cast<double>" in source for source in backward)
