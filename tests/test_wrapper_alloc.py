"""How the wrapper allocates its buffers (runtime/wrapper.py): CUDA buffers through torch's
allocation without the dispatcher (``tf_empty_cuda``) when the graph's device is the current
one, ``torch.empty_strided`` otherwise; CPU buffers as before."""
from __future__ import annotations

import pytest
import torch

import torchfuse
from conftest import compile_strict
from torchfuse.runtime import wrapper


def test_the_fallback_allocates_on_the_given_device_with_the_given_layout():
    empty = wrapper._empty_on(torch.device("cpu"))
    x = empty((2, 3, 4), (1, 8, 2), torch.bfloat16)
    assert (x.shape, x.stride(), x.dtype, x.device.type) == ((2, 3, 4), (1, 8, 2), torch.bfloat16, "cpu")


def test_the_cuda_allocation_names_are_always_bound():
    """Bound on every torch build (a wrapper restored from the graph cache binds them too);
    only a graph with CUDA buffers calls them."""
    names = wrapper._cuda_allocation()
    assert set(names) == {"tf_empty_strided_cuda", "tf_cuda_current_device"}
    assert callable(names["tf_empty_strided_cuda"])


def test_cpu_buffers_keep_torch_empty_strided():
    torchfuse.reset()
    fn = lambda x: (x.exp() + 1).sum(0) * x  # noqa: E731
    x = torch.randn(5, 7)
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    source = torchfuse.report().graphs[-1].wrapper_source
    assert "tf_empty_strided(" in source and "tf_empty_cuda" not in source


@pytest.mark.gpu
def test_cuda_buffers_are_allocated_without_the_dispatcher_and_are_correct():
    torchfuse.reset()

    def fn(x, w):
        h = torch.nn.functional.hardswish(x * w + 1)  # an intermediate, channels-last like x
        return h.mean((2, 3)), (h - h.mean((0, 2, 3), keepdim=True)).relu()

    for _ in range(2):
        x = torch.randn(4, 6, 5, 3, device="cuda").to(memory_format=torch.channels_last)
        w = torch.randn(1, 6, 1, 1, device="cuda")
        got, want = compile_strict(fn)(x, w), fn(x, w)
        for a, b in zip(got, want):
            assert a.stride() == b.stride()
            torch.testing.assert_close(a, b)
    source = torchfuse.report().graphs[-1].wrapper_source
    index = torch.cuda.current_device()
    assert f"tf_empty_cuda = tf_empty_strided_cuda if tf_cuda_current_device() == {index}" in source, source
    assert "tf_empty_cuda((" in source and "tf_empty_strided(" not in source, source


def test_a_backward_graph_frees_each_saved_activation_after_its_last_use():
    """A backward graph's inputs are the saved activations: each is dropped after the last
    kernel or ATen call that reads it, not held to the end (the last layers' activations are
    freed while the first layers' gradients are computed, as eager's autograd frees them)."""
    torchfuse.reset()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(4)])
    reference = [p.detach().clone() for p in layers.parameters()]
    x = torch.randn(8, 16, requires_grad=True)
    compiled = compile_strict(layers)
    compiled(x).square().sum().backward()
    backward = next(g for g in torchfuse.report().graphs if g.kind == "backward")
    lines = [line.strip() for line in backward.wrapper_source.splitlines()]
    work = [i for i, line in enumerate(lines) if "(" in line and not line.startswith(("del ", "#", "return", "def "))]
    dropped = {name: next((i for i, line in enumerate(lines) if line == f"del {name}"), None)
               for name in backward.input_buffers if name not in backward.output_buffers}
    assert dropped and all(line is not None for line in dropped.values()), (dropped, backward.wrapper_source)
    assert any(line < work[-1] for line in dropped.values()), backward.wrapper_source
    # the gradients are still eager's
    eager = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(4)])
    with torch.no_grad():
        for p, value in zip(eager.parameters(), reference):
            p.copy_(value)
    x_eager = x.detach().clone().requires_grad_()
    eager(x_eager).square().sum().backward()
    torch.testing.assert_close(x.grad, x_eager.grad)
    for ours, theirs in zip(layers.parameters(), eager.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
