"""The public API: ``compile``, ``backend``, ``report`` and ``reset``, and the Dynamo backend that
ties the frontend (aot_autograd) to the pipeline.

``torchfuse.explain`` and ``torchfuse.warmup`` are tools on top of this module (``tools/``); the
package's ``__init__`` exports them with these names.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch._dynamo

from torchfuse import pipeline
from torchfuse.diagnostics import report as reports
from torchfuse.frontend.aot import aot_backend
from torchfuse.frontend.aot_cache import WarmCache
from torchfuse.options import Options
from torchfuse.runtime import aot_store, compile_pool, cpp_build, graph_cache


def compile(model_or_fn: Callable, *, fullgraph: bool = False, dynamic: bool | None = None,
            mode: str = "default", options: dict[str, Any] | None = None) -> Callable:
    """Compile a model or function with torchfuse as torch.compile's backend.

    Args:
        model_or_fn: an ``nn.Module`` or a function of tensors.
        fullgraph: raise on graph breaks instead of running the breaking code eagerly.
        dynamic: None (recompile shape-generic after a shape changes), True or False.
        mode: one of ``torchfuse.options.MODES``: "default"; "reduce-overhead" replays CUDA
            graphs; "max-autotune" also times candidate block sizes of each GPU kernel at its
            first launch and keeps the fastest (cached on disk); "max-autotune-no-cudagraphs"
            only autotunes. Autotuning applies to Triton kernels; C++ kernels (CPU tensors)
            run as in the default mode, and a warning says so.
        options: torchfuse options (see ``torchfuse.options.Options``), e.g.
            ``{"target": "triton", "strict": True, "dump": ["ir"]}``; ``{"autotune": True}``
            autotunes in any mode, ``False`` turns it off in the max-autotune modes.
    Returns:
        What ``torch.compile`` returns.
    """
    validated = Options.from_user(options, mode)
    return torch.compile(model_or_fn, backend=make_backend(validated), fullgraph=fullgraph, dynamic=dynamic)


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The Dynamo backend: ``torch.compile(m, backend="torchfuse")``, which hands it ``mode=``
    and ``options=`` when the caller gives them."""
    mode = kwargs.get("mode") or "default"
    return make_backend(Options.from_user(kwargs.get("options"), mode))(gm, example_inputs)


def make_backend(options: Options) -> Callable[[torch.fx.GraphModule, list[Any]], Callable]:
    """A Dynamo backend compiling forward, backward and inference graphs with ``options``."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str) -> Callable:
        with collector_paused():  # also when aot_autograd compiles a backward graph lazily
            return pipeline.compile_graph(gm, example_inputs, kind, options)

    warm_cache = None
    if aot_store.enabled():  # a later process skips aot_autograd's tracing (frontend/aot_cache.py)
        warm_cache = WarmCache(aot_store.load, aot_store.save, lambda: aot_store.key_text(options))
    traced = aot_backend(compile_graph, pipeline.run_captured, options.strict, warm_cache)

    def run(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        if options.target == "auto" and not _any_cuda(example_inputs) and not _cpp_available():
            return pipeline.run_captured(gm)
        # GPU compile workers start when AOTAutograd is about to trace, and load Triton meanwhile;
        # a warm-cache hit compiles nothing, so it starts none (their imports would compete with
        # Dynamo for the CPUs).
        gpu = _any_cuda(example_inputs) and options.target in ("auto", "triton")
        with collector_paused():
            return traced(gm, example_inputs, before_tracing=compile_pool.get_pool if gpu else None)

    return run


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a graph compiles. Tracing and lowering
    allocate millions of short-lived objects, and each full collection walks the whole heap
    (torch, transformers, the model): on the H200 a warm GPT-2 compile spent 0.33 s in
    collections against Dynamo's own 0.04 s. Compiling makes few reference cycles; what it
    leaves is collected normally once the collector is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _any_cuda(values: list[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)


def _cpp_available() -> bool:
    """CPU graphs compile to C++ (the ``cpp`` target) when the machine has a C++ compiler."""
    if cpp_build.compiler_available():
        return True
    cpp_build.warn_once("torchfuse: no C++ compiler found (install g++ or set CXX); "
                        "CPU graphs run unfused with ATen")
    return False


def report() -> reports.Report:
    """What torchfuse compiled in this process: graphs, kernels, refused fusions, fallbacks."""
    return reports.report()


def reset() -> None:
    """Forget compiled graphs (Dynamo's caches, and graphs cached in memory; not the disk caches)
    and reports."""
    torch._dynamo.reset()
    graph_cache.clear_memory()
    reports.clear()
