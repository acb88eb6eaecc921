"""Light looped outer reductions whose step computes special functions of each element among
SPECIAL_STEP_MIN_OPS ops or more (a squeeze-excite pool over BN + SiLU) launch many small
programs (launch_configs.SPECIAL_STEP_TILE); others (a SiLU alone, a plain sum) keep the usual
tiles. The renderer marks the step (TritonKernel.special_step) from the IR, and the launch rule
reads the mark."""
from __future__ import annotations

import torch

from conftest import DEVICE, assert_close
from helpers.rendering import rendered_kernels
from torchfuse.codegen.triton import kernel
from torchfuse.codegen.triton.kernel import SPECIAL_OPS, SPECIAL_STEP, SPECIAL_STEP_MIN_OPS, TRANSCENDENTAL_STEP
from torchfuse.runtime.launch_configs import SPECIAL_STEP_TILE, reduction_config


def compile_triton(fn):
    return torch.compile(fn, backend="torchfuse", options={"target": "triton", "strict": True})


def test_a_light_outer_step_with_special_functions_takes_small_tiles():
    special = reduction_config(False, 18432, 3136, outer=True, live_tiles=2, special_step=SPECIAL_STEP)
    plain = reduction_config(False, 18432, 3136, outer=True, live_tiles=2)
    assert special.constexprs == SPECIAL_STEP_TILE and special.grid == 18432 // SPECIAL_STEP_TILE[0]
    assert plain.constexprs != special.constexprs
    # heavy steps (many live tiles) keep their own rule; persistent and inner ones ignore the mark
    heavy = reduction_config(False, 18432, 3136, outer=True, live_tiles=6, special_step=SPECIAL_STEP)
    assert heavy == reduction_config(False, 18432, 3136, outer=True, live_tiles=6)
    assert reduction_config(False, 4096, 8192, special_step=SPECIAL_STEP) == reduction_config(False, 4096, 8192)
    # fewer lanes than the tile's: the lanes shrink to the outputs, the rows to the row
    small = reduction_config(False, 6, 40, outer=True, live_tiles=1, special_step=SPECIAL_STEP)
    assert small.constexprs == (8, 64) and small.grid == 1


def test_a_heavy_step_with_transcendental_functions_takes_tiles_of_4096_over_its_live_tiles():
    """Swin's relative-position bias gradient sum (57624 outputs of 256, exp and a division an
    element, 7 live tiles): [64 x 8], 4 warps, 70.6 us on the H100, where the 8192 elements of
    other heavy steps gave [128 x 8], 8 warps, 142.3 us. A step with divisions alone keeps 8192."""
    exp = reduction_config(False, 57_624, 256, outer=True, live_tiles=7, special_step=TRANSCENDENTAL_STEP)
    assert (exp.grid, exp.constexprs, exp.num_warps) == (901, (64, 8), 4)
    division = reduction_config(False, 57_624, 256, outer=True, live_tiles=7, special_step=SPECIAL_STEP)
    assert (division.grid, division.constexprs, division.num_warps) == (451, (128, 8), 8)
    assert division == reduction_config(False, 57_624, 256, outer=True, live_tiles=7)


def _pool(x, mean, rstd, weight, bias):
    """EfficientNet's squeeze-excite pool: a BN in float32 rounded to bfloat16, SiLU, the mean
    (10 ops an element)."""
    y = ((x.float() - mean) * rstd * weight + bias).to(x.dtype)
    return torch.nn.functional.silu(y).mean((2, 3))


def _silu_pool(x):
    """The pattern's pool (bench.patterns.squeeze_excite_pool): SiLU alone, 4 ops an element."""
    return torch.nn.functional.silu(x).mean((2, 3))


def _rendered_reductions(fn, args) -> list:
    """The rendered reduction kernels of ``fn`` on the Triton target (nothing runs)."""
    return [k for k in rendered_kernels(fn, args) if k.kind == "reduction"]


def _pool_inputs(batch: int = 64, c: int = 144, hw: int = 28) -> list[torch.Tensor]:
    """Enough outputs (9216) that the pool is not split, rows (784) too long to be persistent."""
    x = torch.randn(batch, c, hw, hw).to(torch.bfloat16).to(memory_format=torch.channels_last)
    params = [torch.randn(1, c, 1, 1) for _ in range(4)]
    params[1] = params[1].abs() + 0.5
    return [x, *params]


def test_the_renderer_marks_a_pool_over_bn_and_silu_not_a_silu_alone_nor_a_plain_sum():
    args = _pool_inputs()
    (pool,) = _rendered_reductions(_pool, args)
    assert pool.outer and not pool.persistent and pool.special_step, pool.source
    for fn in (_silu_pool, lambda t: t.sum((2, 3))):
        (other,) = _rendered_reductions(fn, args[:1])
        assert other.outer and not other.persistent and not other.special_step, other.source
    assert SPECIAL_OPS >= {"exp", "sigmoid", "truediv", "rsqrt"} and SPECIAL_STEP_MIN_OPS > 4


def test_a_pool_over_silu_launched_with_the_small_tiles_is_right():
    """Odd sizes (rows of 169: a last step of 41; 1488 outputs, under the 2**18 elements a split
    needs): the last step's rows are masked."""
    torch.manual_seed(0)
    x, *params = [a.to(DEVICE) for a in _pool_inputs(batch=31, c=48, hw=13)]
    got = compile_triton(_pool)(x, *params)
    want = _pool(x.double(), *[p.double() for p in params]).to(torch.bfloat16)
    assert_close(got, _pool(x, *params), reference=want)


def test_packed_roundings_are_rendered_in_looped_reductions_only(monkeypatch):
    args = _pool_inputs()
    monkeypatch.setattr(kernel, "PACKED_ROUNDINGS", False)  # as on ROCm
    (plain,) = _rendered_reductions(_pool, args)
    assert "_round_bf16(" in plain.source and "_round_bf16_pairs" not in plain.source
    monkeypatch.setattr(kernel, "PACKED_ROUNDINGS", True)
    (packed,) = _rendered_reductions(_pool, args)
    loop = packed.source[packed.source.index("for roffset"):packed.source.index("tl.reduce(")]
    assert loop.count("_round_bf16_pairs(") == 2 and "_round_bf16(" not in loop  # the BN's and the SiLU's
    # a persistent reduction (rows of 49) keeps the plain helper: the store pairs its roundings
    (short,) = _rendered_reductions(_pool, _pool_inputs(batch=8, c=16, hw=7))
    assert short.persistent and "_round_bf16_pairs" not in short.source


def test_a_pool_with_packed_roundings_equals_the_plain_one_bit_for_bit(monkeypatch):
    """Both helpers round to nearest even: on a GPU ``cvt.rn.bf16x2.f32`` against one ``cvt`` an
    element, on the CPU the interpreter's integer rounding in both."""
    torch.manual_seed(0)
    x, *params = [a.to(DEVICE) for a in _pool_inputs(batch=5, c=24, hw=29)]
    monkeypatch.setattr(kernel, "PACKED_ROUNDINGS", False)
    plain = compile_triton(_pool)(x, *params)
    torch._dynamo.reset()
    monkeypatch.setattr(kernel, "PACKED_ROUNDINGS", True)
    packed = compile_triton(_pool)(x, *params)
    assert torch.equal(packed, plain)
    want = _pool(x.double(), *[p.double() for p in params]).to(torch.bfloat16)
    assert_close(packed, _pool(x, *params), reference=want)
