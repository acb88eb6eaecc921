"""Inputs that differ from the first call's: a compiled function must recompile (or run a
shape-generic graph correctly), never return a wrong result.

Each test calls the compiled function once with a plain contiguous float32 input, then with the
variant, and compares with eager (float64 reference).
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from conftest import DEVICE, assert_close, compile_strict, to_float64


def model(x: torch.Tensor) -> torch.Tensor:
    """Pointwise, a reduction over the last dim, a broadcast back and a view: strides matter."""
    y = torch.sigmoid(x) * 2 + x
    return (y - y.amax(-1, keepdim=True)).exp().flatten(-2)


def first_then(fn: Callable, first: torch.Tensor, second: torch.Tensor) -> None:
    """Compile ``fn``, call it on ``first`` then on ``second``; both must match eager."""
    compiled = compile_strict(fn)
    for x in (first, second):
        expected = fn(x)
        reference = fn(to_float64(x)) if x.is_floating_point() else None
        actual = compiled(x)
        assert_close(actual, expected, reference=None if reference is None else reference.to(expected.dtype))


def base(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtype(dtype):
    first_then(model, base(4, 5, 6), base(4, 5, 6).to(dtype))


def test_integer_dtype():
    fn = lambda x: (x * 3 + 1).sum(-1) - x.amax(-1)  # noqa: E731 - a one-line program
    first_then(fn, torch.randint(-9, 9, (4, 6), device=DEVICE).float(), torch.randint(-9, 9, (4, 6), device=DEVICE))


def test_bool_input():
    fn = lambda x: (x.logical_not() | x).sum(-1)  # noqa: E731 - a one-line program
    first_then(fn, torch.rand(4, 6, device=DEVICE) > 0.5, torch.rand(4, 6, device=DEVICE).double() > 0.5)


@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 5, 6), (6,), (0, 6), (1, 1)])
def test_other_rank(shape):
    fn = lambda x: torch.sigmoid(x) * 2 - x.amax(-1, keepdim=True)  # noqa: E731 - a one-line program
    first_then(fn, base(4, 5, 6), base(*shape))


@pytest.mark.parametrize("layout", ["transposed", "sliced", "storage_offset", "expanded", "channels_last",
                                    "negative_step_flip", "one_element", "zero_sized"])
def test_other_layout(layout):
    first_then(model, base(2, 3, 4, 5), _layout(layout))


def _layout(name: str) -> torch.Tensor:
    """A tensor of shape (2, 3, 4, 5) (or a degenerate one) with an unusual layout."""
    if name == "transposed":
        return base(2, 3, 5, 4).transpose(-1, -2)
    if name == "sliced":
        return base(2, 3, 4, 10)[..., ::2]
    if name == "storage_offset":
        return base(121)[1:].view(2, 3, 4, 5)
    if name == "expanded":
        return base(1, 3, 1, 5).expand(2, 3, 4, 5)
    if name == "channels_last":
        return base(2, 3, 4, 5).to(memory_format=torch.channels_last)
    if name == "negative_step_flip":
        return base(2, 3, 4, 5).flip(-1)
    if name == "one_element":
        return base(1, 1, 1, 1)
    return base(2, 0, 4, 5)


def test_layout_changes_after_several_calls():
    """Each new layout after the first: guards on strides must not reuse a kernel compiled for another."""
    compiled = compile_strict(model)
    for name in ("transposed", "sliced", "channels_last", "storage_offset", "expanded"):
        x = _layout(name)
        assert_close(compiled(x), model(x), reference=model(to_float64(x)).float())
        contiguous = base(2, 3, 4, 5)
        assert_close(compiled(contiguous), model(contiguous), reference=model(to_float64(contiguous)).float())


def test_output_strides_follow_eager_for_a_transposed_input():
    fn = lambda x: x * 2  # noqa: E731 - a one-line program
    compiled = compile_strict(fn)
    compiled(base(4, 6))
    x = base(6, 4).t()
    actual, expected = compiled(x), fn(x)
    assert_close(actual, expected)
    assert actual.stride() == expected.stride()


def test_in_place_update_of_a_non_contiguous_input():
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2).add_(1)
        return x.sum(0)

    compiled = compile_strict(fn)
    for x in (base(4, 6), base(6, 4).t(), base(4, 12)[:, ::2]):
        eager_x, compiled_x = x.clone(), x.clone()
        if not x.is_contiguous():  # keep the layout in the copies
            eager_x, compiled_x = (torch.empty_strided(x.shape, x.stride()).copy_(x) for _ in range(2))
        expected = fn(eager_x)
        actual = compiled(compiled_x)
        assert_close(actual, expected)
        assert_close(compiled_x, eager_x)


def test_meta_tensor_after_cpu_gives_eagers_shape_and_dtype():
    compiled = compile_strict(model)
    compiled(base(2, 3, 4, 5))
    x = torch.empty(2, 3, 4, 5, device="meta")
    actual, expected = compiled(x), model(x)
    assert actual.device == expected.device and actual.shape == expected.shape and actual.dtype == expected.dtype


def test_mixing_meta_and_cpu_raises_like_eager():
    fn = lambda x, y: torch.sigmoid(x) + y  # noqa: E731 - a one-line program
    x, y = torch.randn(3), torch.randn(3, device="meta")
    with pytest.raises(RuntimeError) as eager_error:
        fn(x, y)
    compiled = compile_strict(fn)
    compiled(x, torch.randn(3))  # first call: all on the CPU
    with pytest.raises(RuntimeError) as compiled_error:
        compiled(x, y)
    assert "meta" in str(compiled_error.value) and "meta" in str(eager_error.value)


@pytest.mark.gpu
def test_mixing_cuda_and_cpu_raises_like_eager():
    fn = lambda x, y: torch.sigmoid(x) + y  # noqa: E731 - a one-line program
    x, y = torch.randn(3, device="cuda"), torch.randn(3)
    with pytest.raises(RuntimeError):
        fn(x, y)
    compiled = compile_strict(fn)
    compiled(x, torch.randn(3, device="cuda"))
    with pytest.raises(RuntimeError):
        compiled(x, y)


@pytest.mark.gpu
def test_cpu_after_cuda_recompiles():
    compiled = compile_strict(model, options={"target": "auto"})
    x = base(2, 3, 4, 5)
    assert_close(compiled(x), model(x))
    cpu = x.cpu()
    actual = compiled(cpu)
    assert actual.device.type == "cpu"
    assert_close(actual, model(cpu))
