"""The models suite: small float32 models on a CPU, full-size models of many families on a GPU.

Every model is built from code or a library config with random (seeded) weights: nothing is
downloaded. Dropout is off so that backends compute the same function. The GPU cases live by
library: our own LLaMA here, transformers models in models_hf.py, torchvision and timm models in
models_vision.py; ``GPU_CASES`` below lists them all, grouped by family.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torchfuse.bench import models_hf, models_vision
from torchfuse.bench.cases import Case, Workload, inference_workload
from torchfuse.bench.models_common import checked_training, randomize_norms
from torchfuse.models import make_llama_block


# -- CPU models ------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm GPT-style block: LN, attention (SDPA), residual, LN, GELU MLP, residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ConvNet(nn.Module):
    """Two conv-BN-ReLU stages with max pooling, global average pooling, a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(stage(3, 32), nn.MaxPool2d(2), stage(32, 64), nn.MaxPool2d(2), stage(64, 64))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _cpu_case(name: str, make: Callable) -> Case:
    def build(device: torch.device, quick: bool) -> Workload:
        batch = 2 if quick else 64
        torch.manual_seed(0)
        model, x = make(batch)
        model = randomize_norms(model.eval()).to(device)
        shape = "x".join(str(s) for s in x.shape)
        return inference_workload(model, (x.to(device),), torch.float32, f"{shape} float32")

    return Case(name, "models", ("cpu",), build)


CPU_CASES = [
    _cpu_case("mlp", lambda b: (MLP(512, 2048), torch.randn(4 * b, 512))),
    _cpu_case("transformer_block", lambda b: (TransformerBlock(256, 4), torch.randn(max(1, b // 8), 128, 256))),
    _cpu_case("convnet", lambda b: (ConvNet(), torch.randn(max(1, b // 4), 3, 64, 64))),
]


# -- GPU models ------------------------------------------------------------------------------------
def _llama_stack_infer(device: torch.device, quick: bool) -> Workload:
    layers = 2 if quick else 8
    model, x = make_llama_block(device, torch.bfloat16, "small" if quick else "bench", n_layers=layers)
    b, t, d = x.shape
    return inference_workload(model.eval(), (x,), torch.bfloat16, f"{layers} layers, {b}x{t} tokens, dim {d}, bf16")


def _llama_block_train(device: torch.device, quick: bool) -> Workload:
    model, x = make_llama_block(device, torch.bfloat16, "small" if quick else "bench")
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x)
    b, t, d = x.shape
    return checked_training(model.train(), (x,), lambda out: F.mse_loss(out.float(), target.float()),
                            torch.bfloat16, f"{b}x{t} tokens, dim {d}, bf16, fwd+bwd")


def _case(name: str, build: Callable[[torch.device, bool], Workload], requires: tuple[str, ...] = ()) -> Case:
    return Case(name, "models", ("cuda",), build, requires=requires)


HF = ("transformers",)
GPU_CASES = [
    # decoder LMs: RoPE, RMSNorm, SwiGLU; the transformers ones with grouped-query attention
    _case("llama_stack_infer", _llama_stack_infer),
    _case("llama_block_train", _llama_block_train),
    _case("llama_hf_infer", models_hf.llama_hf_infer, HF),
    _case("mistral_train", models_hf.mistral_train, HF),
    _case("gpt2_infer", models_hf.gpt2_infer, HF),
    # encoders and an encoder-decoder
    _case("bert_mlm_train", models_hf.bert_mlm_train, HF),
    _case("distilbert_infer", models_hf.distilbert_infer, HF),
    _case("t5_train", models_hf.t5_train, HF),
    # CNNs: bottlenecks, depthwise + squeeze-excitation, ConvNeXt
    _case("resnet50_infer", models_vision.resnet50_infer, ("torchvision",)),
    _case("mobilenetv3_train", models_vision.mobilenetv3_train, models_vision.TIMM),
    _case("efficientnet_b0_infer", models_vision.efficientnet_b0_infer, models_vision.TIMM),
    _case("convnext_tiny_infer", models_vision.convnext_tiny_infer, models_vision.TIMM),
    # vision transformers: global attention, shifted windows
    _case("vit_b16_train", models_vision.vit_b16_train, ("torchvision",)),
    _case("swin_t_train", models_vision.swin_t_train, models_vision.TIMM),
]

CASES = CPU_CASES + GPU_CASES
