"""CUDA attention keeps the fused kernel eager would choose (frontend/attention.py).

aot_autograd's fake-tensor trace chose SDPA's float32 math path for BERT's autocast training
step where eager chose cuDNN. ``fused_attention`` asks ``torch._fused_sdp_choice`` on real
tensors and calls the chosen kernel's op. Without a GPU the choice is injected and the ops are
traced on meta tensors (their shapes come from torch's meta functions)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import assert_close, to_float64
from torchfuse.frontend import attention

aten = torch.ops.aten
FUSED_OPS = {
    attention.CUDNN: (aten._scaled_dot_product_cudnn_attention.default,
                      aten._scaled_dot_product_cudnn_attention_backward.default),
    attention.FLASH: (aten._scaled_dot_product_flash_attention.default,
                      aten._scaled_dot_product_flash_attention_backward.default),
    attention.EFFICIENT: (aten._scaled_dot_product_efficient_attention.default,
                          aten._scaled_dot_product_efficient_attention_backward.default),
}


def _heads(batch=2, seq=64, heads=4, dim=32, device="meta", dtype=torch.bfloat16):
    """q, k, v as a model makes them: [B, S, H, D] projections viewed as [B, H, S, D]."""
    return [torch.empty(batch, seq, heads, dim, dtype=dtype, device=device).transpose(1, 2) for _ in range(3)]


@pytest.fixture
def chosen(monkeypatch):
    """Pretend torch chose ``backend`` for every call on a CUDA device (meta tensors stand in)."""
    def choose(backend: int) -> None:
        monkeypatch.setattr(attention, "_why_composite", lambda *args: None)
        monkeypatch.setattr(attention, "backend_choice", lambda *args: backend)
    attention.choices.clear()
    return choose


@pytest.mark.parametrize("backend", sorted(FUSED_OPS))
def test_training_trace_calls_the_chosen_kernel_and_its_backward(chosen, backend):
    chosen(backend)
    q, k, v = (t.requires_grad_() for t in _heads())

    def step(q, k, v):
        out = attention.fused_attention(q, k, v, scale=0.125)
        return torch.autograd.grad(out.sum(), (q, k, v))

    targets = [n.target for n in make_fx(step)(q, k, v).graph.nodes]
    forward, backward = FUSED_OPS[backend]
    assert targets.count(forward) == 1 and targets.count(backward) == 1
    assert aten.bmm.default not in targets and aten._safe_softmax.default not in targets
    assert attention.choices == {attention._NAMES[backend]: 1}


@pytest.mark.parametrize("backend", [attention.CUDNN, attention.EFFICIENT])
@pytest.mark.parametrize("grad", [True, False])
def test_softmax_statistics_are_kept_only_for_a_backward(chosen, backend, grad):
    chosen(backend)
    q, k, v = _heads()
    with torch.set_grad_enabled(grad):
        gm = make_fx(lambda q, k, v: attention.fused_attention(q, k, v))(*(t.requires_grad_() for t in (q, k, v)))
    call = next(n for n in gm.graph.nodes if n.target == FUSED_OPS[backend][0])
    assert call.args[4] is grad  # compute_log_sumexp


def test_math_choice_keeps_the_composite_op(chosen):
    chosen(0)
    gm = make_fx(lambda q, k, v: attention.fused_attention(q, k, v))(*_heads())
    assert not any(n.target in FUSED_OPS[b] for b in FUSED_OPS for n in gm.graph.nodes)
    assert attention.choices == {"math: torch chose backend 0": 1}


def test_flash_with_an_odd_head_dim_is_left_to_the_composite_op(chosen):
    """The composite op pads such heads to a multiple of 8 for flash; the direct call would not."""
    chosen(attention.FLASH)
    gm = make_fx(lambda q, k, v: attention.fused_attention(q, k, v))(*_heads(dim=36))
    assert aten._scaled_dot_product_flash_attention.default not in [n.target for n in gm.graph.nodes]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16])
def test_cudnn_gets_the_mask_as_the_composite_op_hands_it(chosen, mask_dtype):
    chosen(attention.CUDNN)
    q, k, v = _heads()
    mask = torch.empty(2, 1, 64, 64, dtype=mask_dtype, device="meta")
    gm = make_fx(lambda q, k, v, m: attention.fused_attention(q, k, v, m))(q, k, v, mask)
    call = next(n for n in gm.graph.nodes if n.target == aten._scaled_dot_product_cudnn_attention.default)
    bias = call.args[3]
    assert bias.meta["val"].dtype == torch.bfloat16
    assert bias.meta["val"].is_contiguous()
    assert attention.choices == {"cudnn with a mask": 1}


@pytest.mark.parametrize("keys", [64, 60])
def test_efficient_attention_gets_an_aligned_expanded_bias(chosen, keys):
    chosen(attention.EFFICIENT)
    q = _heads()[0]
    k, v = _heads(seq=keys)[1:]
    mask = torch.empty(keys, dtype=torch.bool, device="meta")  # broadcast over batch, heads and queries
    gm = make_fx(lambda q, k, v, m: attention.fused_attention(q, k, v, m))(q, k, v, mask)
    call = next(n for n in gm.graph.nodes if n.target == aten._scaled_dot_product_efficient_attention.default)
    bias = call.args[3].meta["val"]
    assert tuple(bias.shape) == (2, 4, 64, keys) and bias.dtype == torch.bfloat16
    assert bias.stride(-1) == 1 and all(s % 8 == 0 for s in bias.stride()[:-1])


def test_the_choice_sees_the_dense_additive_mask_the_kernel_gets(monkeypatch):
    """A mask broadcast by zero strides is chosen for, and passed, as a dense additive copy."""
    seen = []
    monkeypatch.setattr(attention, "_chosen", {})
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda q, k, v, mask, *args, **kwargs:
                        seen.append((mask.dtype, mask.shape, mask.stride())) or 0)
    q, k, v = _heads(device="cpu")
    expanded = torch.ones(2, 1, 1, 64, dtype=torch.bool).expand(2, 1, 64, 64)
    for _ in range(3):  # asked once: the answer is kept by the question's metadata
        attention.backend_choice(q, k, v, expanded, 0.0, False, 0.125)
    assert seen == [(torch.bfloat16, (2, 1, 64, 64), (4096, 4096, 64, 1))]


@pytest.mark.parametrize("backend", [attention.CUDNN, attention.EFFICIENT])
def test_a_learned_mask_gets_its_gradient(chosen, backend):
    """Swin's relative position bias is a mask that requires grad: memory-efficient attention
    returns the mask's gradient; cuDNN's backward does not, so the composite op keeps it."""
    chosen(backend)
    q, k, v = (t.requires_grad_() for t in _heads())
    bias = torch.empty(2, 4, 64, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)

    def step(q, k, v, bias):
        out = attention.fused_attention(q, k, v, bias)
        return torch.autograd.grad(out.sum(), (q, k, v, bias))

    gm = make_fx(step)(q, k, v, bias)
    targets = [n.target for n in gm.graph.nodes]
    if backend == attention.EFFICIENT:
        assert targets.count(aten._scaled_dot_product_efficient_attention_backward.default) == 1
        backward = next(n for n in gm.graph.nodes
                        if n.target == aten._scaled_dot_product_efficient_attention_backward.default)
        assert list(backward.args[10])[3] is True  # grad_input_mask: the bias's gradient is computed
    else:
        assert aten._scaled_dot_product_cudnn_attention.default not in targets
        assert "composite: a learned mask" in next(iter(attention.choices))


def test_mask_conversions_keep_the_composite_ops_values():
    """Boolean masks become 0 where attended and -inf (-65504 for cuDNN) elsewhere; padding a
    bias for alignment keeps its values."""
    mask = torch.rand(3, 5, 60) > 0.3
    additive = attention._additive(mask, torch.bfloat16, float("-inf"))
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive == 0, mask) and torch.isinf(additive[~mask]).all()
    assert attention._additive(mask, torch.float16, -65504.0)[~mask].eq(-65504.0).all()
    q, k = torch.empty(3, 2, 5, 8), torch.empty(3, 2, 60, 8)
    aligned = attention._aligned_bias(additive.unsqueeze(1), q, k)
    assert torch.equal(aligned, additive.unsqueeze(1).expand(3, 2, 5, 60))
    assert all(s % 8 == 0 for s in aligned.stride()[:-1] if s)


def _fake_cuda(**kwargs):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return _heads(device="cuda", **kwargs)


@pytest.mark.parametrize("case, reason", [
    ("cpu", "composite: not CUDA"),
    ("float32 mask", "composite: a mask of another dtype or rank"),
    ("gqa", "composite: grouped-query heads"),
    ("float32", "composite: not one 16-bit dtype"),
    ("mixed", "composite: not one 16-bit dtype"),
])
def test_calls_a_fused_op_cannot_take_stay_composite(case, reason):
    q, k, v = _heads(device="cpu") if case == "cpu" else _fake_cuda(dtype=torch.float32 if case == "float32" else torch.bfloat16)
    if case == "mixed":
        v = _fake_cuda(dtype=torch.float16)[2]
    mask = q.new_empty(q.shape[-2], k.shape[-2], dtype=torch.float32) if case == "float32 mask" else None
    assert attention._why_composite(q, k, v, mask, case == "gqa") == reason


def test_autocast_to_another_dtype_stays_composite():
    q, k, v = _fake_cuda(dtype=torch.float16)
    dtype = torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)  # torch.autocast refuses CUDA on a CPU-only build
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    try:
        assert attention._why_composite(q, k, v, None, False) == "composite: autocast would cast"
    finally:
        torch.set_autocast_enabled("cuda", False)
        torch.set_autocast_dtype("cuda", dtype)
    assert attention._why_composite(q, k, v, None, False) is None


class SelfAttention(torch.nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim), heads

    def forward(self, x, mask=None):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)  # an additive mask in the attention's dtype, as transformers makes it
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
        return self.out(attended.transpose(1, 2).reshape(b, s, d))


def test_dynamo_graph_calls_are_rewritten_and_compute_the_same_on_cpu():
    captured = []

    def backend(gm, example_inputs):
        captured.append(attention.keep_fused_attention(gm))
        return gm

    model, x = SelfAttention(), torch.randn(2, 16, 64)
    got = torch.compile(model, backend=backend)(x)
    assert captured == [1]
    assert torch.equal(got, model(x))  # on the CPU fused_attention calls the composite op


def test_cpu_graphs_are_not_rewritten():
    attention.choices.clear()
    model, x = SelfAttention(), torch.randn(2, 16, 64, requires_grad=True)
    torchfuse.compile(model, options={"strict": True})(x).sum().backward()
    assert not attention.choices


@pytest.mark.gpu
@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_autocast_training_on_cuda_runs_a_fused_kernel_with_eager_gradients(mask_kind):
    """BERT's case: fp32 weights, bf16 autocast, training, with or without a padding mask. The
    trace takes the fused kernel, and the gradients are as close to float64 as eager's."""
    attention.choices.clear()
    torch.manual_seed(0)
    model = SelfAttention(dim=768, heads=12).cuda()
    x = torch.randn(4, 512, 768, device="cuda", requires_grad=True)
    keep = torch.arange(512, device="cuda") < torch.tensor([512, 400, 300, 17], device="cuda")[:, None]
    mask = {None: None, "bool": keep[:, None, None, :],
            "additive": torch.where(keep, 0.0, torch.finfo(torch.bfloat16).min)[:, None, None, :]}[mask_kind]

    def step(fn, model, x, mask):
        for p in (*model.parameters(), x):
            p.grad = None
        with torch.autocast("cuda", torch.bfloat16, enabled=x.dtype == torch.float32):
            out = fn(x, mask)
        out.float().square().mean().backward()
        return [out.detach(), x.grad, *(p.grad for p in model.parameters())]

    eager = step(model, model, x, mask)
    compiled = step(torchfuse.compile(model, options={"strict": True}), model, x, mask)
    assert attention.choices and all(not name.startswith(("math", "composite")) for name in attention.choices), \
        (attention.choices, attention.details)
    model64 = SelfAttention(dim=768, heads=12).cuda().double()
    model64.load_state_dict(model.state_dict())
    x64 = x.detach().double().requires_grad_()
    reference = step(model64, model64, x64, mask if mask is None or mask.dtype == torch.bool else mask.double())
    assert_close(compiled, eager, torch.bfloat16, reference=to_float64(reference))


@pytest.mark.gpu
def test_attention_dropout_on_cuda_is_seeded_and_trains():
    """Dropout inside the fused kernel: the same seed gives the same step, the dropped
    attention differs from the undropped one, and the gradients stay finite."""
    attention.choices.clear()
    torch.manual_seed(0)
    x = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def attend(x, p):
        q, k, v = (x.view(2, 256, 8, 64).transpose(1, 2) * s for s in (1.0, 0.5, 2.0))
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p).sum()

    compiled = torchfuse.compile(attend, options={"strict": True})

    def step(p, seed):
        x.grad = None
        torch.manual_seed(seed)
        loss = compiled(x, p)
        loss.backward()
        return loss.detach(), x.grad.clone()

    first, again, undropped = step(0.1, 1), step(0.1, 1), step(0.0, 1)
    # the third call recompiles with a symbolic dropout_p, which stays composite
    assert {"cudnn", "efficient", "flash"} & set(attention.choices), attention.choices
    assert not any(name.startswith("math") for name in attention.choices), attention.choices
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], undropped[1])
    assert torch.isfinite(first[1]).all()
