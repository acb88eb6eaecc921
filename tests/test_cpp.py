"""The C++ target: strategies, numerics, half precision, builds and their cache, failures.

The whole suite already runs on the C++ target on CPU-only machines (see conftest.py);
these tests cover what only this target has: its loop strategies (rows, tiled, split),
its helper functions bit for bit, the on-disk library cache across processes, the thread
count, and what happens without a compiler or with a compile error. Inputs live on the
CPU whatever the machine, and every float result is checked against float64.
"""
from __future__ import annotations

import copy
import ctypes
import math
import os
import platform
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import compile_cpp
from opcheck import INF, NAN, compare, to_float64
from torchfuse.codegen.cpp.prelude import PRELUDE
from torchfuse.runtime import cpp_build

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(not cpp_build.compiler_available(), reason="needs a C++ compiler")]


def floats(shape, dtype=torch.float32, low=-4.0, high=4.0, specials=(NAN, INF, -INF, 0.0, -0.0), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low
    flat = x.view(-1)
    count = min(len(specials), flat.numel())
    flat[:count] = torch.tensor(list(specials[:count]), dtype=torch.float64)
    return x.to(dtype)


def check(fn, *args, reference=True, scale_tol=True, **kwargs):
    """Compile ``fn`` for C++, compare every output with eager against float64."""
    compiled = compile_cpp(fn, **kwargs)
    actual, expected = compiled(*args), fn(*args)
    ref = fn(*to_float64(args)) if reference else None
    if not isinstance(expected, (tuple, list)):
        actual, expected, ref = (actual,), (expected,), (ref,)
    ref = ref if ref is not None else [None] * len(expected)
    problems = []
    for k, (a, e, r) in enumerate(zip(actual, expected, ref)):
        if isinstance(r, torch.Tensor) and r.shape != e.shape:
            r = None
        problems += compare(a, e, r, f"output{k}", scale_tol=scale_tol)
    assert not problems, "\n".join(problems)
    assert all(g.target == "cpp" and not g.error for g in torchfuse.report().graphs), torchfuse.report()
    return compiled


def strategies() -> list[str]:
    """The loop strategy of every kernel compiled since the last reset, from its source."""
    found = []
    for graph in torchfuse.report().graphs:
        for kernel in graph.generated_kernels:
            first = kernel.source.splitlines()[0]  # "// reduction kernel (tiled): ..."
            found.append(first.split("(")[1].split(")")[0])
    return found


# -- loop strategies ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(37, 65), (3, 5, 130), (1, 1), (300, 7)])
def test_row_reductions_with_epilogues(shape):
    def fn(x):
        centered = x - x.mean(-1, keepdim=True)
        return (centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-5), x.amax(-1), x.argmax(-1),
                x.sum(-1), (x > 0).any(-1), x.softmax(-1))

    check(fn, floats(shape, specials=()))
    assert set(strategies()) <= {"rows", "pointwise"}


def test_rows_propagate_nan_and_inf():
    x = floats((9, 40), specials=(NAN, 1.0, INF, -INF, 2.0) * 3)
    check(lambda x: (x.amax(-1), x.amin(-1), x.sum(-1), x.argmax(-1), x.argmin(-1)), x)


@pytest.mark.parametrize("shape", [(517, 64), (64, 33), (7, 5, 96)])
def test_column_reductions_are_tiled(shape):
    """Reducing a strided dim walks tiles of contiguous rows (the weight gradient of a norm)."""

    def fn(x, g):
        return (x.sum(0), (x * g).sum(0), x.amax(0), x.argmin(0), x.mean(0, keepdim=True) * 2, x - x.amax(0))

    x = floats(shape, specials=(NAN, INF) + (0.5,) * 40 + (-INF,))
    check(fn, x, floats(shape, specials=(), seed=1))
    assert "tiled" in strategies()


def test_full_reductions_split_across_threads():
    x = floats((300_001,), specials=(1.0, 3.5, 3.5, -2.0))
    x[200_000] = 7.0  # ties at 200_000 and 250_000: argmax keeps the first
    x[250_000] = 7.0
    fn = lambda x: (x.sum(), x.mean(), x.amax(), x.argmax(), x.argmin(), (x * x).sum() / x.numel(), x - x.mean())  # noqa: E731
    check(fn, x)
    assert "split" in strategies()
    y = x.clone()
    y[123_456] = NAN
    check(fn, y)


