"""Indexing and creation rules: correct against eager (float64 reference), not fallen back, fused.

Sizes are odd and small (the Triton interpreter is slow); inputs are fresh random tensors,
some non-contiguous (transposed) or broadcast; index tensors are int64 and int32.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, assert_close, compile_strict, generated_kernel_count, to_float64


def randn(*shape, transposed=False):
    if transposed:  # a non-contiguous view with the requested shape
        return torch.randn(*reversed(shape), device=DEVICE).t() if len(shape) == 2 else \
            torch.randn(*reversed(shape), device=DEVICE).permute(*reversed(range(len(shape))))
    return torch.randn(*shape, device=DEVICE)


def randint(high, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, device=DEVICE, dtype=dtype)


def fallbacks() -> list[str]:
    return [op for graph in torchfuse.report().graphs for op in graph.fallbacks]


def check(fn, *args, dynamic=None, allowed=()):
    """Compile ``fn``, compare with eager (float64 reference) and check nothing fell back."""
    compiled = compile_strict(fn, dynamic=dynamic)
    expected = fn(*args)
    reference = fn(*to_float64(args)) if any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args) else None
    assert_close(compiled(*args), expected, reference=reference)
    unexpected = [op for op in fallbacks() if op not in allowed]
    assert not unexpected, f"fell back to ATen: {unexpected}"
    return compiled


# -- creation ---------------------------------------------------------------------------------
def test_full_zeros_ones_fuse_into_their_reader():
    fn = lambda x: x + torch.full((7, 13), 2.5, device=x.device) + torch.zeros(7, 13, device=x.device) + torch.ones(13, device=x.device)
    check(fn, randn(7, 13))
    assert generated_kernel_count() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_like_ops_follow_input_dtype(dtype):
    x = randn(13, 7, transposed=True).to(dtype)
    fn = lambda x: (torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 3), torch.empty_like(x).fill_(1) * x)
    if dtype == torch.bool:
        fn = lambda x: (torch.zeros_like(x), torch.ones_like(x) & x, torch.full_like(x, True), torch.empty_like(x).fill_(0) | x)
    check(fn, x)


def test_new_and_empty_and_fill():
    fn = lambda x, v: (x.new_zeros(3, 5) + x[:3, :5], torch.empty(7, 13, device=x.device).fill_(1.5) * x,
                       x.new_full((7, 13), -2.0) + x, x.clone().fill_(v) + x)
    check(fn, randn(7, 13), torch.tensor(2.5, device=DEVICE))


@pytest.mark.parametrize(
    "start, end, step, dtype",
    [(0, 13, 1, None), (-5, 8, 1, None), (12, -1, -1, None), (1, 27, 2, torch.int32),
     (0.5, 7.0, 0.5, None), (0.1, 1.4, 0.1, torch.float64), (0, 13, 1, torch.float32)],
)
def test_arange(start, end, step, dtype):
    fn = lambda x: x[0].to(torch.arange(start, end, step, dtype=dtype).dtype) + torch.arange(start, end, step, dtype=dtype, device=x.device)[:13]
    check(fn, randn(7, 13) * 4)


def test_arange_with_bool_bounds():
    # OpInfo sweep: arange(False, True, True) failed to lower (a sympy boolean in the index).
    check(lambda x: x + torch.arange(False, True, True, dtype=torch.float32, device=x.device), randn(3, 1))


def test_scalar_tensor_from_masked_fill_and_tril():
    check(lambda x: (x.masked_fill(x > 0, -1.0), torch.tril(x, 1)), randn(7, 13))


def test_arange_with_dynamic_sizes():
    compiled = compile_strict(lambda x: x * torch.arange(x.shape[1], device=x.device), dynamic=True)
    for shape in [(7, 13), (5, 6)]:
        x = randn(*shape)
        assert_close(compiled(x), x * torch.arange(shape[1], device=DEVICE))
    assert not fallbacks()


def test_embedding_bag_with_include_last_offset():
    # OpInfo sweep: an unread extern output whose traced shape is wrong (fake tensors give
    # embedding_bag's offsets output 2 elements where ATen returns 3) failed the layout check.
    fn = lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o, mode="sum", include_last_offset=True) * 2
    index, offsets = (torch.tensor(v, device=DEVICE) for v in ([0, 1, 1, 0, 1, 4], [0, 3, 6]))
    check(fn, randn(5, 5), index, offsets, allowed={"aten._embedding_bag_forward_only"})


def test_gather_from_a_0d_tensor_takes_the_index_shape():
    # OpInfo sweep: gather(0-d, 0, tensor([0])) is shape (1,); we made a 0-d output.
    check(lambda x, i: torch.gather(x, 0, i) * 2, randn(()), torch.zeros(1, dtype=torch.int64, device=DEVICE))


def test_ops_on_complex_tensors_run_as_aten_calls():
    # OpInfo sweep: complex64 reached the kernel renderers (fft, view_as_complex) and failed.
    fn = lambda x: torch.fft.ifft2(torch.view_as_complex(x * 2)).abs() + 1
    x = randn(4, 6, 2)
    compiled = compile_strict(fn)
    assert_close(compiled(x), fn(x), reference=fn(x.double()).float())
    assert any("fft" in op for op in fallbacks()), "complex ops must be ATen calls"


# -- cat --------------------------------------------------------------------------------------
def test_cat_of_pointwise_fuses_into_one_kernel():
    check(lambda a, b: torch.cat([a * 2, b + 1]), randn(7, 13), randn(5, 13))
    assert generated_kernel_count() == 1


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_noncontiguous_three_inputs(dim):
    a = randn(7, 13, transposed=True)
    b = randn(7, 13) if dim == 0 else randn(7, 5)
    b = b[:5] if dim == 0 else b
    c = randn(3, 13, transposed=True) if dim == 0 else randn(7, 3, transposed=True)
    check(lambda a, b, c: torch.cat([a, b.sin(), c], dim) * 3, a, b, c)


def test_cat_skips_empty_inputs_and_promotes():
    fn = lambda a, e, b, legacy, i: (torch.cat([a, e, b], 0), torch.cat([a, legacy], 1), torch.cat([a, i], 0))
    check(fn, randn(7, 13), randn(0, 13), randn(3, 13), randn(0), randint(5, 2, 13))


def test_stack_and_dynamic_cat():
    check(lambda a, b: torch.stack([a, b], 1), randn(7, 13), randn(7, 13))
    torchfuse.reset()
    compiled = compile_strict(lambda a, b: torch.cat([a * 2, b], 1), dynamic=True)
    for n, m in [(7, 13), (9, 4)]:
        a, b = randn(3, n), randn(3, m)
        assert_close(compiled(a, b), torch.cat([a * 2, b], 1))
    assert not fallbacks()


def _rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([-x2, x1], -1)


def test_nested_cats_of_computed_values():
    """Rotary embeddings' half rotation inside the cat of q, k and v, each part computed in the
    kernel: an inner region's condition is on the outer region's index (on the Triton target,
    where both are masks instead of clamps, codegen/triton/guards.py)."""
    fn = lambda q, k, v, cos: torch.cat([q * cos + _rotate_half(q) * 2, k.sigmoid() + _rotate_half(k), v], -1)
    check(fn, randn(3, 5, 2, 6), randn(3, 5, 2, 6, transposed=True), randn(3, 5, 2, 7), randn(5, 1, 6))


def test_reductions_over_a_cat_and_a_padded_row():
    """The regions' conditions are on the reduced axis: masked loads inside the reduction's loop."""
    fn = lambda a, b: (torch.cat([a.exp(), b * 2], 1).sum(1), F.pad(a, (3, 2), value=-1.0).amax(1),
                       torch.cat([a, b], 0).mean(0))
    check(fn, randn(7, 13), randn(7, 13))


def test_nested_cat_with_dynamic_sizes():
    compiled = compile_strict(lambda a, b: torch.cat([_rotate_half(a), b * 2], -1) + 1, dynamic=True)
    for rows, half, extra in [(3, 4, 5), (6, 7, 2)]:
        a, b = randn(rows, 2 * half), randn(rows, extra)
        assert_close(compiled(a, b), torch.cat([_rotate_half(a), b * 2], -1) + 1)
    assert not fallbacks()


# -- kernel-mates over transposed spaces ---------------------------------------------------------
def test_a_transposed_kernel_mate_computes_at_its_mates_points(compile_target):
    """An attention backward casts P for one matmul and dS, transposed, for another: dS's node is
    over the transposed space. It joins P's kernel computing at P's points (scheduler/alignment.py),
    so P is read once, at one index (placed in order it was read again at (j, i), across lanes)."""
    def fn(p, g, s):
        ds = g - p * s.unsqueeze(-1)
        return p * 2, (ds * 3).transpose(-1, -2).clone()
    p, g = randn(3, 2, 17, 17), randn(3, 2, 17, 17)
    check(fn, p, g, randn(3, 2, 17))
    assert generated_kernel_count() == 1
    if compile_target == "triton":
        (source,) = [k.source for graph in torchfuse.report().graphs for k in graph.kernels if k.source]
        assert source.count("tl.load(") == 3 and "YBLOCK" not in source, source


@pytest.mark.parametrize("contiguous", [False, True], ids=["mates_layout", "contiguous"])
def test_a_transposed_consumer_joins_at_its_mates_points_only_if_it_stores_alike(compile_target, contiguous):
    """``a.t() + 1`` keeps a's memory order (eager's layout rule): it joins at a's points and
    shares a's load. ``.contiguous()`` must not: placed at a's points its store would go across
    the lanes where no tiling sees it, so it stays in order, reads a transposed, and the kernel
    is tiled in 2-D for that read (scheduler/alignment.py)."""
    def fn(x):
        a = x.exp()
        b = a.transpose(-1, -2) + 1
        return a, b.contiguous() if contiguous else b
    check(fn, randn(3, 20, 20))
    if compile_target == "triton":
        (source,) = [k.source for graph in torchfuse.report().graphs for k in graph.kernels if k.source]
        assert source.count("tl.load(") == (2 if contiguous else 1), source
        assert ("YBLOCK" in source) == contiguous, source


# -- constant_pad_nd --------------------------------------------------------------------------
@pytest.mark.parametrize("pad", [(1, 2), (1, 2, -1, 3), (-2, -3), (0, 0, 2, 0, 1, 1)])
def test_constant_pad(pad):
    x = randn(5, 7, 13, transposed=True)
    check(lambda x: F.pad(x, pad, value=1.5) + 1, x)


def test_constant_pad_int_and_empty():
    check(lambda i, e: (F.pad(i, (2, 1), value=-3), F.pad(e, (1, 1))), randint(9, 7, 13), randn(3, 0))


# -- gathers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_fuses_with_epilogue(index_dtype):
    check(lambda i, w: F.embedding(i, w) * 2 + 1, randint(37, 4, 5, dtype=index_dtype), randn(37, 7))
    assert generated_kernel_count() == 1


def test_embedding_noncontiguous_and_computed_weight():
    check(lambda i, w: F.embedding(i, w), randint(13, 9), randn(13, 7, transposed=True))
    check(lambda i, w: F.embedding(i, w * 2 + 1), randint(13, 9, 3), randn(13, 7))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = randn(7, 13, transposed=True)
    index = randint(x.shape[dim], 5, 4)
    check(lambda x, i: torch.gather(x, dim, i) + 1, x, index)


def test_gather_from_buffer_computed_in_the_same_space():
    # x * 2 has the gather's iteration space but must be stored before the gather reads it.
    check(lambda x, i: torch.gather(x * 2, 1, i), randn(7, 13), randint(13, 7, 13))


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: [torch.tensor([0, -1, 2, 6, -7])], (7, 13)),  # negative indices wrap
        (lambda: [None, torch.tensor([[0], [1], [-2]]), torch.tensor([2, -1])], (3, 5, 6)),  # broadcast, adjacent
        (lambda: [torch.tensor([0, 2]), None, torch.tensor([5, -1], dtype=torch.int32)], (3, 5, 6)),  # non-adjacent
        (lambda: [torch.tensor([1, 0, 2]), torch.tensor([4, -5, 0])], (3, 5)),  # full indexing
    ],
)
def test_index_tensor(make, shape):
    indices = [None if i is None else i.to(DEVICE) for i in make()]
    holes = [i is None for i in indices]

    def fn(x, *present):
        given = iter(present)
        return x[tuple(slice(None) if hole else next(given) for hole in holes)] * 2

    check(fn, randn(*shape, transposed=True), *[i for i in indices if i is not None])


def test_index_bool_mask_runs_in_aten():
    x = randn(7, 13)
    compiled = compile_strict(lambda x, m: x[m] + 1)
    mask = x > 0
    assert_close(compiled(x, mask), x[mask] + 1)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_select_and_roll(index_dtype):
    x = randn(7, 13, transposed=True)
    check(lambda x, i: (torch.index_select(x, 1, i), torch.index_select(x, 0, i[2:])), x,
          torch.tensor([0, 12, 2, 5], dtype=index_dtype, device=DEVICE))
    check(lambda x: torch.roll(x, 3, 1) + torch.roll(x, -2, 0), x)


def test_nearest_interpolation():
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), randn(1, 2, 3, 5))


# -- scatter / scatter-backward ops -------------------------------------------------------------
def test_one_hot_scatter_is_fused():
    x, index = randn(7, 13), randint(13, 7, 1)
    check(lambda x, i, s: (torch.scatter(x, 1, i, 2.0), torch.scatter(x, 1, i, s)), x, index, randn(7, 3))


def test_general_scatter_falls_back_correctly():
    x, index = randn(7, 13), torch.stack([torch.randperm(13)[:2] for _ in range(7)]).to(DEVICE)
    check(lambda x, i, s: torch.scatter(x, 1, i, s), x, index, randn(7, 3), allowed=("aten.scatter.src",))


def test_select_and_slice_scatter():
    x = randn(7, 13)
    check(lambda x, s: torch.select_scatter(x, s, 1, -2), x, randn(7))
    check(lambda x, s: torch.slice_scatter(x, s, 1, 1, 12, 3), x, randn(7, 4))
    check(lambda x, s: torch.slice_scatter(x, s, 0, -5, None), x, randn(5, 13))


def test_backward_of_slice_cat_pad_flip():
    def fn(x, y):
        z = torch.cat([x[:, 1:6] * 2, F.pad(y, (1, 1)).flip(0)], 1)
        return (z * z).sum()

    x, y = randn(7, 13).requires_grad_(), randn(7, 3).requires_grad_()
    xr, yr = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    compiled = compile_strict(fn)
    compiled(x, y).backward()
    fn(xr, yr).backward()
    assert_close(x.grad, xr.grad)
    assert_close(y.grad, yr.grad)
    assert not fallbacks()


# -- rearrangements ---------------------------------------------------------------------------
def test_flip_and_repeat():
    x = randn(7, 13, transposed=True)
    check(lambda x: (torch.flip(x, (0, -1)) + 1, x.repeat(2, 1, 3), x[:1].repeat(3, 1)), x)
    torchfuse.reset()
    check(lambda x: torch.flip(x, (0,)) * x, x)  # a flip is a load at a mirrored index: no copy
    assert generated_kernel_count() == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gathers_and_regions(dtype):
    w, a = randn(13, 7).to(dtype), randn(7, 5).to(dtype)
    check(lambda i, w, a: (F.embedding(i, w) * 2, torch.cat([a, F.pad(a, (1, 1))], 1), torch.arange(0, 3, 0.25, dtype=dtype, device=DEVICE) + a[0, 0]),
          randint(13, 4, 3), w, a)


# -- producers recomputed at gathered points (not stored whole) --------------------------------
GATHERED_PRODUCERS = {
    # cross-entropy's pick: a row-normalised producer read at one gathered column per row
    "log_softmax_pick": lambda x, i: torch.log_softmax(x * 1.5, -1).gather(1, i[:, None] % x.shape[1]),
    # the producer reads its input transposed and broadcast: gathered var inside strides
    "transposed_producer": lambda x, i: (x.t() * 2 + 1)[i % x.shape[1]],
    # embedding of a scaled weight: whole rows at gathered row indices
    "scaled_embedding": lambda x, i: F.embedding(i % x.shape[0], x * 0.5 - 1),
    # the producer itself indexes with arithmetic on the gathered var (flip, a slice step)
    "flipped_and_strided": lambda x, i: (x.flip(1)[:, ::2] + x[:, 1::2]).gather(1, i[:, None] % (x.shape[1] // 2)),
    # negative indices wrap, then the producer is recomputed there
    "negative_indices": lambda x, i: x.exp()[:, (i % x.shape[1]) - x.shape[1]],
}


@pytest.mark.parametrize("name", sorted(GATHERED_PRODUCERS))
def test_producer_recomputed_at_gathered_index(name):
    fn = GATHERED_PRODUCERS[name]
    x, i = randn(9, 14), torch.randint(-30, 30, (9,), device=DEVICE)
    check(fn, x, i)
    check(fn, randn(9, 14, transposed=True), i)
