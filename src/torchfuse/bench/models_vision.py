"""GPU model cases from torchvision and timm: CNNs and vision transformers.

Random (seeded) weights only: timm models are made with ``pretrained=False`` and torchvision's
without ``weights``, so nothing is downloaded. Dropout and stochastic depth are off, so that
eager and the compilers compute the same function. Inference cases run in eval mode with batch-norm
statistics moved off their defaults; training steps run batch norm in train mode (batch
statistics: deterministic, and every backend starts from the same weights since a step only sets
gradients).

timm imports torchvision, so timm cases require both. ``quick`` builds the same family with a
tiny config or tiny images at batch 2 (tests run it on a CPU); the full size is meant to take
5-50 ms a step on an H200.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchfuse.bench.cases import Workload, inference_workload
from torchfuse.bench.models_common import checked_training, randomize_norms

TIMM = ("timm", "torchvision")  # what a timm case requires


def _images(batch: int, size: int, device: torch.device, dtype: torch.dtype = torch.float32,
            channels_last: bool = True) -> torch.Tensor:
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    layout = torch.channels_last if channels_last else torch.preserve_format
    return x.to(device=device, dtype=dtype, memory_format=layout)


def _classes(batch: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(1)).to(device)


def _timm(name: str, **kwargs) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, drop_rate=0.0, drop_path_rate=0.0, **kwargs)


def _inference(model: nn.Module, batch: int, size: int, device: torch.device, note: str,
               reference: bool = True, amp: bool = False) -> Workload:
    """Eval-mode, channels-last forward of an image classifier, the logits: bf16 weights and
    inputs, or (``amp``) float32 ones under bf16 autocast."""
    dtype = torch.float32 if amp else torch.bfloat16
    model = randomize_norms(model.eval()).to(device=device, dtype=dtype, memory_format=torch.channels_last)
    precision = "autocast bf16" if amp else "bf16"
    return inference_workload(model, (_images(batch, size, device, dtype),), dtype,
                              f"{note}, batch {batch} at {size}px, channels-last {precision}", reference=reference,
                              autocast=torch.bfloat16 if amp else None)


def _amp_training(model: nn.Module, batch: int, size: int, device: torch.device, note: str,
                  channels_last: bool = True) -> Workload:
    """Train-mode step under bf16 autocast: cross-entropy on random classes, fwd+bwd."""
    model = model.train().to(device, memory_format=torch.channels_last if channels_last else torch.preserve_format)
    x, labels = _images(batch, size, device, channels_last=channels_last), _classes(batch, device)
    layout = "channels-last, " if channels_last else ""
    return checked_training(model, (x,), lambda logits: F.cross_entropy(logits.float(), labels), torch.float32,
                            f"{note}, batch {batch} at {size}px, {layout}autocast bf16, fwd+bwd",
                            autocast=torch.bfloat16)


# -- torchvision -----------------------------------------------------------------------------------
def resnet50_infer(device: torch.device, quick: bool) -> Workload:
    import torchvision

    torch.manual_seed(0)
    return _inference(torchvision.models.resnet50(), 2 if quick else 64, 224, device, "ResNet-50", reference=False)


def vit_b16_train(device: torch.device, quick: bool) -> Workload:
    from torchvision.models import VisionTransformer, vit_b_16

    torch.manual_seed(0)
    if quick:  # the same class, 2 layers of width 64 on 64-pixel images
        model = VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64,
                                  mlp_dim=128, dropout=0.0, attention_dropout=0.0)
    else:
        model = vit_b_16(dropout=0.0, attention_dropout=0.0)
    return _amp_training(model, 2 if quick else 32, 64 if quick else 224, device,
                         "ViT" + (" (2 layers, dim 64)" if quick else "-B/16"), channels_last=False)


# -- timm: depthwise convolutions, squeeze-excitation, LayerNorm on channels-last, windows --------
def mobilenetv3_train(device: torch.device, quick: bool) -> Workload:
    """Depthwise convolutions, squeeze-excitation with hard-sigmoid gates, hard-swish, batch norm
    in train mode."""
    name = "mobilenetv3_small_050" if quick else "mobilenetv3_large_100"
    return _amp_training(_timm(name), 2 if quick else 128, 64 if quick else 224, device, f"MobileNetV3 ({name})")


def efficientnet_b0_infer(device: torch.device, quick: bool) -> Workload:
    """Depthwise convolutions, squeeze-excitation with sigmoid gates, SiLU, eval batch norm; the
    suite's inference under autocast (float32 weights, bf16 convolutions). Quick: TinyNet-E, the
    same EfficientNet blocks scaled down."""
    name = "tinynet_e" if quick else "efficientnet_b0"
    return _inference(_timm(name), 2 if quick else 128, 64 if quick else 224, device, f"EfficientNet ({name})",
                      amp=True)


def convnext_tiny_infer(device: torch.device, quick: bool) -> Workload:
    """7x7 depthwise convolutions, then LayerNorm and the MLP on channels-last (NHWC) activations,
    layer scale, GELU."""
    tiny = dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128)) if quick else {}
    return _inference(_timm("convnext_tiny", **tiny), 2 if quick else 64, 64 if quick else 224, device,
                      "ConvNeXt-T" + (" (1 block a stage)" if quick else ""))


def swin_t_train(device: torch.device, quick: bool) -> Workload:
    """Shifted windows (torch.roll and a window mask), relative position bias gathered from a
    learned table (its backward scatters into the table), patch merging."""
    tiny = dict(img_size=64, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4)) if quick else {}
    model = _timm("swin_tiny_patch4_window7_224", **tiny)
    return _amp_training(model, 2 if quick else 32, 64 if quick else 224, device,
                         "Swin-T" + (" (2 stages, window 4)" if quick else ""), channels_last=False)
