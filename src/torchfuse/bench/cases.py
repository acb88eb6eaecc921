"""What the benchmark runs: cases, grouped into suites, each building a workload for a device.

A case is a recipe; ``case.build(device, quick)`` makes a :class:`Workload`: its inputs and model
exist once, and ``workload.make_step(compiler)`` returns a zero-argument step that runs it with
that compiler (``lambda fn: fn`` for eager). Every backend of a run times the same tensors.

Suites:
    micro   the foundation's fusion patterns, memory-bound: bfloat16 on a GPU (sized well past
            the L2), float32 on a CPU. Their bandwidth is reported against a copy.
    models  whole models: on a GPU 14 models (our LLaMA, and transformers, timm and torchvision
            models: bench/models_hf.py, bench/models_vision.py); on a CPU an MLP, a small
            transformer block and a small convnet, float32.

``suites.py`` lists every case and selects them by suite, device and name.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torchfuse.bench import patterns

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
Step = Callable[[], Any]


@dataclass
class Workload:
    """One case, built for one device: a step factory plus how to judge and size it."""

    make_step: Callable[[Compiler], Step]
    reference: Callable[[], Any] | None  # outputs in float64, or None when too costly
    dtype: torch.dtype
    memory_bound: bool = False  # report achieved bandwidth against a copy
    inputs: tuple = ()  # memory-bound cases: the tensors a perfect kernel reads once
    note: str = ""  # shape and precision, for the table


@dataclass(frozen=True)
class Case:
    name: str
    suite: str  # "micro" or "models"
    devices: tuple[str, ...]  # device types the case runs on
    build: Callable[[torch.device, bool], Workload]
    requires: tuple[str, ...] = field(default=())  # importable modules the case needs

    def missing(self) -> list[str]:
        """Modules this case needs that are not installed (the case is then skipped, and says why)."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


# -- micro: the foundation's patterns --------------------------------------------------------------
def _pattern_size(device: torch.device, quick: bool) -> str:
    return "small" if quick else ("bench" if device.type == "cuda" else "cpu")


def pattern_case(pattern: patterns.Pattern) -> Case:
    def build(device: torch.device, quick: bool) -> Workload:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        inputs = pattern.make_inputs(device, dtype, _pattern_size(device, quick))

        def make_step(compiler: Compiler) -> Step:
            compiled = compiler(pattern.fn)
            if pattern.needs_grad:
                return lambda: compiled(*inputs)

            def step() -> Any:
                with torch.no_grad():
                    return compiled(*inputs)
            return step

        shape = "x".join(str(s) for s in inputs[0].shape)
        return Workload(make_step, lambda: pattern.fn(*patterns.to_reference(inputs)), dtype,
                        memory_bound=True, inputs=inputs, note=f"{shape} {_dtype_name(dtype)}")

    return Case(pattern.name, "micro", ("cuda", "cpu"), build)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- shared helpers for model cases ----------------------------------------------------------------
def inference_workload(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype, note: str,
                       reference: bool = True, autocast: torch.dtype | None = None) -> Workload:
    """``model(*inputs)`` under no_grad (and autocast when given); a float64 reference when asked."""
    device = inputs[0].device

    def make_step(compiler: Compiler) -> Step:
        compiled = compiler(model)

        def step() -> Any:
            with torch.no_grad(), _autocast(device, autocast):
                return _first_tensor(compiled(*inputs))
        return step

    def ref() -> Any:
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            return _first_tensor(model64(*patterns.to_reference(inputs)))

    return Workload(make_step, ref if reference else None, autocast or dtype, note=note)


def training_workload(model: torch.nn.Module, inputs: tuple, loss_of: Callable[[Any], torch.Tensor],
                      dtype: torch.dtype, note: str, autocast: torch.dtype | None = None) -> Workload:
    """One training step: forward, loss, backward; returns the loss and every parameter gradient.

    Gradients are dropped before each step (as ``zero_grad(set_to_none=True)`` does), so the
    step measures the same work every time. No float64 reference: its cost would exceed the run.
    """
    device = inputs[0].device
    params = [p for p in model.parameters() if p.requires_grad]

    def make_step(compiler: Compiler) -> Step:
        compiled = compiler(model)

        def step() -> Any:
            for p in params:
                p.grad = None
            with _autocast(device, autocast):
                loss = loss_of(compiled(*inputs))
            loss.backward()
            return (loss.detach(), *[p.grad for p in params])
        return step

    return Workload(make_step, None, autocast or dtype, note=note)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _first_tensor(out: Any) -> torch.Tensor:
    """The main output of a model: a tensor, the first of a tuple, or a HuggingFace output's logits."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]
