"""GPT-2's LM head three ways on a GPU: eager (a result with odd rows), the weight padded to
aligned rows (one matmul, a 77 MB copy), and ``mm_into_padded_rows`` (aligned columns, then
the rest, into padded-stride rows). Prints the median ms of each and the peak memory above
the inputs. Usage: python scripts/measure_padded_matmul.py [--tokens 4096]"""
from __future__ import annotations

import argparse
import statistics

import torch

from torchfuse.lowering.matmul_padding import mm_into_padded_rows


def median_ms(fn, repeats: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mb(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    x = torch.randn(args.tokens, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(50257, 768, device="cuda", dtype=torch.bfloat16)
    ways = {
        "eager": lambda: torch.nn.functional.linear(x, w),
        "padded weight": lambda: torch.mm(x, torch.nn.functional.pad(w, (0, 0, 0, 7)).t())[:, :50257],
        "split into padded rows": lambda: mm_into_padded_rows(x, w.t(), 50264),
    }
    want = ways["eager"]().float()
    for name, fn in ways.items():
        error = (fn().float() - want).abs().max().item()
        print(f"{name:24s} {median_ms(fn):7.3f} ms  peak {peak_mb(fn):7.1f} MB  max |diff| vs eager {error:.3g}")


if __name__ == "__main__":
    main()
