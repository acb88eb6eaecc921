"""The foundation's fusion patterns: plain functions plus input factories.

Tests and benchmarks share these so that "bias_gelu" means the same computation everywhere. Each
pattern is one memory-bound chain that eager PyTorch runs as several kernels and a fusing compiler
should run as one (or, for cross-entropy forward + backward, very few).

Sizes: "small" is for tests (Triton's interpreter on a CPU runs it in seconds); "bench" is sized
well past an H200's ~60 MB L2 so that timings measure HBM traffic, not cache hits; "cpu" is the
benchmark size on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Inputs = tuple[torch.Tensor, ...]

# (rows, cols) of the activation per size; cross-entropy uses (tokens, vocab) instead.
# "cpu" is the benchmark size on a CPU: past a core's L2 several times, but milliseconds per call.
ROWS_COLS: dict[str, tuple[int, int]] = {"small": (64, 256), "bench": (16384, 4096), "cpu": (2048, 1024)}
TOKENS_VOCAB: dict[str, tuple[int, int]] = {"small": (32, 1000), "bench": (8192, 32000), "cpu": (1024, 8192)}
RMS_EPS = 1e-6
LN_EPS = 1e-5


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """At least float32, but keep float64 so a float64 reference stays float64 end to end."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gelu(x * 1.5 + b): three pointwise ops, one kernel when fused."""
    return F.gelu(x * 1.5 + b)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Layer norm over the last dim: two row reductions (mean, variance) plus an epilogue."""
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=LN_EPS)


def long_rows_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Layer norm over rows too long for one tile: a looped kernel reads each row three times (sum,
    centered sums, output), so what the later passes find in cache decides its speed."""
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=LN_EPS)


