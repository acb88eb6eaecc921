"""aot_autograd as a Dynamo backend: one ATen graph per forward, backward or inference graph.

All torch-internal entry points used for capture live here (and in ``symbolic.py``). What to do
with each ATen graph is a parameter (the pipeline, wired in by ``api.make_backend``), so the
frontend knows nothing of the stages above it.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch
import torch.fx
from torch._dynamo import exc as dynamo_exc
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._guards import TracingContext

from torchfuse.frontend import aot_cache, attention, linear_groups
from torchfuse.frontend.decompositions import decomposition_table

# (ATen graph, example inputs, kind: "forward" | "backward" | "inference") -> boxed callable
GraphCompiler = Callable[[torch.fx.GraphModule, list[Any], str], Callable]
# (Dynamo's graph, why it cannot be traced or None) -> callable running it as captured
CapturedRunner = Callable[[torch.fx.GraphModule, "str | None"], Callable]
Backend = Callable[[torch.fx.GraphModule, list[Any]], Callable]

# Dynamo writes ``addcmul_`` and ``lerp_`` with a scalar weight as ``prims.fma``, an op torch
# defines in torch._inductor.inductor_prims, which the partitioner imported above loads (torchfuse
# never imports torch._inductor itself). Lowering names the op through here, so it exists by then.
FMA_OPS: tuple = tuple(op.default for op in [getattr(torch.ops.prims, "fma", None)] if op is not None)


def aot_backend(compile_graph: GraphCompiler, run_captured: CapturedRunner, strict: bool,
                warm_cache: aot_cache.WarmCache | None = None) -> Backend:
    """A Dynamo backend: aot_autograd functionalizes and decomposes each captured graph, splits it
    into forward and backward (or one inference graph) and hands each to ``compile_graph``.

    Args:
        compile_graph: compiles one ATen graph.
        run_captured: runs a graph aot_autograd could not trace as Dynamo captured it.
        strict: raise aot_autograd's own failures instead of running the graph as captured.
        warm_cache: where a later process finds what aot_autograd traced (``aot_cache.py``);
            None traces every graph.
    Returns:
        The backend, ``backend(gm, example_inputs) -> callable``.
    """

    def compiler(kind: str) -> Callable:
        def compile_one(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            return compile_graph(gm, example_inputs, kind)

        return compile_one

    compilers = aot_cache.Compilers(compiler("inference"), compiler("forward"), compiler("backward"))
    no_hooks = aot_cache.install_hooks() if warm_cache is not None else None
    if no_hooks is not None:
        warm_cache = None
    record = aot_cache.recorded if warm_cache is not None else (lambda compile_one: compile_one)
    forward = record(compilers.forward)
    compile_with_aot = aot_autograd(
        # A SerializableAOTDispatchCompiler makes aot_autograd consult its cache (aot_cache.py).
        fw_compiler=SerializableAOTDispatchCompiler(object, forward) if warm_cache is not None else forward,
        bw_compiler=record(compilers.backward),
        inference_compiler=record(compilers.inference),
        decompositions=decomposition_table(),
        # Recompute cheap pointwise ops in the backward rather than saving them: less memory
        # and the recomputation fuses into kernels the backward runs anyway.
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                before_tracing: Callable[[], Any] | None = None) -> Callable:
        """``before_tracing`` runs when aot_autograd is about to trace (not on a warm-cache hit)."""
        if no_hooks is not None:
            aot_cache.stats.not_cached[no_hooks] += 1
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
        if on_cuda:
            attention.keep_fused_attention(gm)
        try:
            merged = _merge_linears(gm, on_cuda)
            if merged is not None:
                try:
                    with aot_cache.serving(warm_cache, compilers, before_tracing, example_inputs):
                        compiled = compile_with_aot(gm, example_inputs)
                    linear_groups.merged.update(merged.labels)
                    return compiled
                except Exception as error:  # noqa: BLE001 - e.g. a view the split outputs refuse
                    if _is_dynamo_control_flow(error):
                        raise
                    linear_groups.refused[f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]] += 1
                    merged.restore()
            with aot_cache.serving(warm_cache, compilers, before_tracing, example_inputs):
                return compile_with_aot(gm, example_inputs)
        except Exception as error:  # noqa: BLE001 - aot_autograd itself failed: run as captured
            if strict or _is_dynamo_control_flow(error):
                raise
            warnings.warn(f"torchfuse: AOTAutograd could not trace a graph ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); running it as captured. "
                          "Pass options={'strict': True} to raise.", stacklevel=2)
            return run_captured(gm, f"{type(error).__name__}: {error}")

    return backend


def _merge_linears(gm: torch.fx.GraphModule, on_cuda: bool) -> linear_groups.Merged | None:
    """Merge ``gm``'s linear layers on a shared input in place (``linear_groups``); None when
    nothing merges or merging is off: ``TORCHFUSE_MERGE_LINEARS`` "0" turns it off, "1" on for
    every graph, unset means on for CUDA graphs (it saves host time per matmul, which CPU
    graphs do not lack)."""
    setting = os.environ.get("TORCHFUSE_MERGE_LINEARS", "")
    if setting == "0" or (setting != "1" and not on_cuda):
        return None
    return linear_groups.merge_shared_input_linears(gm)


def mutated_inputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of the graph's inputs that it writes in place (a functionalized graph writes
    an input back with ``copy_``; any op whose schema marks an argument as written counts)."""
    placeholders = {node: i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    mutated: set[int] = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is not None and argument.alias_info.is_write:
                base = _viewed_input(value)
                if base in placeholders:
                    mutated.add(placeholders[base])
    return frozenset(mutated)


def _viewed_input(value: Any) -> Any:
    """The node a chain of view ops starts from (writing a view writes its base)."""
    while isinstance(value, torch.fx.Node) and value.op == "call_function":
        schema = getattr(value.target, "_schema", None)
        returns_view = schema is not None and schema.returns and schema.returns[0].alias_info is not None
        if not returns_view or not value.args:
            break
        value = value.args[0]
    return value


def saved_outputs_start(kind: str) -> int | None:
    """In a forward graph of aot_autograd, the position of the first output saved for the
    backward (the outputs before it are the user's and mutated inputs' new values); None when
    not known. Read from aot_autograd's metadata while it compiles the forward graph."""
    if kind != "forward":
        return None
    metadata = getattr(TracingContext.try_get(), "fw_metadata", None)
    start = getattr(metadata, "num_forward", None)
    return start if isinstance(start, int) else None


def static_inputs(kind: str, num_inputs: int) -> frozenset[int] | None:
    """In a forward or inference graph, the positions of inputs that stay at one address from
    call to call: parameters and buffers, as Dynamo marked them (aot_autograd's
    ``static_input_indices``). None when not known (a backward graph, whose metadata describes
    its forward's inputs; a graph loaded from the warm cache)."""
    if kind not in ("forward", "inference"):
        return None
    metadata = getattr(TracingContext.try_get(), "fw_metadata", None)
    indices = getattr(metadata, "static_input_indices", None)
    if not isinstance(indices, (list, tuple)) or not all(isinstance(i, int) and 0 <= i < num_inputs for i in indices):
        return None
    return frozenset(indices)


def _is_dynamo_control_flow(error: Exception) -> bool:
    """Exceptions Dynamo uses to restart analysis (e.g. to re-trace with a float specialised):
    they are signals for Dynamo, not failures, and must reach it."""
    signals = tuple(getattr(dynamo_exc, name) for name in ("TensorifyScalarRestartAnalysis", "RestartAnalysis")
                    if hasattr(dynamo_exc, name))
    return isinstance(error, signals)
