"""``_foreach_*`` ops (optimizer steps) split per tensor and fuse; results as eager's."""
from __future__ import annotations

import copy

import pytest
import torch

import torchfuse
from conftest import DEVICE, compile_strict

SHAPES = [(7, 5), (13,), (3, 1, 4)]  # odd sizes, a size-1 dim


def tensors(seed: int, dtype=torch.float64, positive: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES]
    return [(t.abs() + 0.5 if positive else t).to(DEVICE) for t in out]


CASES = {
    "add_list_alpha": lambda a, b, c: torch._foreach_add(a, b, alpha=0.5),
    "add_scalar": lambda a, b, c: torch._foreach_add(a, 2.5),
    "add_scalarlist": lambda a, b, c: torch._foreach_add(a, [1.0, -2.0, 0.5]),
    "add_tensor": lambda a, b, c: torch._foreach_add(a, torch.tensor(1.5, dtype=a[0].dtype, device=a[0].device)),
    "sub_mul_div": lambda a, b, c: torch._foreach_div(torch._foreach_mul(torch._foreach_sub(a, b), 3.0), c),
    "addcmul_addcdiv": lambda a, b, c: torch._foreach_addcdiv(torch._foreach_addcmul(a, b, c, 0.3), b, c, -0.7),
    "addcmul_scalarlist": lambda a, b, c: torch._foreach_addcmul(a, b, c, [0.1, 0.2, 0.3]),
    "lerp_scalar_and_list": lambda a, b, c: torch._foreach_lerp(torch._foreach_lerp(a, b, 0.25), b, c),
    "unary_chain": lambda a, b, c: torch._foreach_sqrt(torch._foreach_exp(torch._foreach_neg(a))),
    "pow_and_reciprocal": lambda a, b, c: torch._foreach_reciprocal(torch._foreach_pow(c, 1.5)),
    "scalar_pow": lambda a, b, c: torch._foreach_pow(2.0, a),
    "clamp_max_min": lambda a, b, c: torch._foreach_clamp_max(torch._foreach_clamp_min(a, -0.5), b),
    "maximum_minimum": lambda a, b, c: torch._foreach_minimum(torch._foreach_maximum(a, b), 0.7),
    "norm": lambda a, b, c: torch._foreach_norm(a, 2),
    "max": lambda a, b, c: torch._foreach_max(a),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_foreach_op_matches_eager_and_runs_no_foreach_aten_call(name):
    fn = CASES[name]
    a, b, c = tensors(1), tensors(2), tensors(3, positive=True)
    expected = fn(a, b, c)  # float64: the reference
    inputs32 = [[t.float() for t in group] for group in (a, b, c)]
    eager32 = fn(*inputs32)
    got = compile_strict(fn)(*inputs32)
    for g, e32, ref in zip(got, eager32, expected, strict=True):
        assert g.shape == ref.shape and g.dtype == torch.float32
        assert not torch.isnan(g).any()
        bound = max(4 * (e32.double() - ref).abs().max().item(), 1e-6)
        assert (g.double() - ref).abs().max().item() <= bound
    fallbacks = [op for g in torchfuse.report().graphs for op in g.fallbacks]
    assert not any("_foreach" in op for op in fallbacks), fallbacks


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_compiled_foreach_optimizer_steps_match_eager(optimizer):
    """The optimizer step as users compile it: three steps, parameters and state as eager's."""
    params = [torch.nn.Parameter(t.float()) for t in tensors(4)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    kwargs = {"lr": 0.05, "foreach": True} | ({"momentum": 0.9} if optimizer == "SGD" else {})
    eager = getattr(torch.optim, optimizer)(params, **kwargs)
    compiled_opt = getattr(torch.optim, optimizer)(twins, **kwargs)
    step = compile_strict(compiled_opt.step)
    for i in range(3):
        for p, q in zip(params, twins):
            grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + i)).to(DEVICE)
            p.grad, q.grad = grad.clone(), grad.clone()
        eager.step()
        step()
    for p, q in zip(params, twins):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    for state_p, state_q in zip(eager.state.values(), compiled_opt.state.values()):
        for key, value in state_p.items():
            # Dynamo makes a compiled optimizer capturable when its parameters are on a GPU, so
            # AdamW's step counter lives there rather than on the CPU: compare values only.
            torch.testing.assert_close(state_q[key], value, rtol=1e-5, atol=1e-6, check_device=False)
    kernels = sum(len(g.generated_kernels) for g in torchfuse.report().graphs)
    assert 0 < kernels <= 2 * len(params) + 2  # a few fused kernels, not one per foreach op
    # Parameters and state are written in place by those kernels: no trailing ATen copies.
    assert all(k.kind != "extern" for g in torchfuse.report().graphs for k in g.kernels)