def test_split_reduction_of_integers_and_bools():
    x = torch.randint(-(2**62), 2**62, (100_003,))
    b = x > 0
    check(lambda x, b: (x.sum(), x.amax(), x.argmin(), b.any(), b.all(), b.sum()), x, b)


@pytest.mark.parametrize("length", [5000, 200_000])
def test_float32_sums_are_accurate_for_long_rows(length):
    """float32 sums fold short float32 chunks into float64: at least as accurate as ATen's
    cascade sum, far from a float32 accumulator's error growth."""
    x = floats((4, length), specials=())
    got = compile_cpp(lambda x: x.sum(-1))(x).double()
    exact = x.double().sum(-1)
    eager_error = (x.sum(-1).double() - exact).abs().max().item()
    assert (got - exact).abs().max().item() <= max(2 * eager_error, 1e-6)
    assert ((got - exact).abs() <= x.double().abs().sum(-1) * 2**-24 / 16).all()


@pytest.mark.parametrize("length", [31, 32, 33, 100, 511, 512, 513, 1000, 4097])
def test_row_sums_of_every_row_length(length):
    """float32 row sums are chunked (rows.py): every split of a row into chunks and SIMD
    remainders sums every element once; softmax also parks its exp in the output."""
    x = floats((5, length), specials=())

    def fn(x):
        centered = x - x.mean(-1, keepdim=True)
        return x.sum(-1), centered.pow(2).mean(-1), x.softmax(-1), F.layer_norm(x, (length,))

    check(fn, x)
    y = x.clone()
    y[1, length // 2] = NAN
    y[2, length - 1] = INF
    check(lambda y: (y.sum(-1), y.softmax(-1)), y)


def test_row_sums_with_a_dynamic_row_length():
    fn = compile_cpp(lambda x: (x.sum(-1), x.softmax(-1)), dynamic=True)
    for length in (40, 77, 600):
        x = floats((3, length), specials=(), seed=length)
        got, want, ref = fn(x), (x.sum(-1), x.softmax(-1)), (x.double().sum(-1), x.double().softmax(-1))
        assert [p for g, w, r in zip(got, want, ref) for p in compare(g, w, r, scale_tol=True)] == []


def test_pointwise_kernel_writes_over_a_dead_matmul_result():
    """GELU after a matmul overwrites the matmul's result (dead afterwards) instead of
    allocating; inputs, outputs and transposed reads are never overwritten."""
    a, w = floats((33, 40), specials=()), floats((40, 70), specials=(), seed=1)

    def fn(a, w):
        return F.gelu(a @ w) @ w.t()

    compiled = check(fn, a, w)
    assert "overwrites the dead buffer" in torchfuse.report().graphs[0].wrapper_source
    before = a.clone()
    torchfuse.reset()
    check(lambda a: (a * 2, a.t().contiguous() + 1), a.t().contiguous().t())  # an input: never
    assert torch.equal(a, before)
    torchfuse.reset()
    check(lambda a, w: ((a @ w).t() * 2 + (a @ w)), floats((40, 40), specials=()), floats((40, 40), seed=2))
    assert "overwrites the dead buffer" not in torchfuse.report().graphs[0].wrapper_source  # reads a transpose
    del compiled


def test_dead_matmul_result_is_overwritten_through_a_reshape():
    """A linear layer on [B, T, H] is a [B*T, H] matmul: the GELU after it (shaped [B, T, H])
    still writes over the matmul's dense result, seen through a view of the GELU's shape."""
    x, w = floats((3, 7, 40), specials=()), floats((40, 72), specials=(), seed=1)

    def fn(x, w):
        return F.gelu(x @ w) @ w.t()

    check(fn, x, w)
    source = torchfuse.report().graphs[0].wrapper_source
    assert ".view((3, 7, 72))  # overwrites the dead buffer" in source, source


def test_pointwise_loops_merge_only_where_contiguous():
    x = floats((64, 130), specials=())
    check(lambda x: x * 2 + 1, x)
    source = torchfuse.report().graphs[-1].kernels[0].source
    assert source.count("for (") == 1  # one flat loop
    torchfuse.reset()
    check(lambda x, b: x * b, x, floats((130,), seed=2))  # a broadcast: rows x contiguous columns
    source = torchfuse.report().graphs[-1].kernels[0].source
    assert source.count("for (") == 2


def test_cat_and_pad_split_their_loops_into_contiguous_copies():
    a, b, c = floats((37, 5)), floats((37, 1), seed=1), floats((37, 11), seed=2)

    def fn(a, b, c):
        return (torch.cat([a, b * 2, c], 1), F.pad(a, (3, 2)) + 1, F.pad(c, (-2, 4), value=0.5), torch.cat([a, a], 0))

    check(fn, a, b, c)
    sources = [k.source for k in torchfuse.report().graphs[0].generated_kernels]
    cat = next(s for s in sources if "aten.cat" in s.splitlines()[0] and "for (int64_t x1 = 5; x1 < 6" in s)
    assert "?" not in cat and "tf_imin" not in cat  # no selects, no clamped indices left


def test_non_contiguous_broadcast_and_offset_inputs():
    base = floats((50, 40))
    x = base.t()[3:, 1:31]  # transposed, with a storage offset
    b = floats((1, 30), seed=3).expand(37, 30)

    def fn(x, b):
        return torch.tanh(x) * b + x.sum(-1, keepdim=True), (x + b).amax(0)

    check(fn, x, b)


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (3, 0, 4)])
def test_zero_size_tensors(shape):
    x = torch.randn(shape)
    check(lambda x: (x.exp() + 1, x.sum(-1), x.amax(0) if x.shape[0] else x.sum(0)), x)


