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

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        # Recompute cheap pointwise ops in the backward rather than saving them: less memory
        # and the recomputation fuses into kernels the backward runs anyway.
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )
