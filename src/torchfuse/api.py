"""The public API: ``compile``, ``backend``, ``report``, ``reset``, ``explain`` and ``warmup``."""
from __future__ import annotations

from typing import Any, Callable

import torch

from torchfuse.diagnostics import report as reports
from torchfuse.options import Options


def compile(model_or_fn: Callable, *, fullgraph: bool = False, dynamic: bool | None = None,
            mode: str = "default", options: dict[str, Any] | None = None) -> Callable:
    """Compile a model or function with torchfuse as torch.compile's backend.

    Args:
        model_or_fn: an ``nn.Module`` or a function of tensors.
        fullgraph: raise on graph breaks instead of running the breaking code eagerly.
        dynamic: None (recompile shape-generic after a shape changes), True or False.
        mode: one of ``torchfuse.options.MODES``.
        options: torchfuse options (see ``torchfuse.options.Options``), e.g.
            ``{"target": "triton", "strict": True, "dump": ["ir"]}``.
    Returns:
        What ``torch.compile`` returns.
    """
    from torchfuse.frontend.aot import make_backend

    validated = Options.from_user(options, mode)
    return torch.compile(model_or_fn, backend=make_backend(validated), fullgraph=fullgraph, dynamic=dynamic)


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The Dynamo backend with default options: ``torch.compile(m, backend="torchfuse")``."""
    from torchfuse.frontend.aot import make_backend

    return make_backend(Options.from_user(kwargs.get("options")))(gm, example_inputs)


def report() -> reports.Report:
    """What torchfuse compiled in this process: graphs, kernels, refused fusions, fallbacks."""
    return reports.report()


def explain(fn_or_model: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn_or_model(*args, **kwargs)`` once under compilation; return an ``ExplainResult``
    with the graphs, each graph break (reason, file:line, the line, a fix), ATen fallbacks and
    the fusion summary. ``str()`` of it is a readable report (see ``diagnostics/explain.py``)."""
    from torchfuse.diagnostics.explain import explain as run_explain

    return run_explain(fn_or_model, *args, **kwargs)


def warmup(compiled: Callable, example_inputs_list: list[Any], backward: bool = False) -> Any:
    """Compile ahead for each example's shapes; return a ``WarmupReport`` of what was compiled
    (see ``diagnostics/warmup.py``)."""
    from torchfuse.diagnostics.warmup import warmup as run_warmup

    return run_warmup(compiled, example_inputs_list, backward=backward)


def reset() -> None:
    """Forget compiled graphs (Dynamo's caches, and graphs cached in memory; not the disk caches)
    and reports."""
    import torch._dynamo

    from torchfuse.runtime import graph_cache

    torch._dynamo.reset()
    graph_cache.clear_memory()
    reports.clear()
