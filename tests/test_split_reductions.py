"""Split (two-stage) and outer reductions on the Triton target, against eager and float64.

The split policy is shrunk so that reductions of a few thousand elements split (Triton's
interpreter runs these on the CPU); the GPU policy splits from 2**18 elements. Every test
checks that something was split, so a policy change cannot silently turn them into tests of
the one-kernel path. tests/test_coalescing.py checks the memory order of the same kernels.
"""
from __future__ import annotations

import copy

import pytest
import torch

import torchfuse
from conftest import DEVICE, assert_close, compile_strict
from opcheck import INF, NAN, check_outputs, dtype_id, fallbacks, floats, ints
from torchfuse.codegen.triton import split

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

SMALL = split.SplitPolicy(min_elements=256, min_programs=64, target_programs=8, min_program_elements=32, outer_lanes=4)


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    monkeypatch.setattr(split, "POLICY", SMALL)


def compile_triton(fn, dynamic=False):
    return compile_strict(fn, dynamic=dynamic, options={"target": "triton"})


def splits() -> list[str]:
    return [note for graph in torchfuse.report().graphs for note in graph.split_reductions]


def run_named(build, *args):
    names = list(build(*args))
    fn = lambda *a: tuple(build(*a).values())  # noqa: E731
    check_outputs(fn, *args, names=names, compiled=compile_triton(fn), scale_tol=True)
    assert not fallbacks(), fallbacks()
    assert splits(), torchfuse.report()


def every_reduction(x, dim):
    """Every reduction op over ``dim`` (an int or None: all of x)."""
    dims = tuple(range(x.dim())) if dim is None else dim
    out = {"sum": x.sum(dims), "mean": x.mean(dims), "amax": x.amax(dims), "amin": x.amin(dims),
           "var": x.var(dims), "std0": x.std(dims, correction=0), "var_mean": torch.var_mean(x, dims),
           "any": (x > 3.5).any(dim) if dim is not None else (x > 3.5).any(),
           "all": (x > -3.5).all(dim) if dim is not None else (x > -3.5).all(),
           "prod": (x * 0.001 + 1).prod(dim) if dim is not None else (x * 0.001 + 1).prod(),
           "logsumexp": torch.logsumexp(x, dims), "norm": torch.linalg.vector_norm(x, dim=dims),
           "argmax": x.argmax(dim), "argmin": x.argmin(dim)}
    if dim is not None:
        out.update({"max_dim": x.max(dim), "min_dim": x.min(dim)})
    return out


# Shapes: a multiple of the chunk and prime lengths (a ragged last chunk).
@pytest.mark.parametrize("shape", [(1000, 7), (997, 5)], ids=str)
@pytest.mark.parametrize("dim", [0, None], ids=["columns", "all"])
def test_every_reduction_op(shape, dim):
    x = floats(shape, torch.float32, -4, 4, specials=[], seed=shape[0])
    run_named(lambda x: every_reduction(x, dim), x)


def test_few_long_rows_split_along_the_row():
    x = floats((3, 1009), torch.float32, -4, 4, specials=[], seed=3)
    run_named(lambda x: every_reduction(x, 1) | {"softmax": torch.softmax(x, -1)}, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=dtype_id)
def test_other_float_dtypes(dtype):
    x = floats((600, 6), dtype, -2, 2, specials=[], seed=1)
    run_named(lambda x: {"sum0": x.sum(0), "mean": x.mean(), "amax0": x.amax(0), "argmax": x.argmax(),
                         "var0": x.var(0), "sum_all": x.sum()}, x)


def test_half_sums_accumulate_in_float32():
    """2000 ones and one 256 in bf16: a bf16 accumulator would stop at 256 + ... and round; the
    float32 partials and their float32 total give eager's result."""
    x = torch.ones(4001, dtype=torch.bfloat16, device=DEVICE)
    x[17] = 256
    got = compile_triton(lambda x: x.sum())(x)
    assert got.item() == x.sum().item() == torch.tensor(4256.0, dtype=torch.bfloat16).item()
    assert splits()


def test_ties_nan_and_infinities_across_chunks():
    """The first of equal extremes wins even when they sit in different chunks; a NaN in a later
    chunk beats any value; a column of -inf gives index 0, as eager."""
    x = floats((1000, 6), torch.float32, -4, 4, specials=[], seed=5)
    x[10, 0] = x[900, 0] = 50.0  # tie across chunks
    x[700, 1] = NAN  # NaN in a later chunk; the max earlier
    x[3, 1] = 50.0
    x[:, 2] = -INF
    x[999, 3] = 60.0  # the max in the last element (ragged chunk when the length is prime)
    x[400, 4] = x[401, 4] = -50.0
    run_named(lambda x: {"argmax0": x.argmax(0), "argmin0": x.argmin(0), "max0": x.max(0), "min0": x.min(0),
                         "argmax": x.argmax(), "amax": x.amax(), "sum0": x.sum(0)}, x)
    torchfuse.reset()
    run_named(lambda x: {"argmax0": x.argmax(0), "argmin0": x.argmin(0), "max": x.max(0)}, x[:997])