def short_rows_layer_norm(x: torch.Tensor, b: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """ConvNeXt's LayerNorm after its depthwise convolution: ``layer_norm(x + b)`` over rows of
    192 channels (channels-last activations, a row per pixel). Many short rows; ConvNeXt-T's ran
    at 14-28% of copy bandwidth on the H200."""
    return F.layer_norm(x + b, (x.shape[-1],), w, c, eps=1e-6)


def window_softmax(x: torch.Tensor) -> torch.Tensor:
    """Swin's window attention softmax: rows of 49 (a 7 x 7 window), in float32, back to the
    input's dtype. Rows of an odd length; Swin-T's ran at 13-33% of copy bandwidth on the H200."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax(x * 0.125): the scale is a pointwise prologue to max and sum reductions."""
    return torch.softmax(x * 0.125, dim=-1)


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm; returns (normed, x + r) as a transformer block needs both."""
    h = x + r
    hf = _upcast(h)
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(h.dtype) * w
    return normed, h


def cross_entropy_fwd_bwd(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and its gradient with respect to logits (which must require grad).

    torch.autograd.grad rather than .backward() so repeated calls do not accumulate into .grad.
    """
    loss = F.cross_entropy(_upcast(logits), target)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def mse_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss over every element (a training step's last op): a full reduction to one value,
    which needs a split into two stages to use more than one SM (issue 16)."""
    return F.mse_loss(_upcast(x), _upcast(y))


def rmsnorm_backward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm's backward, twice a LLaMA layer: the input gradient (row reductions) and the
    weight gradient, a sum over every row into few outputs (a split outer reduction; its first
    stage reached 0.6 TB/s in the LLaMA block's training step on the H200). ``x`` and ``w``
    require grad."""
    xf = _upcast(x)
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(x.dtype)
    return torch.autograd.grad(normed * w, (x, w), g)


def grouped_heads_sum(g: torch.Tensor, groups: int = 4) -> torch.Tensor:
    """The gradient of keys or values shared by ``groups`` query heads (grouped-query attention's
    backward): [B, H, S, D] summed over each group into [B, H / groups, S, D]. An outer reduction
    of a few elements per output (0.6 TB/s in the LLaMA block's step on the H200)."""
    b, h, s, d = g.shape
    return g.view(b, h // groups, groups, s, d).sum(2)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    """A bias gradient, ``grad.sum(0)``: an outer reduction over the rows, with few outputs."""
    return x.sum(0)


def squeeze_excite_pool(x: torch.Tensor) -> torch.Tensor:
    """EfficientNet's squeeze-excite pool: SiLU, then the mean over H*W of channels-last
    activations, one output per (image, channel) (outer, and enough outputs not to split)."""
    return F.silu(x).mean((2, 3), keepdim=True)


def bn_stats_channels_last(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch norm's statistics over N*H*W of channels-last activations (outer: the
    channels are contiguous)."""
    return torch.var_mean(x, (0, 2, 3), correction=0)


def bn_relu_backward_channels_last(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                                   g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A training batch norm and ReLU over channels-last activations with few channels
    (MobileNetV3's first blocks: 16), forward and the gradients of x, weight and bias: the
    backward's sums are outer reductions with 16 outputs, split into chunks (43-47% of copy
    bandwidth in MobileNetV3 on the H100). ``x``, ``w`` and ``b`` require grad."""
    y = torch.relu(F.batch_norm(x, None, None, w, b, training=True))
    return torch.autograd.grad(y, (x, w, b), g)


def transpose_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A transposed operand (a gradient of ``x.t()``, a weight update through a transpose): the
    read and the store are contiguous along different axes (2-D tiles, issue 16)."""
    return x.t() + y


def nchw_to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """The copy in front of a channels-last network: NCHW in, NHWC out (2-D tiles, issue 16)."""
    return x.contiguous(memory_format=torch.channels_last)


def _randn(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype,
           gen: torch.Generator) -> torch.Tensor:
    # Draw on the CPU in float32 so the numbers do not depend on device or dtype.
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _bias_gelu_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    return _randn((rows, cols), device, dtype, gen), _randn((cols,), device, dtype, gen)


def _layer_norm_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    x = _randn((rows, cols), device, dtype, gen)
    return x, 1.0 + 0.1 * _randn((cols,), device, dtype, gen), 0.1 * _randn((cols,), device, dtype, gen)


def _long_rows_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    # bench: [8192, 16384], 268 MB of bf16 read and written
    rows, cols = {"small": (4, 5000), "bench": (8192, 16384), "cpu": (256, 16384)}[size]
    x = _randn((rows, cols), device, dtype, gen)
    return x, 1.0 + 0.1 * _randn((cols,), device, dtype, gen), 0.1 * _randn((cols,), device, dtype, gen)


def _bn_relu_backward_inputs(device: torch.device | str, dtype: torch.dtype, size: str,
                             gen: torch.Generator) -> Inputs:
    # bench: [128, 16, 112, 112] channels-last, 51 MB of bf16 a tensor
    shape = {"small": (2, 4, 6, 6), "bench": (128, 16, 112, 112), "cpu": (16, 16, 56, 56)}[size]
    return bn_backward_inputs(shape, device, dtype, gen)


def bn_backward_inputs(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype,
                       gen: torch.Generator) -> Inputs:
    """``bn_relu_backward_channels_last``'s inputs at ``shape``: channels-last x (requiring grad),
    the weight and bias (requiring grad), and a channels-last output gradient."""
    x = _randn(shape, device, dtype, gen).contiguous(memory_format=torch.channels_last).requires_grad_()
    w = (1.0 + 0.1 * _randn((shape[1],), device, dtype, gen)).requires_grad_()
    b = (0.1 * _randn((shape[1],), device, dtype, gen)).requires_grad_()
    return x, w, b, _randn(shape, device, dtype, gen).contiguous(memory_format=torch.channels_last)


def _short_rows_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    # bench: [200704, 192], 77 MB of bf16 (four times ConvNeXt-T's stage 2 at batch 64)
    rows, channels = {"small": (64, 24), "bench": (200704, 192), "cpu": (8192, 192)}[size]
    x = _randn((rows, channels), device, dtype, gen)
    b, w, c = (_randn((channels,), device, dtype, gen) for _ in range(3))
    return x, b, 1.0 + 0.1 * w, 0.1 * c


def _window_softmax_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    # bench: [6144 windows x 3 heads x 4, 49, 49] -> 73728 x 49 x 49, 354 MB of bf16 read and written
    windows = {"small": 8, "bench": 73728, "cpu": 2048}[size]
    return (4.0 * _randn((windows, 49, 49), device, dtype, gen),)


def _softmax_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    return (4.0 * _randn((rows, cols), device, dtype, gen),)


def _add_rmsnorm_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    x, r = _randn((rows, cols), device, dtype, gen), _randn((rows, cols), device, dtype, gen)
    return x, r, 1.0 + 0.1 * _randn((cols,), device, dtype, gen)


def _cross_entropy_inputs(device: torch.device | str, dtype: torch.dtype, size: str,
                          gen: torch.Generator) -> Inputs:
    tokens, vocab = TOKENS_VOCAB[size]
    logits = _randn((tokens, vocab), device, dtype, gen).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    return logits, target


def _mse_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    return _randn((rows, cols), device, dtype, gen), _randn((rows, cols), device, dtype, gen)


def _column_sum_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    return (_randn(ROWS_COLS[size], device, dtype, gen),)


def _rmsnorm_backward_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    x = _randn((rows, cols), device, dtype, gen).requires_grad_()
    w = (1.0 + 0.1 * _randn((cols,), device, dtype, gen)).requires_grad_()
    return x, w, _randn((rows, cols), device, dtype, gen)


def _grouped_heads_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]  # bench: [16, 32, 2048, 64], 134 MB of bf16
    return (_randn((max(1, rows // 1024), 32, max(16, cols // 2), 64), device, dtype, gen),)


def _bn_stats_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    side = 32 if size == "bench" else 8  # bench: [128, 256, 32, 32], 67 MB of bf16
    x = _randn((max(2, rows // 128), cols // 16, side, side), device, dtype, gen)
    return (x.contiguous(memory_format=torch.channels_last),)


def _transpose_add_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    return _randn((cols, rows), device, dtype, gen), _randn((rows, cols), device, dtype, gen)


def _nchw_inputs(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
    rows, cols = ROWS_COLS[size]
    side = 32 if size == "bench" else 8  # bench: [128, 256, 32, 32], 67 MB of bf16
    return (_randn((max(2, rows // 128), cols // 16, side, side), device, dtype, gen),)


@dataclass(frozen=True)
class Pattern:
    """One benchmark/test case: fn(*make_inputs(device, dtype, size))."""

    name: str
    fn: Callable[..., object]
    factory: Callable[[torch.device | str, torch.dtype, str, torch.Generator], Inputs]
    needs_grad: bool = False  # True when fn differentiates its inputs

    def make_inputs(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    size: str = "small", seed: int = 0) -> Inputs:
        """Seeded inputs; the same seed gives the same values on every device."""
        if size not in ROWS_COLS:
            raise ValueError(f"unknown size {size!r}; choose from {sorted(ROWS_COLS)}")
        return self.factory(device, dtype, size, torch.Generator().manual_seed(seed))


PATTERNS: tuple[Pattern, ...] = (
    Pattern("bias_gelu", bias_gelu, _bias_gelu_inputs),
    Pattern("layer_norm", layer_norm, _layer_norm_inputs),
    Pattern("scaled_softmax", scaled_softmax, _softmax_inputs),
    Pattern("long_rows_layer_norm", long_rows_layer_norm, _long_rows_inputs),
    Pattern("short_rows_layer_norm", short_rows_layer_norm, _short_rows_inputs),
    Pattern("window_softmax", window_softmax, _window_softmax_inputs),
    Pattern("add_rmsnorm", add_rmsnorm, _add_rmsnorm_inputs),
    Pattern("cross_entropy_fwd_bwd", cross_entropy_fwd_bwd, _cross_entropy_inputs, needs_grad=True),
    Pattern("mse_loss", mse_loss, _mse_inputs),
    Pattern("column_sum", column_sum, _column_sum_inputs),
    Pattern("rmsnorm_backward", rmsnorm_backward, _rmsnorm_backward_inputs, needs_grad=True),
    Pattern("grouped_heads_sum", grouped_heads_sum, _grouped_heads_inputs),
    Pattern("bn_stats_channels_last", bn_stats_channels_last, _bn_stats_inputs),
    Pattern("bn_relu_backward_channels_last", bn_relu_backward_channels_last, _bn_relu_backward_inputs,
            needs_grad=True),
    Pattern("transpose_add", transpose_add, _transpose_add_inputs),
    Pattern("nchw_to_channels_last", nchw_to_channels_last, _nchw_inputs),
)
BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}


def bn_silu_inference(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, w: torch.Tensor,
                      b: torch.Tensor) -> torch.Tensor:
    """EfficientNet's inference batch norm and SiLU over channels-last activations, with float32
    statistics and parameters (each channel's 1 / sqrt(var + eps) is a table: policy.NORMALIZER_OPS)."""
    return F.silu(F.batch_norm(x, mean, var, w, b, training=False))


def bn_silu_pool_inference(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, w: torch.Tensor,
                           b: torch.Tensor) -> torch.Tensor:
    """EfficientNet's squeeze-excite pool as the model computes it: the inference batch norm and
    SiLU fused into the mean over H*W (about 10 ops an element: the special-step tile's case)."""
    return bn_silu_inference(x, mean, var, w, b).mean((2, 3), keepdim=True)


def _bn_inference_at(shape: tuple[int, ...]) -> Callable[..., Inputs]:
    """Channels-last x at ``shape`` and float32 running statistics and affine parameters."""
    def factory(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
        x = _randn(shape, device, dtype, gen).contiguous(memory_format=torch.channels_last)
        mean, var, w, b = (_randn((shape[1],), device, torch.float32, gen) for _ in range(4))
        return x, mean, var.abs() + 0.5, w, b
    return factory


def _channels_last_at(shape: tuple[int, ...], grad: bool) -> Callable[..., Inputs]:
    """Inputs at ``shape`` whatever the size asked: x alone (statistics), or the backward's."""
    def factory(device: torch.device | str, dtype: torch.dtype, size: str, gen: torch.Generator) -> Inputs:
        if grad:
            return bn_backward_inputs(shape, device, dtype, gen)
        return (_randn(shape, device, dtype, gen).contiguous(memory_format=torch.channels_last),)
    return factory


# Kernels of real models at the models suite's sizes, for the policy tools (scripts/ab_policy.py,
# scripts/sweep_configs.py), not the micro suite: MobileNetV3-large's batch norms and
# EfficientNet-B0's squeeze-excite pools and inference batch norms at batch 128.
MODEL_SIZED: dict[str, Pattern] = {p.name: p for p in (
    Pattern("bn_stats_128x64x112", bn_stats_channels_last, _channels_last_at((128, 64, 112, 112), False)),
    Pattern("bn_stats_128x24x56", bn_stats_channels_last, _channels_last_at((128, 24, 56, 56), False)),
    Pattern("bn_relu_backward_128x64x112", bn_relu_backward_channels_last,
            _channels_last_at((128, 64, 112, 112), True), needs_grad=True),
    Pattern("se_pool_128x144x56", squeeze_excite_pool, _channels_last_at((128, 144, 56, 56), False)),
    Pattern("se_pool_128x32x112", squeeze_excite_pool, _channels_last_at((128, 32, 112, 112), False)),
    Pattern("bn_silu_infer_128x96x112", bn_silu_inference, _bn_inference_at((128, 96, 112, 112))),
    Pattern("bn_silu_pool_128x144x56", bn_silu_pool_inference, _bn_inference_at((128, 144, 56, 56))),
    Pattern("bn_silu_pool_128x480x14", bn_silu_pool_inference, _bn_inference_at((128, 480, 14, 14))),
    Pattern("bn_silu_pool_128x1152x7", bn_silu_pool_inference, _bn_inference_at((128, 1152, 7, 7))),
)}


def to_reference(inputs: Inputs) -> Inputs:
    """Copies of inputs with floating tensors in float64 (keeping requires_grad) for a reference run."""
    out = []
    for t in inputs:
        if t.is_floating_point():
            t = t.detach().double().requires_grad_(t.requires_grad)
        out.append(t)
    return tuple(out)
