"""GPU-only checks (``pytest -m gpu``): real Triton on CUDA, bfloat16, kernel counts vs Inductor."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchfuse
from torchfuse.bench.patterns import PATTERNS, to_reference
from conftest import compile_strict
from torchfuse.models.llama import make_llama_block

pytestmark = pytest.mark.gpu


def _kernels_launched(step) -> int:
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if "memcpy" not in n.lower() and "memset" not in n.lower())


def _relative_error(actual, reference) -> float:
    return ((actual.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.name for p in PATTERNS])
def test_patterns_in_bfloat16_on_gpu(pattern):
    inputs = pattern.make_inputs("cuda", torch.bfloat16, "small")
    compiled = compile_strict(pattern.fn)
    ours, eager = compiled(*inputs), pattern.fn(*inputs)
    reference = pattern.fn(*to_reference(inputs))
    ours, eager, reference = [x if isinstance(x, (tuple, list)) else (x,) for x in (ours, eager, reference)]
    for o, e, r in zip(ours, eager, reference):
        assert torch.isfinite(o).all()
        assert _relative_error(o, r) <= max(2 * _relative_error(e, r), 5e-3)


def test_llama_block_bf16_training_step_launches_no_more_kernels_than_inductor():
    model, x = make_llama_block("cuda", torch.bfloat16, "small")

    def step_of(module):
        def step():
            inp = x.detach().requires_grad_()
            module(inp).float().pow(2).mean().backward()
            return inp.grad
        return step

    reference_model = copy.deepcopy(model).double()
    inp = x.detach().double().requires_grad_()
    reference_model(inp).pow(2).mean().backward()
    eager_grad = step_of(model)()
    ours_grad = step_of(compile_strict(model))()
    assert _relative_error(ours_grad, inp.grad) <= max(2 * _relative_error(eager_grad, inp.grad), 1e-2)

    ours = _kernels_launched(step_of(compile_strict(copy.deepcopy(model))))
    torch._dynamo.reset()
    inductor = _kernels_launched(step_of(torch.compile(copy.deepcopy(model))))
    assert ours <= inductor, f"torchfuse launches {ours} kernels, Inductor {inductor}"
