"""Pointwise kernels tiled in 2-D (codegen/triton/tiles2d.py), on the Triton target, against
eager and float64.

Kernels whose large read is contiguous along another row than their store (transposes,
NCHW <-> NHWC, a key transposed for a matmul) run as [YBLOCK, XBLOCK] tiles. Every test here
that expects a tile checks the generated source has one, so a policy change cannot silently
turn it into a test of the 1-D path; the layout of the accesses is checked statically in
tests/test_coalescing.py. On CPU the kernels run in Triton's interpreter.
"""
from __future__ import annotations

import random

import pytest
import torch

import torchfuse
from conftest import DEVICE, compile_strict
from opcheck import check_outputs, compare, dtype_id, fallbacks, floats, ints

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def compile_triton(fn, dynamic=False):
    return compile_strict(fn, dynamic=dynamic, options={"target": "triton"})


def tiled_kernels() -> list[str]:
    """Sources of the 2-D tiled kernels compiled since the last reset."""
    return [k.source for g in torchfuse.report().graphs for k in g.kernels
            if k.source and "YBLOCK: tl.constexpr" in k.source]


def run(fn, *args, tiles: int, dynamic=False):
    """``fn`` compiled for Triton matches eager and float64; ``tiles`` of its kernels are 2-D."""
    check_outputs(fn, *args, compiled=compile_triton(fn, dynamic=dynamic))
    assert not fallbacks(), fallbacks()
    assert len(tiled_kernels()) == tiles, torchfuse.report()


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.to(memory_format=torch.channels_last)


@pytest.mark.parametrize("shape", [(33, 65), (64, 128), (16, 17), (100, 48)], ids=str)
def test_transposed_add(shape):
    x = floats(shape[::-1], torch.float32, seed=1)
    y = floats(shape, torch.float32, seed=2)
    run(lambda x, y: y + x.t(), x, y, tiles=1)


def test_transpose_add_relu_chain_with_two_outputs():
    """A fused chain storing two outputs; both are written from the same tile."""
    x, y = floats((40, 72), torch.float32, seed=3), floats((72, 40), torch.float32, seed=4)

    def fn(x, y):
        a = torch.relu(x.t() * 2 + y)
        return a, torch.sigmoid(a) - y
    run(fn, x, y, tiles=1)


def test_broadcasts_into_a_transposed_add():
    """Row and column vectors and a scalar broadcast over the tile's axes."""
    x, y = floats((48, 80), torch.float32, seed=5), floats((80, 48), torch.float32, seed=6)
    row, col = floats((48,), torch.float32, seed=7), floats((80, 1), torch.float32, seed=8)
    run(lambda x, y, row, col: (x.t() + y) * row + col - 0.5, x, y, row, col, tiles=1)


@pytest.mark.parametrize("shape", [(2, 20, 7, 9), (3, 33, 5, 8), (1, 64, 16, 16)], ids=str)
def test_nchw_to_channels_last(shape):
    x = floats(shape, torch.float32, seed=9)
    run(lambda x: x.contiguous(memory_format=torch.channels_last) * 1.5, x, tiles=1)


@pytest.mark.parametrize("shape", [(2, 20, 7, 9), (3, 33, 5, 8)], ids=str)
def test_channels_last_to_nchw(shape):
    x = channels_last(floats(shape, torch.float32, seed=10))
    run(lambda x: x.contiguous() + 1, x, tiles=1)


def test_channels_last_bn_relu_against_contiguous_residual():
    """A channels-last activation plus a contiguous residual: the residual is read in 2-D."""
    x = channels_last(floats((2, 24, 6, 7), torch.float32, seed=11))
    residual = floats((2, 24, 6, 7), torch.float32, seed=12)
    scale, shift = floats((24,), torch.float32, seed=13), floats((24,), torch.float32, seed=14)
    run(lambda x, r, s, b: torch.relu(x * s.view(1, -1, 1, 1) + b.view(1, -1, 1, 1) + r),
        x, residual, scale, shift, tiles=1)


def test_bhsd_to_bshd_stays_one_dimensional():
    """Both sides contiguous along D: the 1-D kernel already reads whole runs of D."""
    q = floats((2, 3, 17, 24), torch.float32, seed=15)
    run(lambda q: q.permute(0, 2, 1, 3).reshape(2, 17, 72) * 2, q, tiles=0)


def test_key_transpose_in_batches():
    """[B, H, S, D] -> [B, H, D, S]: the batch rows are outside the tile (one per program)."""
    k = floats((2, 3, 40, 24), torch.float32, seed=16)
    run(lambda k: k.transpose(-1, -2).contiguous() * 0.5, k, tiles=1)


def test_index_values_along_every_group():
    """Positions (aranges) along the tile's axes and along the batch rows outside it."""
    k = floats((3, 2, 40, 24), torch.float32, seed=37)

    def fn(k):
        b, h, s, d = k.shape
        batch = torch.arange(b, device=k.device).view(b, 1, 1, 1) * 100.0
        return k.transpose(-1, -2).contiguous() + batch + torch.arange(d, device=k.device).view(d, 1) + torch.arange(s, device=k.device)
    run(fn, k, tiles=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=dtype_id)
def test_float_dtypes(dtype):
    x, y = floats((36, 50), dtype, seed=17), floats((50, 36), dtype, seed=18)
    run(lambda x, y: x.t() * y + 1, x, y, tiles=1)


