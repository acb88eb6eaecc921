"""Example workloads for torchfuse, written in plain torch.nn (nothing is downloaded)."""

from torchfuse.models.llama import (
    SIZES,
    Attention,
    FeedForward,
    LlamaBlock,
    LlamaConfig,
    LlamaSize,
    LlamaStack,
    RMSNorm,
    make_llama_block,
)

__all__ = [
    "SIZES",
    "Attention",
    "FeedForward",
    "LlamaBlock",
    "LlamaConfig",
    "LlamaSize",
    "LlamaStack",
    "RMSNorm",
    "make_llama_block",
]
