"""Keep CUDA attention fused through aot_autograd's trace.

``F.scaled_dot_product_attention`` is a composite op: at each call it asks
``torch._fused_sdp_choice`` which kernel fits the call (cuDNN, flash, memory-efficient, or the
math path of bmm and softmax) and calls that one. aot_autograd makes this choice on the fake
tensors it traces with, and there it can differ from eager's: on the H200, BERT's bf16-autocast
training step was traced into the math path, which computes in float32 (two float32 bmm and a
float32 softmax a layer, 4.6 ms of a 27 ms step), where eager runs cuDNN's fused kernels for the
same call (GPT-2 inference and LLaMA or ViT training kept theirs).

So, on CUDA, Dynamo's attention calls become calls of ``fused_attention``. While aot_autograd
traces, it asks the same question on real tensors that have the traced metadata (shapes,
strides, dtypes, whether a gradient is needed) and, when the answer is a fused kernel, calls
that kernel's op directly, as the composite op would; otherwise it calls the composite op as
before. The fused ops have their own backward (derivatives.yaml), which aot_autograd traces,
and run as ATen calls (lowering/extern.py).

A mask is handed to the fused op as the composite op would hand it (boolean to additive,
aligned rows for memory-efficient attention). Calls with grouped-query heads keep the composite
op. Under compile, transformers' BERT passes a mask even when eager's call has none (it cannot
tell at trace time that every token attends), so masked calls matter as much as unmasked ones.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten

# torch's SDPBackend numbering (the value ``torch._fused_sdp_choice`` returns)
FLASH, EFFICIENT, CUDNN = 1, 2, 3
ATTENTION_CALLS = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
# What the traces chose, by name ("cudnn", "math: ..."): for tests and diagnosis.
choices: Counter = Counter()
# For each math choice on a CUDA call: the metadata torch decided on.
details: Counter = Counter()
# torch's answer by the question's metadata (the choice depends on nothing else).
_chosen: dict[tuple, int] = {}


def keep_fused_attention(gm: torch.fx.GraphModule) -> int:
    """Point ``gm``'s attention calls at ``fused_attention``; returns how many."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in ATTENTION_CALLS]
    for node in calls:
        node.target = fused_attention
    if calls:
        gm.recompile()
    return len(calls)


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, calling the fused kernel eager would choose directly."""
    reason = _why_composite(query, key, value, attn_mask, enable_gqa, dropout_p, scale)
    backend = None if reason else backend_choice(query, key, value, attn_mask, dropout_p, is_causal, scale)
    call = _FUSED_CALLS.get(backend)
    if call is not None and backend != EFFICIENT and attn_mask is not None and attn_mask.requires_grad:
        reason = "composite: a learned mask (only memory-efficient attention returns its gradient)"
        call = None
    if call is None or (backend == FLASH and (query.shape[-1] % 8 or attn_mask is not None)):
        # the composite op pads odd head dims for flash itself; flash takes no mask on CUDA
        choices[reason or f"math: torch chose backend {backend}"] += 1
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    choices[_NAMES[backend] + (" with a mask" if attn_mask is not None else "")] += 1
    return call(query, key, value, attn_mask, dropout_p, is_causal, scale, _needs_logsumexp(query, key, value))


def _why_composite(query, key, value, attn_mask, enable_gqa, dropout_p=0.0, scale=None) -> str | None:
    if query.device.type != "cuda":
        return "composite: not CUDA"
    if not all(isinstance(x, (int, float, type(None))) for x in (dropout_p, scale)):
        # Dynamo makes a float argument symbolic after it changes; the fused ops take numbers
        return "composite: symbolic dropout or scale"
    if enable_gqa:
        return "composite: grouped-query heads"
    tensors = (query, key, value, *([] if attn_mask is None else [attn_mask]))
    if any(not isinstance(size, int) for t in tensors for size in (*t.shape, *t.stride())):
        return "composite: symbolic shapes"
    if len({t.dtype for t in tensors[:3]}) != 1 or query.dtype not in (torch.float16, torch.bfloat16):
        return "composite: not one 16-bit dtype"  # autocast casts for the composite op only
    if torch.is_autocast_enabled("cuda") and query.dtype != torch.get_autocast_dtype("cuda"):
        return "composite: autocast would cast"
    if attn_mask is not None and (attn_mask.dtype not in (torch.bool, query.dtype) or attn_mask.dim() > 4):
        return "composite: a mask of another dtype or rank"
    return None


def _needs_logsumexp(*tensors: torch.Tensor) -> bool:
    """The forward keeps its softmax statistics when a backward will need them."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def backend_choice(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale: float | None) -> int:
    """``torch._fused_sdp_choice`` on real, uninitialised tensors with the traced ones' metadata
    (the choice reads only metadata; the tensors live for the call)."""
    grad = _needs_logsumexp(query, key, value)
    specs = [(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.requires_grad) for t in (query, key, value)]
    if attn_mask is not None:  # what the fused op gets: an additive mask, dense (_additive)
        shape = tuple(attn_mask.shape)
        specs.append((shape, make_contiguous_strides_for(shape), query.dtype, attn_mask.device, attn_mask.requires_grad))
    key = (*specs, grad, dropout_p, is_causal, scale)
    if key in _chosen:  # a model's layers ask the same question: allocate once
        return _chosen[key]
    with _disable_current_modes(), torch.set_grad_enabled(grad):
        real = [torch.empty_strided(shape, stride, dtype=dtype, device=device).requires_grad_(needs)
                for shape, stride, dtype, device, needs in specs]
        mask = real[3] if attn_mask is not None else None
        choice = int(torch._fused_sdp_choice(*real[:3], mask, dropout_p, is_causal, scale=scale))
    if choice not in _FUSED_CALLS:
        shape, stride, dtype, device, needs = specs[0]
        details[f"{choice} for q {shape} strides {stride} {dtype} {device} requires_grad={needs} "
                f"grad mode {grad}, mask {specs[3][:3] if mask is not None else None}, dropout {dropout_p}, "
                f"causal {is_causal}, scale {scale}, real tensors {type(real[0]).__name__}"] += 1
    _chosen[key] = choice
    return choice


