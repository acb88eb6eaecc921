"""Which attention a model's compiled graphs run, and which kernels eager's step runs for it.

On the H200, BERT training under torchfuse ran its attention as SDPA's math path (two float32
bmm a layer, 4.6 ms a step) where GPT-2 inference kept cuDNN's fused kernel. Per case this
prints, for one step:

- the attention ops of the forward and backward graphs AOTAutograd hands a backend, traced
  with torchfuse's decomposition table and with none (``ours`` / ``no table``): fused SDPA ops,
  ``_safe_softmax`` and bmm, with the dtypes of bmm's operands;
- eager's attention kernels (names with fmha, flash, sdpa, attention or gemm, from the profiler);
- ``torch._fused_sdp_choice`` for the q/k/v/mask the model's first SDPA call receives;
- what torchfuse's traces chose (``frontend/attention.py``), with the metadata of math choices.

    python3 scripts/diagnose_attention.py --cases bert_mlm_train,gpt2_infer
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench.suites import select  # noqa: E402
from torchfuse.frontend import attention  # noqa: E402
from torchfuse.frontend.decompositions import decomposition_table  # noqa: E402

ATTENTION = ("scaled_dot_product", "safe_softmax", "bmm")


def attention_ops(gm: torch.fx.GraphModule) -> Counter:
    found: Counter = Counter()
    for node in gm.graph.nodes:
        name = str(node.target)
        if node.op == "call_function" and any(word in name for word in ATTENTION):
            dtypes = ",".join(str(a.meta["val"].dtype).removeprefix("torch.") for a in node.args
                              if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor))
            found[f"{name} ({dtypes})"] += 1
    return found


def recording_backend(table: dict, seen: dict[str, Counter]):
    def record(kind: str):
        def compiler(gm, example_inputs):
            seen[kind] += attention_ops(gm)
            return gm
        return compiler
    return aot_autograd(fw_compiler=record("forward"), bw_compiler=record("backward"), decompositions=table)


def spy_sdpa_choice() -> list[str]:
    """Wrap F.scaled_dot_product_attention to note the fused choice of its first call."""
    notes: list[str] = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        if not notes:
            mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype, attn_mask.stride())
            choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)
            notes.append(f"q {tuple(q.shape)} {q.dtype} requires_grad={q.requires_grad} mask {mask} "
                         f"dropout {dropout_p} causal {is_causal} -> _fused_sdp_choice {choice} "
                         f"(0 math, 1 flash, 2 efficient, 3 cudnn, ...)")
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)

    F.scaled_dot_product_attention = spy
    torch.nn.functional.scaled_dot_product_attention = spy
    return notes


def eager_kernels(step) -> Counter:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    words = ("fmha", "flash", "sdpa", "attention", "gemm", "softmax")
    return Counter(e.name[:90] for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and any(w in e.name.lower() for w in words))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="bert_mlm_train,gpt2_infer")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    device = torch.device("cuda")
    notes = spy_sdpa_choice()
    for case in select("models", device, set(args.cases.split(","))):
        workload = case.build(device, False)
        print(f"# {case.name}")
        step = workload.make_step(lambda model: model)
        step()
        print("  eager SDPA call:", notes[0] if notes else "no F.scaled_dot_product_attention call")
        for name, count in eager_kernels(step).most_common(12):
            print(f"  eager kernel x{count}: {name}")
        for label, table in (("ours", decomposition_table()), ("no table", {})):
            seen: dict[str, Counter] = {"forward": Counter(), "backward": Counter()}
            torch._dynamo.reset()
            workload.make_step(lambda model: torch.compile(model, backend=recording_backend(table, seen)))()
            for kind, ops in seen.items():
                print(f"  {label} {kind}: {dict(ops) or 'no attention ops'}")
        torch._dynamo.reset()
        attention.choices.clear()
        attention.details.clear()
        workload.make_step(lambda model: torchfuse.compile(model))()
        print(f"  torchfuse's traces chose: {dict(attention.choices) or 'no attention call'}")
        for detail, count in attention.details.items():
            print(f"    math x{count}: {detail}")
        notes.clear()
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
