"""BERT's LM-head backward matmuls three ways on a GPU, to choose how to pad their operands.

The gradient of the logits is [tokens, vocab] with vocab = 30522: its rows are 61044 bytes, not
a multiple of 16, and cuBLAS ran both products with it (the input gradient ``g @ W`` and the
weight gradient ``g.t() @ x``) with a slow sm80 kernel on the H200: 1.59 and 1.58 ms a step.
Layouts timed for each product, bf16, medians of CUDA-event timings:

- ``eager``: ``g`` as eager has it, rows 30522 elements apart;
- ``aligned rows``: ``g`` with rows 30528 elements apart (a producer kernel could write that
  layout), the reduced or kept dimension still 30522 long;
- ``zero-padded``: ``g`` and the other operand padded to 30528 with zeros along the shared
  dimension (input gradient) or the rows (weight gradient, then the first 30522 rows kept).

Prints ms and the largest difference from eager's result for each.
Usage: python scripts/measure_unaligned_operands.py [--tokens 8192] [--vocab 30522]
"""
from __future__ import annotations

import argparse

import torch

from measure_padded_matmul import median_ms  # the same CUDA-event median, beside this script


def with_row_stride(t: torch.Tensor, stride: int) -> torch.Tensor:
    """``t`` (2-D, row-major) copied into rows ``stride`` elements apart."""
    wide = torch.zeros(t.shape[0], stride, dtype=t.dtype, device=t.device)
    wide[:, :t.shape[1]] = t
    return wide[:, :t.shape[1]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--hidden", type=int, default=768)
    args = parser.parse_args()
    padded = -(-args.vocab // 8) * 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = torch.randn(args.tokens, args.vocab, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    g_aligned = with_row_stride(g, padded)
    g_padded = g_aligned.as_strided((args.tokens, padded), (padded, 1))  # zero columns after vocab
    w_padded = torch.cat([w, w.new_zeros(padded - args.vocab, args.hidden)])
    products = {
        "input gradient g @ W": {
            "eager": lambda: g @ w,
            "aligned rows": lambda: g_aligned @ w,
            "zero-padded": lambda: g_padded @ w_padded,
        },
        "weight gradient g.t() @ x": {
            "eager": lambda: g.t() @ x,
            "aligned rows": lambda: g_aligned.t() @ x,
            "zero-padded": lambda: (g_padded.t() @ x)[:args.vocab],
        },
    }
    for product, ways in products.items():
        want = ways["eager"]().float()
        print(product)
        for name, fn in ways.items():
            error = (fn().float() - want).abs().max().item()
            print(f"  {name:14s} {median_ms(fn):7.3f} ms  max |diff| vs eager {error:.3g}")


if __name__ == "__main__":
    main()
