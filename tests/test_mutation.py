"""Input mutations (``x.add_(...)`` in a compiled function, optimizer state, running stats):
the mutated inputs end up as eager leaves them, written in place by the kernel when that is safe."""
from __future__ import annotations

import platform

import pytest
import torch

import torchfuse
from conftest import DEVICE, compile_cpp, compile_strict
from torchfuse.runtime import cpp_build

CASES = {
    # name: (fn, inputs written in place), whether x is contiguous or transposed: the new value's
    # buffer, read by the copy_ back into x, takes the layout tracing gave it, which is x's
    # (lowering/extern.py), and only a buffer with the input's exact layout can be the input.
    "scale_in_place": (lambda x, y: (x.mul_(y).add_(1), y * 2)[1], 1),
    "two_inputs_one_kernel": (lambda x, y: (x.mul_(0.5).add_(y), y.sub_(x * 0.1), y * 2)[2], 2),
    "old_value_read_in_the_same_kernel": (lambda x, y: (x * 3, x.add_(1))[0] + y, 1),
    # the new value is computed inside a reduction kernel: not (yet) written in place
    "add_then_reduce_new_value": (lambda x, y: (x.add_(y * 2), x.sum())[1], 0),
    "old_value_read_by_a_reduction": (lambda x, y: (x.sum(0), x.add_(y))[0], 0),
    "read_at_another_element": (lambda x, y: x.add_(x.flip(0)).sum(), 0),
    "copy_from_an_input": (lambda x, y: x.copy_(y).sum(), 0),
    # the graph returns the new value itself: aot_autograd rebuilds that output from the input
    "returns_the_mutated_input": (lambda x, y: x.add_(y), 0),
    # the new value is a per-row member of a reduction kernel, which alone reads x there
    "running_statistic": (lambda x, y: (x.mul_(0.9).add_(y.mean(0, keepdim=True) * 0.1), y * 2)[1], 1),
    # ... and a kernel-mate reads the old x too: it could run after the store, so not in place
    "running_statistic_old_value_read": (lambda x, y: (x * y.sum(0, keepdim=True),
                                                       x.mul_(0.9).add_(y.mean(0, keepdim=True) * 0.1))[0], 0),
}
ROW_STATISTICS = ("running_statistic", "running_statistic_old_value_read")


def inputs(transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 9, generator=gen), torch.randn(6, 9, generator=gen)
    if transposed:
        x = torch.randn(9, 6, generator=gen).t()
    return x.to(DEVICE), y.to(DEVICE)


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_mutated_inputs_and_outputs_match_eager(name, transposed):
    fn, in_place = CASES[name]
    if name in ROW_STATISTICS:
        x_eager, y_eager = torch.randn(1, 9).to(DEVICE), inputs()[1]
    else:
        x_eager, y_eager = inputs(transposed)
    x_comp, y_comp = x_eager.clone(), y_eager.clone()
    if transposed and name not in ROW_STATISTICS:
        x_comp = x_eager.t().clone().t()  # same values, same (transposed) layout
    expected = fn(x_eager, y_eager)
    got = compile_strict(fn)(x_comp, y_comp)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x_comp, x_eager)
    torch.testing.assert_close(y_comp, y_eager)
    wrappers = "".join(g.wrapper_source for g in torchfuse.report().graphs)
    assert wrappers.count("written in place") == in_place, wrappers


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_batch_norm_running_statistics_are_written_by_their_kernel(channels_last):
    """Batch norm's running mean and variance are stored by the kernel that computes the batch
    statistics (no copy_ back into them after it: an ATen call and a launch each, per batch
    norm and step), and after three training steps equal eager's."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.BatchNorm2d(5), torch.nn.ReLU()).to(DEVICE)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(5), torch.nn.ReLU()).to(DEVICE)
    model.load_state_dict(eager.state_dict())
    compiled = compile_strict(model)
    for step in range(3):
        x = torch.randn(4, 5, 7, 3, generator=torch.Generator().manual_seed(step)) * (step + 1) + step
        x = x.to(DEVICE, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        eager(x).sum().backward()
        compiled(x.clone()).sum().backward()
    for name, want in eager[0].state_dict().items():
        torch.testing.assert_close(model[0].state_dict()[name], want, msg=name)
    torch.testing.assert_close(model[0].weight.grad, eager[0].weight.grad)
    wrappers = "".join(g.wrapper_source for g in torchfuse.report().graphs)
    assert "aten.copy_" not in wrappers, wrappers
    assert wrappers.count("written in place") == 3, wrappers  # the count of batches too


def test_repeated_calls_keep_mutating_the_same_tensor():
    fn = lambda acc, x: acc.add_(x.square())  # noqa: E731
    compiled = compile_strict(fn)
    acc_eager, acc_comp = torch.zeros(5, 7, device=DEVICE), torch.zeros(5, 7, device=DEVICE)
    for seed in range(3):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        fn(acc_eager, x)
        compiled(acc_comp, x)
    torch.testing.assert_close(acc_comp, acc_eager)
    assert not any(g.fallbacks for g in torchfuse.report().graphs)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or not cpp_build.compiler_available(),
                    reason="x86-64 code from a C++ compiler")
def test_kernel_writing_over_an_input_it_reads_is_correct_for_other_cpus(monkeypatch, compile_target):
    if compile_target != "cpp":
        pytest.skip("C++ code generation")
    # x.add_(1) is written into x by the kernel that also reads x for x * 3. Its pointers were
    # __restrict__, a false promise: GCC tuned for Zen 2 (any AVX2 AMD EPYC with -march=native)
    # reloaded x from memory after storing x + 1 over it, so 16 of 54 elements came out 3 too large.
    # The SSE2 baseline with that tuning reproduces it on every x86-64 machine.
    monkeypatch.setenv("TORCHFUSE_CPP_ARCH", "x86-64")
    monkeypatch.setenv("TORCHFUSE_CXXFLAGS", "-mtune=znver2")
    fn, _ = CASES["old_value_read_in_the_same_kernel"]
    x_eager, y = (t.cpu() for t in inputs())
    x_comp = x_eager.clone()
    expected = fn(x_eager, y)
    got = compile_cpp(fn)(x_comp, y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x_comp, x_eager)
    graph = torchfuse.report().graphs[0]
    assert "written in place" in graph.wrapper_source
    assert all("__restrict__" not in k.source for k in graph.generated_kernels)
