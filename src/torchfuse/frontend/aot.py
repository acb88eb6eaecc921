"""The Dynamo backend: aot_autograd splits forward/backward and we compile each ATen graph.

All torch-internal entry points used for capture live here (and in ``symbolic.py``).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torchfuse.frontend.decompositions import decomposition_table
from torchfuse.options import Options


def make_backend(options: Options) -> Callable[[torch.fx.GraphModule, list[Any]], Callable]:
    """A Dynamo backend compiling forward, backward and inference graphs with ``options``."""
    from torchfuse.pipeline import compile_graph

    def compiler(kind: str) -> Callable:
        def compile_one(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            return compile_graph(gm, example_inputs, kind, options)

        return compile_one

    compile_with_aot = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        # Recompute cheap pointwise ops in the backward rather than saving them: less memory
        # and the recomputation fuses into kernels the backward runs anyway.
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        if options.target == "auto" and not _any_cuda(example_inputs):
            return _run_eagerly(gm)
        return compile_with_aot(gm, example_inputs)

    return backend


def _any_cuda(values: list[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)


def _run_eagerly(gm: torch.fx.GraphModule) -> Callable:
    """CPU graphs run Dynamo's graph as captured (eager speed) until the C++ target exists;
    decomposing them first would only add ops. The report records it."""
    from torchfuse.diagnostics import report as reports

    graph_report = reports.GraphReport(reports.next_graph_name(), "eager", "aten")
    graph_report.aten_ops = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    graph_report.error = None
    reports.record(graph_report)
    return gm.forward