def test_mixed_dtypes():
    """bfloat16 read transposed, float32 and int32 contiguous; float32 and bool results."""
    x = floats((40, 56), torch.bfloat16, seed=19)
    y = floats((56, 40), torch.float32, seed=20)
    n = ints((56, 40), torch.int32, seed=21)

    def fn(x, y, n):
        s = x.t() + y * n
        return s, s > 0
    run(fn, x, y, n, tiles=1)


def test_integer_transpose():
    x, y = ints((24, 48), torch.int64, seed=22), ints((48, 24), torch.int32, seed=23)
    run(lambda x, y: x.t() * 3 - y, x, y, tiles=1)


@pytest.mark.parametrize("shape", [(0, 40), (40, 0)], ids=str)
def test_zero_size(shape):
    x, y = floats(shape, torch.float32, seed=24), floats(shape[::-1], torch.float32, seed=25)
    run(lambda x, y: x.t() + y, x, y, tiles=0)


def test_in_place_add_of_a_transpose():
    """``x.add_(y.t())`` writes x in place from a tile that reads y transposed."""
    def fn(x, y):
        x.add_(y.t())
        return x * 2

    x, y = floats((48, 40), torch.float32, seed=26), floats((40, 48), torch.float32, seed=27)
    mutated, eager_mutated = x.clone(), x.clone()
    got = compile_triton(fn)(mutated, y)
    expected = fn(eager_mutated, y)
    assert not compare(got, expected, name="result") + compare(mutated, eager_mutated, name="x")
    assert "written in place" in torchfuse.report().graphs[-1].wrapper_source
    assert len(tiled_kernels()) == 1


def test_gathered_rows_next_to_a_transposed_read():
    x, y = floats((32, 64), torch.float32, seed=28), floats((64, 32), torch.float32, seed=29)
    table = floats((10,), torch.float32, seed=30)
    idx = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(31)).to(DEVICE)
    run(lambda x, y, t, i: x.t() + y * t[i][:, None], x, y, table, idx, tiles=1)


def test_int64_indexing(monkeypatch):
    """Kernels touching buffers over 2**31 elements index in int64 (forced here on small ones)."""
    from torchfuse.codegen.triton import kernel

    monkeypatch.setattr(kernel, "_needs_int64", lambda *args: True)
    x = floats((3, 20, 7, 9), torch.float32, seed=36)
    run(lambda x: x.contiguous(memory_format=torch.channels_last) - 1, x, tiles=1)
    assert "tl.program_id(0).to(tl.int64)" in tiled_kernels()[0]


def test_dynamic_sizes_fall_back_to_one_dimension():
    x, y = floats((33, 65), torch.float32, seed=32), floats((65, 33), torch.float32, seed=33)
    run(lambda x, y: x.t() + y, x, y, tiles=0, dynamic=True)
    x, y = floats((40, 70), torch.float32, seed=34), floats((70, 40), torch.float32, seed=35)
    check_outputs(lambda x, y: x.t() + y, x, y, compiled=compile_triton(lambda x, y: x.t() + y, dynamic=True))


def _permutations(count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(shape, permutation) pairs of 2-5 dims, sizes from 1 to 40: runs too short to tile and
    long ones, several rows per run, size-1 rows, batch rows outside the tile."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        shape = [rng.choice([1, 2, 5, 17, 24, 33, 40]) for _ in range(rng.randint(2, 5))]
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        cases.append((shape, perm))
    return cases


def test_random_permutations():
    """``relu(x.permute(p).contiguous() * 2 + y)``: exact, tiled or not (some must be)."""
    tiled = 0
    for k, (shape, perm) in enumerate(_permutations(10, seed=4)):
        torchfuse.reset()
        x = floats(shape, torch.float32, specials=[], seed=k)
        y = floats([shape[p] for p in perm], torch.float32, specials=[], seed=100 + k)

        def fn(x, y, perm=perm):
            return torch.relu(x.permute(*perm).contiguous() * 2 + y)
        got = compile_triton(fn)(x, y)
        assert not compare(got, fn(x, y), name=f"{shape} permuted {perm}")
        tiled += len(tiled_kernels())
    assert tiled >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["transposed_add", "nchw_to_channels_last", "channels_last_to_nchw", "key_transpose"])
def test_tiled_kernels_on_the_gpu(case):
    """The model-sized cases of tests/test_coalescing.py, compiled for the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)

    cases = {
        "transposed_add": (lambda x, y: torch.relu(x.t() + y), (randn(4096, 4096), randn(4096, 4096))),
        "nchw_to_channels_last": (lambda x: x.contiguous(memory_format=torch.channels_last),
                                  (randn(32, 64, 56, 56, dtype=torch.bfloat16),)),
        "channels_last_to_nchw": (lambda x: x.contiguous() * 2, (channels_last(randn(32, 64, 56, 56)),)),
        "key_transpose": (lambda k: k.transpose(-1, -2).contiguous(), (randn(8, 12, 512, 64, dtype=torch.bfloat16),)),
    }
    fn, args = cases[case]
    check_outputs(fn, *args, compiled=compile_strict(fn, dynamic=False, options={"target": "triton"}))
    assert len(tiled_kernels()) == 1, torchfuse.report()
