"""A LLaMA-style transformer block in plain torch.nn, written from scratch.

It is the end-to-end workload for torchfuse: RMSNorm, rotary embeddings, attention with a fused QKV
projection, and a SwiGLU feed-forward give a realistic mix of matmuls (externs), pointwise chains and
row reductions. No weights are downloaded: parameters come from nn.Linear's default init under a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of one block. n_kv_heads < n_heads gives grouped-query attention (GQA)."""

    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 4
    hidden_dim: int = 128
    eps: float = 1e-5
    max_seq_len: int = 128
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head_dim must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 like the reference LLaMA code.

    The upcast matters: in bfloat16 the mean of squares loses too many bits. It also gives the
    compiler a cast -> reduction -> pointwise -> cast chain to fuse into one kernel.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim) for the rotate-half convention."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    # Both halves of the head use the same frequencies: [f0..f(d/2-1), f0..f(d/2-1)].
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dim: a real-valued 90-degree rotation of each pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (B, H, T, D) by position; cos/sin are (T, D) and broadcast over B and H."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Causal multi-head attention with one fused QKV matmul and optional GQA."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv_out = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, qkv_out, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        # Not persistent: the tables are derived from the config, so keep them out of state_dict.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos = self.rope_cos[:seq].to(x.dtype)
        sin = self.rope_sin[:seq].to(x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, q_size))

    def _repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        """Share each KV head among n_heads // n_kv_heads query heads.

        expand + reshape rather than SDPA's enable_gqa flag: it is plain view/copy ATen that every
        backend lowers, and it works the same on all supported torch versions.
        """
        rep = self.n_heads // self.n_kv_heads
        if rep == 1:
            return t
        bsz, n_kv, seq, hd = t.shape
        return t[:, :, None].expand(bsz, n_kv, rep, seq, hd).reshape(bsz, n_kv * rep, seq, hd)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), with w1 and w3 fused into one matmul (w13)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.ffn(self.ffn_norm(h))


class LlamaStack(nn.Module):
    """n_layers blocks followed by a final RMSNorm (no embedding or LM head)."""

    def __init__(self, cfg: LlamaConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


@dataclass(frozen=True)
class LlamaSize:
    """A named preset: the block's config and the shape of its input."""

    cfg: LlamaConfig
    batch: int
    seq_len: int


def _ffn_hidden(dim: int, multiple_of: int = 256) -> int:
    """LLaMA's hidden size: 2/3 of 4*dim, rounded up to a multiple (1024 -> 2816)."""
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


SIZES: dict[str, LlamaSize] = {
    # Small enough that a CPU run (and Triton's interpreter in tests) takes seconds; GQA on.
    "small": LlamaSize(LlamaConfig(dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128, max_seq_len=64),
                       batch=2, seq_len=16),
    # A 1B-class layer: activations of 8 x 512 x 1024, well past what fits in L2 in bf16.
    "bench": LlamaSize(LlamaConfig(dim=1024, n_heads=16, n_kv_heads=4, hidden_dim=_ffn_hidden(1024),
                                   max_seq_len=512),
                       batch=8, seq_len=512),
}


def make_llama_block(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     size: str | LlamaSize = "small", seed: int = 0,
                     n_layers: int | None = None) -> tuple[nn.Module, torch.Tensor]:
    """Build a seeded block (or a LlamaStack when n_layers is given) and an example input.

    size is a preset name from SIZES or a LlamaSize of your own (e.g. to turn GQA off).

    Parameters and input are drawn on the CPU in float32 and then moved, so the same seed gives the
    same numbers on every device and dtype. The global RNG state is left untouched.

    Returns:
        (module, x) with x of shape (batch, seq_len, dim); x does not require grad.
    """
    if isinstance(size, str) and size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    preset = SIZES[size] if isinstance(size, str) else size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module: nn.Module = LlamaBlock(preset.cfg) if n_layers is None else LlamaStack(preset.cfg, n_layers)
        x = torch.randn(preset.batch, preset.seq_len, preset.cfg.dim)
    return module.to(device=device, dtype=dtype), x.to(device=device, dtype=dtype)