def test_dynamic_shapes_reuse_one_library():
    fn = lambda x: (F.gelu(x) * x.softmax(-1), x.sum(0))  # noqa: E731
    compiled = compile_cpp(fn, dynamic=True)
    before = cpp_build.stats.compiler_calls
    for shape in [(3, 5), (40, 70), (2, 4500), (7, 3)]:
        x = floats(shape, specials=(), seed=shape[1])
        problems = []
        for k, (a, e, r) in enumerate(zip(compiled(x), fn(x), fn(x.double()))):
            problems += compare(a, e, r, f"output{k}", scale_tol=True)
        assert not problems, problems
    assert len(torchfuse.report().graphs) == 1
    assert cpp_build.stats.compiler_calls - before <= 1


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_conv_batchnorm_relu_pool_block(training):
    """Convolutions stay ATen calls; batch norm (eval: running stats, train: batch stats, a
    reduction over N, H, W) and ReLU fuse around them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 1))
    model.train(training)
    x = floats((2, 3, 9, 11), specials=())
    reference = copy.deepcopy(model).double()
    compiled = compile_cpp(copy.deepcopy(model))
    with torch.no_grad():
        got, want, ref = compiled(x), model(x), reference(x.double())
    assert compare(got, want, ref, scale_tol=True) == []
    assert all(g.target == "cpp" and not g.error for g in torchfuse.report().graphs)


def test_row_invariant_loads_are_read_once_per_row_before_the_reduction_loops():
    """A value the row's loops read at an index without reduced variables (a scalar scale, a
    per-row value) is loaded once per row, outside the loops: GCC cannot hoist it out of an
    OpenMP-outlined SIMD loop by itself, and left such loops scalar."""
    x, scale, per_row = floats((64, 300), specials=()), floats((), seed=1), floats((64, 1), seed=2)
    fn = lambda x, s, v: ((x - v) * s).sum(-1) + (x * v).amax(-1)  # noqa: E731
    got, want, ref = compile_cpp(fn)(x, scale, per_row), fn(x, scale, per_row), fn(x.double(), scale.double(), per_row.double())
    assert compare(got, want, ref, scale_tol=True) == []
    (kernel,) = torchfuse.report().graphs[0].generated_kernels
    lines = kernel.source.splitlines()
    first_loop = next(i for i, line in enumerate(lines) if "for (int64_t r" in line)
    invariant = [i for i, line in enumerate(lines) if re.search(r"= ptr\d+\[(0|x0)\];", line)]
    assert len(invariant) == 2 and max(invariant) < first_loop, kernel.source


@pytest.fixture
def layout_copies(monkeypatch) -> list:
    """The shapes of the extern results the wrapper had to copy into the layout tracing predicted."""
    from torchfuse.runtime import wrapper

    copies = []
    real_ensure_layout = wrapper.ensure_layout

    def counting_ensure_layout(tensor, shape, strides):
        out = real_ensure_layout(tensor, shape, strides)
        copies.extend([shape] if out is not tensor else [])
        return out

    monkeypatch.setattr(wrapper, "ensure_layout", counting_ensure_layout)
    return copies


def test_extern_operands_we_compute_have_the_traced_layout(layout_copies):
    """An ATen op whose result follows its operand's layout (sort; cuDNN attention on a GPU)
    gets the operand in the layout tracing saw, so its result has the predicted layout: no
    copy at run time. Here the operand is a transposed input times 2, (1, 7)-strided."""
    x = floats((7, 5), specials=())
    compiled = compile_cpp(lambda x: torch.sort(x.t() * 2, 0)[0] + 1)
    got, want, ref = compiled(x), torch.sort(x.t() * 2, 0)[0] + 1, torch.sort(x.double().t() * 2, 0)[0] + 1
    assert compare(got, want, ref) == []
    assert layout_copies == []
    assert "(5, 7), (1, 5)" in torchfuse.report().graphs[0].wrapper_source  # the operand's buffer


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_inference_convolutions_run_channels_last(training, layout_copies):
    """Inference graphs give oneDNN channels-last operands (the pooling kernel before the second
    convolution writes that layout directly) and expect channels-last results, which ATen
    returns: no layout-fixing copy at run time. Training graphs keep their layouts."""
    copies = layout_copies
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 5, 3, padding=1))
    model.train(training)
    x = floats((2, 3, 10, 13), specials=())
    reference, compiled = copy.deepcopy(model).double(), compile_cpp(copy.deepcopy(model))
    with torch.set_grad_enabled(training):
        got, want, ref = compiled(x), model(x), reference(x.double())
    assert compare(got.detach(), want.detach(), ref.detach(), scale_tol=True) == []
    assert copies == []
    source = torchfuse.report().graphs[0].wrapper_source
    # The first convolution's result, (2, 8, 10, 13): channels-last strides in eval only.
    assert ("(2, 8, 10, 13), (1040, 1, 104, 8))" in source) == (not training), source
    if training:  # the forward graph keeps its layouts, so the backward graph reads them right
        got.sum().backward()
        want.sum().backward()
        for ours, theirs in zip(compiled.parameters(), model.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_cross_entropy_forward_does_not_store_the_log_softmax():
    """The gathered log-softmax is recomputed at the gathered index, x[i, t[i]] - max[i] -
    log(sum[i]) (scheduler: gathered reads of a producer that uses the gathered variable
    only as a whole index entry), instead of storing the whole log-softmax."""
    logits, target = floats((64, 1000), specials=()), torch.randint(0, 1000, (64,))
    with torch.no_grad():
        compile_cpp(F.cross_entropy)(logits, target)
    assert "tf_empty_strided((64, 1000)" not in torchfuse.report().graphs[0].wrapper_source  # no 64 x 1000 buffer


# -- dtypes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    x = floats((33, 70), dtype, specials=(NAN, INF, -INF, 65504.0, 1e-7))
    w = floats((70,), dtype, seed=1, specials=())

    def fn(x, w):
        return F.layer_norm(x, (70,), w), (x * 3).to(torch.float32), x.sum(-1), x.amax(0), x.float().to(dtype)

    check(fn, x, w)


def test_integer_and_bool_kernels():
    a = torch.randint(-100, 100, (13, 29), dtype=torch.int32)
    b = torch.randint(-5, 5, (13, 29), dtype=torch.int32)
    c = torch.tensor([2**31 - 1, -(2**31), 7] * 3, dtype=torch.int32)

    def fn(a, b, c):
        safe = torch.where(b == 0, torch.ones_like(b), b)
        return (a // safe, a % safe, a * b + 3, a & b, a | 5, a ^ b, ~a, a << (b.abs()), a >> 2, (a > b) & (a < 50),
                torch.div(a, safe, rounding_mode="trunc"), a.abs(), -a, c + c, c * 3, (a > 0).sum(-1), a.amax(-1))

    check(fn, a, b, c)


def test_integer_division_by_zero_does_not_crash():
    a = torch.tensor([5, -5, 0, 7], dtype=torch.int64)
    out = compile_cpp(lambda a, b: (a // b, a % b))(a, torch.zeros(4, dtype=torch.int64))
    assert all(o.shape == (4,) for o in out)  # ATen raises; a kernel must not trap


def test_gathers_and_out_of_range_indices():
    table = floats((50, 16), specials=())
    idx = torch.tensor([[0, 49, 3], [7, 7, 1]])
    check(lambda t, i: (F.embedding(i, t) * 2, t[i[0]].sum(-1), torch.gather(t, 1, (i.t()[:, :1] % 16).repeat(1, 4)),
                        t[:, [-1, 3]] - 1), table, idx)
    # An index out of range reads a valid element instead of faulting (ATen would raise).
    bad = torch.tensor([1000, -1000, 2])
    out = compile_cpp(lambda t, i: t[i] + 1)(table, bad)
    assert out.shape == (3, 16) and torch.equal(out[2], table[2] + 1)


def test_cross_entropy_forward_and_backward():
    logits = floats((37, 101), specials=()).requires_grad_()
    target = torch.randint(0, 101, (37,))
    target[3] = -100  # ignored
    loss = compile_cpp(F.cross_entropy)(logits, target)
    (grad,) = torch.autograd.grad(loss, logits)
    logits64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(logits64, target)
    (ref_grad,) = torch.autograd.grad(ref, logits64)
    assert abs(loss.item() - ref.item()) < 1e-5
    assert ((grad.double() - ref_grad).abs().max() < 1e-6)


# -- the prelude's helpers, bit for bit ----------------------------------------------------------
HELPERS_TEST = PRELUDE + textwrap.dedent('''
    extern "C" void f16_to_f32(const uint16_t* in, float* out, int64_t n) { for (int64_t i = 0; i < n; ++i) out[i] = tf_f16_to_f32(in[i]); }
    extern "C" void bf16_to_f32(const uint16_t* in, float* out, int64_t n) { for (int64_t i = 0; i < n; ++i) out[i] = tf_bf16_to_f32(in[i]); }
    extern "C" void f32_to_f16(const float* in, uint16_t* out, int64_t n) { for (int64_t i = 0; i < n; ++i) out[i] = tf_f32_to_f16(in[i]); }
    extern "C" void f32_to_bf16(const float* in, uint16_t* out, int64_t n) { for (int64_t i = 0; i < n; ++i) out[i] = tf_f32_to_bf16(in[i]); }
    extern "C" void erfinv32(const float* in, float* out, int64_t n) { for (int64_t i = 0; i < n; ++i) out[i] = tf_erfinv(in[i]); }
''')


@pytest.fixture(scope="module")
def helpers():
    lib = cpp_build.build(HELPERS_TEST, "helpers").handle
    for name in ("f16_to_f32", "bf16_to_f32", "f32_to_f16", "f32_to_bf16", "erfinv32"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _call(fn, source: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(source.shape, dtype=out_dtype)
    fn(source.data_ptr(), out.data_ptr(), source.numel())
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_conversions_match_torch_bit_for_bit(helpers, dtype):
    name = "f16" if dtype == torch.float16 else "bf16"
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)  # every bit pattern
    widened = _call(getattr(helpers, f"{name}_to_f32"), every.view(torch.int16), torch.float32)
    expected = every.float()
    same = (widened.view(torch.int32) == expected.view(torch.int32)) | (widened.isnan() & expected.isnan())
    assert same.all()
    # float32 -> half: random values over the whole range, every half's neighbourhood and ties.
    gen = torch.Generator().manual_seed(0)
    values = torch.cat([torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=gen, dtype=torch.int64)
                        .to(torch.int32).view(torch.float32), expected, expected.nextafter(torch.tensor(INF)),
                        expected.nextafter(torch.tensor(-INF)), (expected[:-1] + expected[1:]) / 2])
    narrowed = _call(getattr(helpers, f"f32_to_{name}"), values, torch.int16).view(dtype)
    want = values.to(dtype)
    same = (narrowed.view(torch.int16) == want.view(torch.int16)) | (narrowed.isnan() & want.isnan())
    assert same.all(), values[~same][:5]


def test_float32_erf_is_within_six_ulp():
    """Our float32 erf (a rational fit, see the prelude) over a dense sweep and the specials."""
    x = torch.cat([torch.linspace(-5, 5, 1_000_001), torch.logspace(-38, 0, 20_000), -torch.logspace(-38, 0, 20_000),
                   torch.tensor([NAN, INF, -INF, 0.0, -0.0, 4.0, -4.0, 3.9999998])])
    got = compile_cpp(torch.erf)(x).double()
    ref = torch.erf(x.double())
    ulp = (torch.nextafter(ref.float(), torch.tensor(INF)).double() - ref.float().double()).abs()
    finite = torch.isfinite(ref)
    assert ((got - ref)[finite].abs() / ulp[finite]).max() <= 6
    assert got[-8].isnan() and got[-7] == 1 and got[-6] == -1 and torch.signbit(got[-4])


def test_erfinv_matches_aten(helpers):
    x = torch.cat([torch.linspace(-1, 1, 100_001), torch.tensor([NAN, 2.0, -1.5, 1.0, -1.0, 0.0, -0.0])])
    got = _call(helpers.erfinv32, x, torch.float32)
    assert compare(got, torch.erfinv(x), torch.erfinv(x.double())) == []


# -- builds, the disk cache and threads -----------------------------------------------------------
def test_one_translation_unit_per_graph():
    before = cpp_build.stats.compiler_calls + cpp_build.stats.disk_hits + cpp_build.stats.memory_hits
    x = floats((8, 300), specials=())
    check(lambda x: (x.softmax(-1), torch.cumsum(x, 1) * 2, x.sum(0)), x)  # kernels around an ATen call
    assert len(torchfuse.report().graphs[0].generated_kernels) >= 2
    after = cpp_build.stats.compiler_calls + cpp_build.stats.disk_hits + cpp_build.stats.memory_hits
    assert after - before == 1


def test_a_second_process_does_not_call_the_compiler(tmp_path):
    script = textwrap.dedent('''
        import torch, torchfuse
        from torchfuse.runtime import cpp_build
        fn = torchfuse.compile(lambda x: torch.sigmoid(x) * x.sum(-1, keepdim=True), options={"target": "cpp", "strict": True})
        x = torch.linspace(-3, 3, 60).view(6, 10)
        torch.testing.assert_close(fn(x), torch.sigmoid(x) * x.sum(-1, keepdim=True))
        print(cpp_build.stats.compiler_calls, cpp_build.stats.disk_hits)
    ''')
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    first, second = (tuple(map(int, r.stdout.split())) for r in runs)
    assert first == (1, 0) and second == (0, 1)
    assert list(tmp_path.glob("cpp/*/*.so")) and not list(tmp_path.glob("cpp/*/*.tmp"))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 levels")
def test_instruction_set_is_a_setting_and_part_of_the_cache_key(monkeypatch):
    source = PRELUDE + 'extern "C" void tf_twice(float* p, int64_t n, int t) { for (int64_t i = 0; i < n; ++i) p[i] *= 2; }\n'
    x = torch.arange(100, dtype=torch.float32)
    paths = set()
    for level in ("native", "x86-64-v2", "x86-64"):
        monkeypatch.setenv("TORCHFUSE_CPP_ARCH", level)
        assert f"-march={level}" in cpp_build.compile_flags()
        library = cpp_build.build(source, "twice")
        library.function("tf_twice", 1, 1)(x.data_ptr(), x.numel(), 1)
        paths.add(library.path)
    assert len(paths) == 3 and torch.equal(x, torch.arange(100, dtype=torch.float32) * 8)
    monkeypatch.setenv("TORCHFUSE_CXXFLAGS", "-mtune=generic")  # extra flags come last: they win
    assert cpp_build.compile_flags()[-2:] == ("-march=x86-64", "-mtune=generic")
    monkeypatch.delenv("TORCHFUSE_CPP_ARCH")
    assert cpp_build.arch() == "native"
    monkeypatch.setenv("TORCHFUSE_CPP_ARCH", "x86-64 -O0")
    with pytest.raises(ValueError, match="TORCHFUSE_CPP_ARCH"):
        cpp_build.compile_flags()


def test_thread_count_follows_torch():
    x = floats((4096, 64), specials=())
    fn = compile_cpp(lambda x: (x.exp() * 2, x.sum(-1)))
    expected = fn(x)
    assert "tf_num_threads()" in torchfuse.report().graphs[0].wrapper_source
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = fn(x)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(single, expected))  # same partition-free results


def test_cpp_is_the_default_for_cpu_tensors():
    out = torchfuse.compile(lambda x: x.cos() + 1)(torch.randn(9))
    assert out.shape == (9,)
    assert [g.target for g in torchfuse.report().graphs] == ["cpp"]


# -- failures ----------------------------------------------------------------------------------
def _broken_module(monkeypatch):
    import torchfuse.codegen.cpp.kernel as kernel

    original = kernel.render_module
    monkeypatch.setattr(kernel, "render_module", lambda kernels: original(kernels) + "\n#error deliberately broken\n")


def test_compile_error_warns_once_and_runs_with_aten(monkeypatch):
    _broken_module(monkeypatch)
    x = torch.randn(5, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torchfuse.compile(lambda x: x.exp() * 2)(x)
    torch.testing.assert_close(out, x.exp() * 2)
    ours = [w for w in caught if "torchfuse" in str(w.message)]
    assert len(ours) == 1 and "deliberately broken" in str(ours[0].message)
    assert torchfuse.report().graphs[0].target == "aten"


def test_strict_mode_raises_with_the_message_and_the_source_path(monkeypatch):
    _broken_module(monkeypatch)
    with pytest.raises(Exception, match="CppCompileError") as info:  # Dynamo wraps it
        compile_cpp(lambda x: x.exp() * 2)(torch.randn(5, 7))
    message = str(info.value)
    assert "deliberately broken" in message
    source = message.split("generated source: ")[1].split()[0]
    assert source.endswith(".cpp") and os.path.exists(source)


def test_without_a_compiler_cpu_graphs_run_as_captured(monkeypatch):
    monkeypatch.setattr(cpp_build, "find_compiler", lambda: None)
    monkeypatch.setattr(cpp_build, "_warned", set())
    x = torch.randn(5, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = torchfuse.compile(lambda x: x.exp() * 2)
        fn(x)
        torchfuse.compile(lambda x: x.sin())(x)
    assert len([w for w in caught if "no C++ compiler" in str(w.message)]) == 1
    assert all(g.kind == "eager" for g in torchfuse.report().graphs)
    with pytest.raises(Exception, match="no C\\+\\+ compiler"):
        compile_cpp(lambda x: x.cos())(x)


# -- next-row prefetch (prefetch.py) ----------------------------------------------------------------
def _prefetch_lines() -> list[str]:
    return [line.strip() for g in torchfuse.report().graphs for k in g.generated_kernels
            for line in k.source.splitlines() if "__builtin_prefetch" in line]


def test_multi_pass_rows_prefetch_the_next_row_in_shares():
    """Layer norm passes over each row three times: the two later passes each prefetch half of
    the next row (into L2), and the values stay right for odd sizes and non-contiguous rows."""
    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)

    x = floats((2, 37, 600), specials=()).transpose(0, 1)  # rows of 600 floats, not adjacent
    check(layer_norm, x, floats((600,), seed=1), floats((600,), seed=2))
    lines = _prefetch_lines()
    # The innermost row loop is x1 (stride 37 * 600 = 22200): its next row starts 22200 further.
    assert len(lines) == 2 and all(line.startswith("if (x1 + 1 < 2) for (int64_t pf = ") for line in lines), lines
    assert all(line.endswith("+ 22200) + pf, 0, 2);") for line in lines), lines
    assert "pf = 0; pf < 300; pf += 16)" in lines[0] and "pf = 288; pf < 600; pf += 16)" in lines[1], lines


def test_single_pass_and_short_rows_do_not_prefetch():
    check(lambda x: x.sum(-1), floats((64, 1024), specials=()))  # one pass: nothing to overlap
    check(lambda x: x.softmax(-1), floats((300, 100), specials=()))  # 400-byte rows: the hardware's job
    assert _prefetch_lines() == []


def test_prefetch_with_symbolic_row_length_checks_the_size_at_run_time():
    fn = compile_cpp(lambda x: x.softmax(-1) * 2, dynamic=True)
    for shape in [(5, 700), (9, 3000), (3, 200000)]:  # the last row is 800 KB: not prefetched
        x = floats(shape, specials=())
        torch.testing.assert_close(fn(x), x.double().softmax(-1).float() * 2, rtol=1e-5, atol=1e-6)
    lines = _prefetch_lines()
    assert lines and all("<= 524288" in line for line in lines), lines


# -- the vectorizer --------------------------------------------------------------------------------
def innermost_loops(lines: list[str]) -> list[int]:
    """1-based numbers of the lines opening a ``for`` loop that contains no other loop."""
    found, stack = [], []  # stack of (line number, has an inner loop) per open brace
    for number, line in enumerate(lines, 1):
        opens_loop = line.strip().startswith("for (")
        if opens_loop and stack:
            for entry in stack:
                entry[1] = True
        for _ in range(line.count("{")):
            stack.append([number if opens_loop else 0, False])
        for _ in range(line.count("}")):
            start, nested = stack.pop()
            if start and not nested:
                found.append(start)
    return sorted(found)


@pytest.mark.skipif("g++" not in os.path.basename(cpp_build.find_compiler() or ""), reason="GCC's report")
def test_inner_loops_are_vectorized(tmp_path):
    """GCC's vectorizer report: every innermost loop of a pointwise kernel, a row reduction
    (softmax), a chunked float32 sum, a tiled column reduction and max pooling is vectorized."""
    x = floats((256, 512), specials=())
    compile_cpp(lambda x, b: (F.gelu(x + b), x.softmax(-1), x.sum(-1), x.sum(0)))(x, floats((512,), seed=1))
    # Max pooling after a scale-shift and ReLU (a conv's eval BatchNorm epilogue): stride-2 loads.
    compile_cpp(lambda y, s: F.max_pool2d(F.relu(y * s[:, None, None] + 1), 2))(floats((2, 8, 32, 32), specials=()),
                                                                                 floats((8,), seed=2))
    # A pooling kernel writing a channels-last convolution input: walked channels innermost.
    # (The input is channels-last already: converting a graph input is a transpose, not vectorized.)
    y = floats((2, 16, 34, 34), specials=()).contiguous(memory_format=torch.channels_last)
    compile_cpp(lambda y, w: F.conv2d(F.max_pool2d(F.relu(F.conv2d(y, w)), 2), w))(y, floats((16, 16, 1, 1), seed=3))
    # Five inputs and two outputs: pointers are not __restrict__, so GCC versions the loop with
    # 11 alias checks, one more than its default limit (cpp_build.GCC_FLAGS raises it).
    many = [floats((64, 1024), seed=4 + k, specials=()) for k in range(5)]
    compile_cpp(lambda a, b, c, d, e: ((a * b + c) * (d - e), (a * b + c) + (d - e)))(*many)
    assert {"rows", "tiled"} <= set(strategies())
    # Kernel names restart in every graph: prefix them with the graph's name in one file.
    kernels = "".join(k.source.replace(f" {k.name}(", f" {g.name}_{k.name}(")
                      for g in torchfuse.report().graphs for k in g.generated_kernels)
    path = tmp_path / "k.cpp"
    path.write_text(PRELUDE + kernels)
    command = [cpp_build.find_compiler(), *cpp_build.compile_flags(), "-fopt-info-vec-optimized", str(path), "-o",
               str(tmp_path / "k.so"), *cpp_build.LINK_FLAGS]
    report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    vectorized = {int(line.split(":")[1]) for line in report.splitlines() if "loop vectorized" in line}
    lines = (PRELUDE + kernels).splitlines()
    first = PRELUDE.count("\n") + 1
    # GCC names a loop by its condition's line, or (omp simd) by its body's first line or
    # its pragma's line.
    loops = [n for n in innermost_loops(lines) if n > first and "}" not in lines[n - 1]]
    missing = [lines[n - 1].strip() for n in loops if not {n - 1, n, n + 1} & vectorized]
    assert loops and not missing, f"not vectorized: {missing}\n{report}"


def test_geometry_of_the_report_is_readable():
    compile_cpp(lambda x: x.softmax(-1))(torch.randn(4, 8))
    text = str(torchfuse.report())
    assert "target=cpp" in text
    assert math.isfinite(torchfuse.report().graphs[0].stage_seconds["kernels"])
