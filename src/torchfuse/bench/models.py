"""The models suite: small float32 models on a CPU, the issue's full-size models on a GPU.

Every model is built from code or a library config with random (seeded) weights: nothing is
downloaded. Dropout is off so that backends compute the same function.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchfuse.bench.cases import Case, Workload, inference_workload, training_workload


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


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Batch-norm running statistics away from their identity defaults (eval mode would hide bugs)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=gen))
            module.running_var.copy_(1 + 0.1 * torch.rand(module.num_features, generator=gen))
    return model


def _cpu_case(name: str, make: callable) -> Case:
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
    from torchfuse.models import make_llama_block

    layers = 2 if quick else 8
    model, x = make_llama_block(device, torch.bfloat16, "small" if quick else "bench", n_layers=layers)
    b, t, d = x.shape
    return inference_workload(model.eval(), (x,), torch.bfloat16, f"{layers} layers, {b}x{t} tokens, dim {d}, bf16")


def _llama_block_train(device: torch.device, quick: bool) -> Workload:
    from torchfuse.models import make_llama_block

    model, x = make_llama_block(device, torch.bfloat16, "small" if quick else "bench")
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x)
    b, t, d = x.shape
    return training_workload(model.train(), (x,), lambda out: F.mse_loss(out.float(), target.float()),
                             torch.bfloat16, f"{b}x{t} tokens, dim {d}, bf16, fwd+bwd")


def _gpt2_infer(device: torch.device, quick: bool) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2 if quick else 12, n_embd=768, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=torch.bfloat16).eval()
    batch, seq = (2, 64) if quick else (8, 512)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    return inference_workload(model, (ids,), torch.bfloat16, f"GPT-2 small, {batch}x{seq} tokens, bf16",
                              reference=False)


def _bert_mlm_train(device: torch.device, quick: bool) -> Workload:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=2 if quick else 12, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).to(device).train()
    batch, seq = (2, 64) if quick else (16, 512)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    labels = torch.where(torch.rand(batch, seq, generator=gen) < 0.15,
                         torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen), -100).to(device)

    class WithLabels(nn.Module):  # one tensor in, the loss out: what torch.compile sees
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids, labels=labels).loss

    return training_workload(WithLabels(), (ids,), lambda loss: loss, torch.float32,
                             f"BERT-base MLM, {batch}x{seq} tokens, autocast bf16, fwd+bwd", autocast=torch.bfloat16)


def _resnet50_infer(device: torch.device, quick: bool) -> Workload:
    import torchvision

    torch.manual_seed(0)
    model = randomize_norms(torchvision.models.resnet50()).eval()
    model = model.to(device=device, dtype=torch.bfloat16, memory_format=torch.channels_last)
    batch = 2 if quick else 64
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    x = x.to(device=device, dtype=torch.bfloat16, memory_format=torch.channels_last)
    return inference_workload(model, (x,), torch.bfloat16, f"ResNet-50, batch {batch}, channels-last bf16",
                              reference=False)


def _vit_train(device: torch.device, quick: bool) -> Workload:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(dropout=0.0, attention_dropout=0.0).to(device).train()
    batch = 2 if quick else 32
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, generator=gen).to(device)
    labels = torch.randint(0, 1000, (batch,), generator=gen).to(device)
    return training_workload(model, (x,), lambda logits: F.cross_entropy(logits.float(), labels), torch.float32,
                             f"ViT-B/16, batch {batch}, autocast bf16, fwd+bwd", autocast=torch.bfloat16)


GPU_CASES = [
    Case("llama_stack_infer", "models", ("cuda",), _llama_stack_infer),
    Case("llama_block_train", "models", ("cuda",), _llama_block_train),
    Case("gpt2_infer", "models", ("cuda",), _gpt2_infer, requires=("transformers",)),
    Case("bert_mlm_train", "models", ("cuda",), _bert_mlm_train, requires=("transformers",)),
    Case("resnet50_infer", "models", ("cuda",), _resnet50_infer, requires=("torchvision",)),
    Case("vit_b16_train", "models", ("cuda",), _vit_train, requires=("torchvision",)),
]

CASES = CPU_CASES + GPU_CASES