# Each fused call takes its mask as the composite op hands it over (aten/.../attention.cpp):
# boolean masks become additive ones, -65504 for cuDNN (its -inf issue) and -inf otherwise, and
# memory-efficient attention gets rows aligned to 8 elements, expanded to [B, H, L, S]. The choice
# is made, and the fused op called, with the mask dense: a mask broadcast by strides of 0
# (transformers expands [B, 1, 1, S] to [B, 1, S, S]) can make torch choose math for the strides
# alone, and a dense copy holds the same values.
def _additive(mask: torch.Tensor | None, dtype: torch.dtype, masked_out: float) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask.logical_not(), masked_out, torch.zeros((), dtype=dtype, device=mask.device))
    return mask.contiguous()


def _aligned_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    aligned = mask.stride(-1) == 1 and all(stride % 8 == 0 for stride in mask.stride()[:-1])
    if not aligned:
        length = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - length % 8))[..., :length]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _cudnn(q, k, v, mask, dropout_p, is_causal, scale, logsumexp):
    mask = _additive(mask, q.dtype, -65504.0)
    return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, logsumexp, dropout_p, is_causal, False,
                                                    scale=scale)[0]


def _flash(q, k, v, mask, dropout_p, is_causal, scale, logsumexp):
    return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]


def _efficient(q, k, v, mask, dropout_p, is_causal, scale, logsumexp):
    mask = _additive(mask, q.dtype, float("-inf"))
    if mask is not None:
        mask = _aligned_bias(mask, q, k)
    return aten._scaled_dot_product_efficient_attention(q, k, v, mask, logsumexp, dropout_p, is_causal,
                                                        scale=scale)[0]


_FUSED_CALLS: dict[int | None, Callable] = {CUDNN: _cudnn, FLASH: _flash, EFFICIENT: _efficient}
_NAMES = {CUDNN: "cudnn", FLASH: "flash", EFFICIENT: "efficient"}
