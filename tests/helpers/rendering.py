"""Kernels of a function rendered for the Triton target through the pipeline's own stages,
without running anything (the static checks of generated source: coalescing, launch rules)."""
from __future__ import annotations

from typing import Callable

from torch.fx.experimental.proxy_tensor import make_fx

from torchfuse import pipeline
from torchfuse.diagnostics.model import GraphReport
from torchfuse.frontend.decompositions import decomposition_table
from torchfuse.options import Options


def rendered_kernels(fn: Callable, args: list) -> list:
    """Every rendered ``TritonKernel`` of ``fn`` at ``args``' (static) sizes, in launch order."""
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)  # as aot_autograd decomposes
    state = pipeline.CompileState(gm, list(args), Options(target="triton"), "triton",
                                  GraphReport("g", "inference", "triton"))
    pipeline.stage_lower(state)
    pipeline.stage_schedule(state)
    return [pipeline.render_triton_kernel(k, state.graph.buffers, int) for k in state.plan.kernels]
