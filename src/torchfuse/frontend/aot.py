"""The Dynamo backend: aot_autograd splits forward/backward and we compile each ATen graph.

All torch-internal entry points used for capture live here (and in ``symbolic.py``).
"""
from __future__ import annotations

import warnings
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
        if options.target == "auto" and not _any_cuda(example_inputs) and not _cpp_available():
            return _run_eagerly(gm)
        try:
            return compile_with_aot(gm, example_inputs)
        except Exception as error:  # noqa: BLE001 - aot_autograd itself failed: run as captured
            if options.strict or _is_dynamo_control_flow(error):
                raise
            warnings.warn(f"torchfuse: AOTAutograd could not trace a graph ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); running it as captured. "
                          "Pass options={'strict': True} to raise.", stacklevel=2)
            return _run_eagerly(gm, f"{type(error).__name__}: {error}")

    return backend


def _is_dynamo_control_flow(error: Exception) -> bool:
    """Exceptions Dynamo uses to restart analysis (e.g. to re-trace with a float specialised):
    they are signals for Dynamo, not failures, and must reach it."""
    from torch._dynamo import exc

    signals = tuple(getattr(exc, name) for name in ("TensorifyScalarRestartAnalysis", "RestartAnalysis")
                    if hasattr(exc, name))
    return isinstance(error, signals)


def _any_cuda(values: list[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)


def _cpp_available() -> bool:
    """CPU graphs compile to C++ (the ``cpp`` target) when the machine has a C++ compiler."""
    from torchfuse.runtime import cpp_build

    if cpp_build.compiler_available():
        return True
    cpp_build.warn_once("torchfuse: no C++ compiler found (install g++ or set CXX); "
                        "CPU graphs run unfused with ATen")
    return False


def _run_eagerly(gm: torch.fx.GraphModule, error: str | None = None) -> Callable:
    """Without a C++ compiler, CPU graphs run Dynamo's graph as captured (eager speed);
    decomposing them for ATen would only add ops. So does a graph aot_autograd fails on
    (``error``). The report records it."""
    from torchfuse.diagnostics import report as reports

    graph_report = reports.GraphReport(reports.next_graph_name(), "eager", "aten")
    graph_report.aten_ops = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    graph_report.error = error
    reports.record(graph_report)
    return gm.forward