def test_integer_and_bool_reductions():
    i = ints((900, 5), torch.int32, low=-5, high=6, seed=2)
    run_named(lambda i: {"sum0": i.sum(0), "sum": i.sum(), "argmax0": i.argmax(0), "argmin": i.argmin(),
                         "amax0": i.amax(0), "any0": (i > 4).any(0), "all": (i > -5).all(),
                         "bool_sum": (i > 0).sum(0), "prod": (i.abs() > 0).to(torch.int64).prod(0)}, i)


def test_views_and_layouts():
    """A transposed view, a strided slice, a broadcast and channels-last batch-norm statistics."""
    base = floats((40, 60), torch.float32, specials=[], seed=4)
    cl = floats((4, 8, 9, 7), torch.float32, specials=[], seed=6).to(memory_format=torch.channels_last)
    row = floats((1, 7), torch.float32, specials=[], seed=7)

    def build(base, cl, row):
        return {"transposed": base.t().sum(1), "transposed_all": base.t().amax(), "sliced": base[::2, 1:].sum(0),
                "broadcast": row.expand(500, 7).sum(0), "bn_stats": torch.var_mean(cl, (0, 2, 3), correction=0),
                "bn_sum": cl.sum((0, 2, 3))}

    run_named(build, base, cl, row)


@pytest.mark.parametrize("shape", [(3, 5, 7, 11), (1, 6, 227, 1)], ids=["even", "prime_ragged"])
def test_channels_last_statistics_through_a_cast(shape):
    """Autocast batch-norm statistics: bf16 channels-last x read through ``x.float()``, few
    channels. The cast's own node must not hide the layout: the split is outer (interleaved
    chunks, codegen/triton/split.py), also when the last chunk is ragged."""
    x = floats(shape, torch.bfloat16, specials=[], seed=11).to(memory_format=torch.channels_last)

    def build(x):
        return {"var_mean": torch.var_mean(x.float(), (0, 2, 3), correction=0), "sum": x.float().sum((0, 2, 3))}

    run_named(build, x)
    assert splits() and all("(outer)" in note for note in splits()), splits()


def test_few_outputs_get_at_most_max_chunks_each(monkeypatch):
    """Few channels over many rows would get thousands of chunks each: the second stage reads
    them in one short run of programs, so their number is capped (``SplitPolicy.max_chunks``)."""
    x = floats((4, 6, 9, 7), torch.bfloat16, specials=[], seed=12).to(memory_format=torch.channels_last)
    build = lambda x: {"var_mean": torch.var_mean(x.float(), (0, 2, 3), correction=0)}  # noqa: E731
    run_named(build, x)
    uncapped = splits()
    assert uncapped and all(" 6 chunks of 42 " in note for note in uncapped), uncapped
    torchfuse.reset()
    monkeypatch.setattr(split, "POLICY", split.SplitPolicy(**{**SMALL.__dict__, "max_chunks": 3}))
    run_named(build, x)
    assert splits() and all(" 3 chunks of 84 " in note for note in splits()), splits()


def test_prologues_and_epilogues():
    x = floats((800, 6), torch.float32, -2, 2, specials=[], seed=8)
    b = floats((6,), torch.float32, specials=[], seed=9)

    def build(x, b):
        y = torch.exp(x * 0.5) + b
        return {"prologue_epilogue": y.sum(0) / 3 + b, "normalized": x - x.mean(0, keepdim=True),
                "mse": ((x - b) ** 2).mean(), "l2": torch.sqrt((x * x).sum() + 1)}

    run_named(build, x, b)


def test_zero_size_and_size_one_dims_are_left_alone():
    x = torch.empty(0, 5, device=DEVICE)
    y = floats((1000, 1), torch.float32, specials=[], seed=10)
    fn = lambda x, y: (x.sum(0), x.sum(), y.sum(1), y.sum(0), y.amax())  # noqa: E731
    check_outputs(fn, x, y, compiled=compile_triton(fn), scale_tol=True)
    assert len(splits()) == 2  # y.sum(0) and y.amax(); nothing over the empty x or size-1 dims


def test_bias_and_norm_weight_gradients_of_a_training_step():
    """Bias and layer-norm weight gradients are column sums over the tokens: split and outer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8)).to(DEVICE)
    reference = copy.deepcopy(model).double()
    x = torch.randn(300, 12, device=DEVICE)
    compiled = compile_triton(model)
    compiled(x).pow(2).mean().backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(x).pow(2).mean().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    reference(x.double()).pow(2).mean().backward()
    for name, p in reference.named_parameters():
        assert_close(got[name], expected[name], reference=p.grad)
    assert splits(), torchfuse.report()


def test_dynamic_sizes_keep_one_outer_kernel():
    """Symbolic sizes are not split (the split needs numbers), but the column sum is still outer."""
    fn = lambda x: (x.sum(0), x.amax(0), x.argmax(0), x.var(0))  # noqa: E731
    compiled = compile_triton(fn, dynamic=True)
    for shape in [(700, 5), (333, 9)]:
        check_outputs(fn, floats(shape, torch.float32, specials=[], seed=shape[0]), compiled=compiled,
                      scale_tol=True)
    assert not splits()
    sources = [k.source for g in torchfuse.report().graphs for k in g.generated_kernels]
    assert any("[RBLOCK, XBLOCK]" in s for s in sources)
