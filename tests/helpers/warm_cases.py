"""The warm cache's cases (tests/test_warm_cache.py), each a function of fresh inputs run with
torchfuse: in the test's process, or as a script in a later process.

    python tests/helpers/warm_cases.py OUT.pt case [case ...]

runs each named case once (its own Dynamo state), counting AOTAutograd's traces, and saves
``{case: {"outputs", "grads", "inputs_after", "buffers", "traces"}, "stats": ...}`` to OUT.pt.
``TORCHFUSE_WARM_DEVICE`` (cpu) and ``TORCHFUSE_WARM_MODE`` (default) choose the device and mode.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch
import torch._functorch.aot_autograd as aot_autograd
import torch.nn.functional as F

import torchfuse
from torchfuse.frontend import aot_cache
from torchfuse.runtime import compile_pool


class Case:
    """``make()`` -> (callable, inputs); ``backward``: sum the outputs and differentiate."""

    def __init__(self, make: Callable[[], tuple[Any, list[torch.Tensor]]], backward: bool = False) -> None:
        self.make, self.backward = make, backward


def _randn(*shape: int, seed: int = 0, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def _mlp() -> tuple[Any, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.LayerNorm(24),
                                torch.nn.Linear(24, 5))
    return model, [_randn(7, 12)]


def _batch_norm() -> tuple[Any, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).train()
    return model, [_randn(2, 3, 9, 9)]


def _add_in_place(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * y


def _view_of_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.view(-1), x.exp()


def _aliasing_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = x * 2 + 1
    return y, y.view(-1), y[1]


class _RelativeBias(torch.nn.Module):
    """A looked-up bias read through a permutation and saved for the backward: the forward stores
    it in its readers' order and tells AOTAutograd (scheduler/reader_layout.py), so a warm process
    must make the same choice for the backward it restores."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(_randn(32, 4, seed=2))

    def forward(self, buckets: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bias = F.embedding(buckets, self.table).permute(2, 0, 1).unsqueeze(0)
        return torch.softmax(scores * bias, -1)


class _Attention(torch.nn.Module):
    """Causal self-attention in bf16 through SDPA: on a GPU, torchfuse points the captured call at
    its own ``frontend.attention.fused_attention``, which a warm process must find in its key."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).to(torch.bfloat16).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).float()


def _random(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, 0.5, training=True) + x


CASES: dict[str, Case] = {
    "mlp_inference": Case(lambda: (_mlp()[0].eval().requires_grad_(False), _mlp()[1])),
    "mlp_training": Case(lambda: (_mlp()[0], [_randn(7, 12, grad=True)]), backward=True),
    "batch_norm_training": Case(lambda: (_batch_norm()[0], _batch_norm()[1]), backward=True),
    "add_in_place": Case(lambda: (_add_in_place, [_randn(5, 6), _randn(5, 6, seed=1)])),
    "add_in_place_training": Case(lambda: (_add_in_place, [_randn(5, 6), _randn(5, 6, seed=1, grad=True)]),
                                  backward=True),
    "view_of_input": Case(lambda: (_view_of_input, [_randn(4, 5)])),
    "aliasing_outputs": Case(lambda: (_aliasing_outputs, [_randn(3, 4)])),
    "aliasing_outputs_training": Case(lambda: (_aliasing_outputs, [_randn(3, 4, grad=True)]), backward=True),
    "dropout": Case(lambda: (_random, [_randn(64, 32)])),
    "attention_training": Case(lambda: (_Attention(), [_randn(2, 16, 32, grad=True)]), backward=True),
    "relative_bias_training": Case(lambda: (_RelativeBias(), [torch.randint(0, 32, (16, 16), generator=torch.Generator().manual_seed(3)),
                                                              _randn(3, 4, 16, 16, grad=True)]), backward=True),
}


class TraceCounter:
    """Counts AOTAutograd's graph captures (the tracing a warm hit skips)."""

    def __init__(self) -> None:
        self.count = 0
        self.original = aot_autograd.aot_stage1_graph_capture

    def __enter__(self) -> "TraceCounter":
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return self.original(*args, **kwargs)

        aot_autograd.aot_stage1_graph_capture = counted
        return self

    def __exit__(self, *exc: Any) -> None:
        aot_autograd.aot_stage1_graph_capture = self.original


def run_case(name: str) -> dict[str, Any]:
    """Compile the case with torchfuse (strict) and run it once (forward and backward)."""
    fn, inputs = CASES[name].make()
    device = os.environ.get("TORCHFUSE_WARM_DEVICE", "cpu")
    fn = fn.to(device) if isinstance(fn, torch.nn.Module) else fn
    inputs = [x.detach().to(device).requires_grad_(x.requires_grad) for x in inputs]
    torch._dynamo.reset()
    torch.manual_seed(123)  # the dropout case's mask
    with TraceCounter() as traces:
        mode = os.environ.get("TORCHFUSE_WARM_MODE", "default")
        compiled = torchfuse.compile(fn, mode=mode, options={"strict": True})
        outputs, grads = _forward_backward(compiled, fn, inputs, CASES[name].backward)
    buffers = [b.cpu() for b in fn.buffers()] if isinstance(fn, torch.nn.Module) else []
    return {"outputs": [o.detach().cpu() for o in outputs], "grads": [g.cpu() for g in grads], "traces": traces.count,
            "inputs_after": [x.detach().cpu() for x in inputs], "buffers": buffers,
            "aliases": _alias_pattern(outputs, inputs)}


def eager_case(name: str) -> dict[str, Any]:
    """The same case run eagerly, for comparison."""
    fn, inputs = CASES[name].make()
    torch.manual_seed(123)
    outputs, grads = _forward_backward(fn, fn, inputs, CASES[name].backward)
    buffers = [b.clone() for b in fn.buffers()] if isinstance(fn, torch.nn.Module) else []
    return {"outputs": [o.detach().clone() for o in outputs], "grads": grads,
            "inputs_after": [x.detach().clone() for x in inputs], "buffers": buffers,
            "aliases": _alias_pattern(outputs, inputs)}


def _forward_backward(run: Callable, fn: Any, inputs: list[torch.Tensor], backward: bool) -> tuple[tuple, list]:
    """``run(*inputs)`` as a tuple, and, for a case with a backward, the gradients of the inputs
    and of ``fn``'s parameters after backpropagating the outputs' sum."""
    outputs = run(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    grads: list[Any] = []
    if backward:
        sum(o.float().sum() for o in outputs).backward()
        params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
        grads = [t.grad for t in [*inputs, *params] if t.requires_grad]
    return outputs, grads


def _alias_pattern(outputs: tuple, inputs: list[torch.Tensor]) -> list[tuple]:
    """Which tensors share memory: per output, the inputs and the earlier outputs it shares with."""
    def storage(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    pattern = []
    for i, out in enumerate(outputs):
        pattern.append((tuple(j for j, x in enumerate(inputs) if storage(x) == storage(out)),
                        tuple(j for j, o in enumerate(outputs[:i]) if storage(o) == storage(out))))
    return pattern


def main(argv: list[str]) -> int:
    out, *names = argv
    results: dict[str, Any] = {name: run_case(name) for name in names}
    results["stats"] = {"hits": aot_cache.stats.hits, "misses": aot_cache.stats.misses,
                        "workers_started": compile_pool.stats.workers_started,
                        "stored": aot_cache.stats.stored, "not_cached": dict(aot_cache.stats.not_cached),
                        "not_stored": dict(aot_cache.stats.not_stored), "not_loaded": dict(aot_cache.stats.not_loaded)}
    torch.save(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
