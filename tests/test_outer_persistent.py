"""A persistent outer reduction whose epilogue loads rows loads the values it reduces that vary
along the rows only as whole tiles (codegen/triton/kernel.py, TILE_SHAPED_ROW_LOADS), while its
epilogue keeps rows: checked on the rendered source and for results through Triton's
interpreter."""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, assert_close
from helpers.rendering import rendered_kernels
from torchfuse.codegen.triton import kernel


def bias_grad_and_scaled_bias(grad, probs, bias):
    """A batch sum over a broadcast bias (T5's position bias, [1, H, Q, K]) beside a pointwise
    result of the same bias: one kernel, the bias read in the sum and in the epilogue."""
    return (probs * (grad + bias)).sum(0), bias * 2


def _args(b: int, h: int, q: int, k: int, device: str = "cpu") -> list[torch.Tensor]:
    return [torch.randn(b, h, q, k, device=device), torch.rand(b, h, q, k, device=device),
            torch.randn(1, h, q, k, device=device)]


def test_row_values_of_the_sum_load_as_tiles_and_the_epilogue_keeps_rows():
    kernels = rendered_kernels(bias_grad_and_scaled_bias, _args(16, 8, 64, 64))
    (fused,) = [k for k in kernels if k.kind == "reduction"]
    assert fused.outer and fused.persistent, fused.source
    bias = f"ptr{fused.pointer_args.index('bias_1')}"
    loads = [line.split(" = ", 1)[1] for line in fused.source.splitlines() if f"tl.load({bias} " in line]
    assert loads == [f"tl.load({bias} + (xindex + 0 * rindex), xmask & rmask, other=0)",
                     f"tl.load({bias} + (xindex), xmask, other=0)"], fused.source


def test_without_an_epilogue_that_loads_rows_stay_rows():
    """A pool over a per-channel scale has nothing for Triton to convert its tiles to: its
    scale stays a row (a tile would only add live registers)."""
    kernels = rendered_kernels(lambda x, scale: (x * scale).sum(0), [torch.randn(16, 4096), torch.randn(4096)])
    (pool,) = [k for k in kernels if k.kind == "reduction"]
    assert pool.outer and pool.persistent and "0 * rindex" not in pool.source, pool.source


def test_the_rule_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(kernel, "TILE_SHAPED_ROW_LOADS", False)
    (fused,) = [k for k in rendered_kernels(bias_grad_and_scaled_bias, _args(16, 8, 64, 64)) if k.kind == "reduction"]
    assert "0 * rindex" not in fused.source


@pytest.mark.parametrize("tiled", [True, False], ids=["tile_loads", "row_loads"])
@pytest.mark.parametrize("shape", [(3, 2, 5, 64), (7, 3, 3, 33)], ids=str)
def test_results_match_float64(monkeypatch, tiled, shape):
    monkeypatch.setattr(kernel, "TILE_SHAPED_ROW_LOADS", tiled)
    args = _args(*shape, device=DEVICE)
    compiled = torch.compile(bias_grad_and_scaled_bias, backend="torchfuse", options={"target": "triton", "strict": True})
    reference = bias_grad_and_scaled_bias(*(a.double() for a in args))
    for got, expected, exact in zip(compiled(*args), bias_grad_and_scaled_bias(*args), reference):
        assert_close(got, expected, reference=exact)
