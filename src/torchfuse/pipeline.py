"""Compile one ATen graph: the ordered list of named stages from lowering to the wrapper.

Each stage's output can be printed by name (``options={"dump": ["ir", "kernels"]}`` or
``TORCHFUSE_DUMP=ir,kernels``) and its time goes into the report.
"""
from __future__ import annotations

import copy
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch._guards import TracingContext
from torch.utils._pytree import tree_leaves

import torchfuse.scheduler.schedule as scheduling  # a module, so a test can replace its schedule()
from torchfuse.codegen.cpp.kernel import CppKernel
from torchfuse.codegen.triton import combo
from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.codegen.triton.kernel import render_kernel as render_triton_kernel
from torchfuse.codegen.triton.split import split_reductions
from torchfuse.diagnostics import report as reports
from torchfuse.diagnostics.model import AutotuneEntry, GraphReport, KernelReport
from torchfuse.diagnostics.traffic import TrafficCounter
from torchfuse.frontend.aot import mutated_inputs, saved_outputs_start, static_inputs
from torchfuse.frontend.symbolic import shape_env_of, size_hint
from torchfuse.ir.printer import format_graph
from torchfuse.lowering.bias_epilogue import split_bias_into_pointwise_users, split_convolution_bias
from torchfuse.lowering.cast_views import share_casts_of_views
from torchfuse.lowering.conv_layout import convolutions_channels_last
from torchfuse.lowering.devices import check_one_device, place_on_one_device
from torchfuse.lowering.driver import lower
from torchfuse.lowering.input_strides import adopt_input_strides
from torchfuse.lowering.matmul_padding import has_unaligned_matmul, pad_unaligned_matmuls, padded_output_strides
from torchfuse.lowering.operand_padding import pad_unaligned_operands
from torchfuse.options import Options
from torchfuse.runtime import autotune, cpp_build, cudagraphs, graph_cache, kernel_cache, triton_ahead, wrapper
from torchfuse.runtime.predict import Unpredicted, predict_launches
from torchfuse.scheduler.kernel import FusedKernel


@dataclass
class CompileState:
    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    options: Options
    target: str
    report: GraphReport
    graph: Any = None
    plan: Any = None
    kernels: dict = field(default_factory=dict)
    launchers: dict = field(default_factory=dict)
    wrapper_constants: dict = field(default_factory=dict)  # objects the wrapper source names
    fixed_args: dict = field(default_factory=dict)  # launcher constant -> arguments fixed at every call
    call: Callable | None = None
    predictions: dict = field(default_factory=dict)  # GPU kernel name -> PredictedLaunch | Unpredicted
    ahead: dict = field(default_factory=dict)  # GPU kernel name -> (PredictedLaunch, loader): compiling

    def launched_kernels(self) -> dict:
        """The rendered kernels the wrapper launches: a combined launch's parts run inside it."""
        parts = {name for names in getattr(self.plan, "launch_groups", {}).values() for name in names}
        return {name: kernel for name, kernel in self.kernels.items() if name not in parts}


def choose_target(example_inputs: list[Any], options: Options, gm: torch.fx.GraphModule | None = None) -> str:
    """The target of a graph: from its inputs' devices and, given ``gm``, every tensor its nodes
    make (a graph of CPU inputs may create CUDA tensors, ``torch.ones(n, device="cuda")``)."""
    devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if gm is not None:
        devices |= _node_devices(gm)
    if options.target != "auto":
        # A forced target still needs memory it can run on: meta tensors have no data, and a
        # kernel handed their null pointers would crash the process. ATen computes their shapes.
        runnable = {"cpp": {"cpu"}, "triton": {"cpu", "cuda"}}.get(options.target)
        return options.target if runnable is None or devices <= runnable else "aten"
    if "cuda" in devices:
        return "triton"
    return "cpp" if devices <= {"cpu"} else "aten"  # C++ for CPU tensors; ATen for other devices


def _node_devices(gm: torch.fx.GraphModule) -> set[str]:
    values = tree_leaves([n.meta.get("val") for n in gm.graph.nodes])
    return {v.device.type for v in values if isinstance(v, torch.Tensor)}


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str, options: Options) -> Callable:
    """Compile one graph from aot_autograd into a boxed callable ``f(args_list)``.

    Args:
        gm: the ATen FX graph.
        example_inputs: fake tensors (or SymInts) describing the inputs.
        kind: "forward", "backward" or "inference", for the report.
        options: validated user options.
    Returns:
        A function taking the list of inputs (which it clears) and returning the outputs.
    """
    adopted = adopt_input_strides(gm, list(example_inputs))  # before the cache key reads the layouts
    target = choose_target(example_inputs, options, gm)
    graph_report = GraphReport(reports.next_graph_name(), kind, target, input_strides=adopted)
    graph_report.aten_ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    state = CompileState(gm, list(example_inputs), options, target, graph_report)
    try:
        call = _run_stages_or_restore(state)
        _report_output_strides(state)
        _note_untuned_cpp_kernels(state)
        if options.mode in CUDA_GRAPH_MODES:
            call = _with_cuda_graphs(call, state)
        if options.check or os.environ.get("TORCHFUSE_CHECK") == "1":
            call = _checked(call, gm, graph_report.name)
    except Exception as error:  # noqa: BLE001 - any internal failure falls back to ATen
        if options.strict:
            raise
        graph_report.error = f"{type(error).__name__}: {error}"
        graph_report.target = "aten"
        ops = sorted({op.split('.')[-2] if '.' in op else op for op in graph_report.aten_ops})
        warnings.warn(
            f"torchfuse could not compile {graph_report.name} (ops: {', '.join(ops[:12])}"
            f"{'...' if len(ops) > 12 else ''}): {graph_report.error}. Running it with ATen instead; "
            "pass options={'strict': True} to raise.",
            stacklevel=2,
        )
        call = _run_with_aten(gm, _fallback_output_strides(state))
        _report_output_strides(state)  # the rewritten graph runs: its padded outputs stay
    reports.record(graph_report)
    call._boxed_call = True
    return call


# Modes that replay CUDA graphs (max-autotune includes them, as torch.compile's does).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _with_cuda_graphs(call: Callable, state: CompileState) -> Callable:
    """``call`` replayed through CUDA graphs (runtime/cudagraphs.py), or ``call`` itself with
    the reason in the report when the graph cannot use them at all."""
    reason = _cuda_graph_refusal(state)
    if reason:
        state.report.cudagraphs[f"not used: {reason}"] += 1
        return call
    io = cudagraphs.GraphIO(mutated_inputs=mutated_inputs(state.gm),
                            saved_outputs_from=saved_outputs_start(state.report.kind),
                            static_inputs=static_inputs(state.report.kind, len(state.example_inputs)),
                            gradient_outputs=state.report.kind == "backward")
    shape_generic = any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and not _static_shape(x))
                        for x in state.example_inputs)
    return cudagraphs.CudaGraphRunner(call, io, state.report.cudagraphs, shape_generic=shape_generic)


def _cuda_graph_refusal(state: CompileState) -> str | None:
    if state.target != "triton" or not any(isinstance(x, torch.Tensor) and x.device.type == "cuda"
                                           for x in state.example_inputs):
        return "the graph does not run on a CUDA device"
    if any(isinstance(k, CppKernel) for k in state.kernels.values()):
        return "part of the graph runs on the CPU (C++ kernels): a replay would skip it"
    host_reads = sorted({op for k in state.report.kernels if k.kind == "extern" for op in k.ops if _reads_on_host(op)})
    if host_reads:
        return f"the graph calls {', '.join(host_reads)} with ATen, which reads GPU data on the host"
    return None


# ATen ops whose output shape or value comes from the data: the host waits for the GPU inside
# them, which a CUDA graph cannot record (custom ops say so with the cudagraph_unsafe tag).
HOST_READ_TAGS = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output,
                            torch.Tag.cudagraph_unsafe})


def _reads_on_host(op_name: str) -> bool:
    """Does the op named ``op_name`` ("aten.nonzero.default") carry a tag of HOST_READ_TAGS?"""
    try:
        namespace, name, overload = op_name.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (ValueError, AttributeError):
        return False
    return bool(HOST_READ_TAGS & set(getattr(op, "tags", ())))


def _static_shape(tensor: torch.Tensor) -> bool:
    return all(isinstance(d, int) for d in (*tensor.shape, *tensor.stride()))


def run_captured(gm: torch.fx.GraphModule, error: str | None = None) -> Callable:
    """Run Dynamo's graph as captured, and say so in the report (a graph of kind "eager").

    Without a C++ compiler, CPU graphs run this way (eager speed): decomposing them for ATen would
    only add ops. So does a graph aot_autograd fails on (``error``)."""
    graph_report = GraphReport(reports.next_graph_name(), "eager", "aten")
    graph_report.aten_ops = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    graph_report.error = error
    reports.record(graph_report)
    return gm.forward


def padded_outputs_from(kind: str) -> int | None:
    """The first output position that may return a padded matmul result (lowering/
    matmul_padding.py): every output of an inference graph; a forward graph's outputs saved for
    the backward when aot_autograd collects the forward's output strides (it gives them to the
    backward's inputs); None otherwise."""
    return 0 if kind == "inference" else relayout_outputs_from(kind)


def relayout_outputs_from(kind: str) -> int | None:
    """The first output position whose layout torchfuse may choose (``scheduler/reader_layout.py``):
    a forward graph's saved tensors, when aot_autograd collects the forward's output strides."""
    if kind == "forward" and getattr(TracingContext.try_get(), "output_strides", None) is not None:
        return saved_outputs_start(kind)
    return None


def _report_output_strides(state: CompileState) -> None:
    """Tell aot_autograd the strides of the outputs returned with other strides than traced,
    one entry per output (None: as traced), as Inductor does for its layout choices."""
    reported = getattr(TracingContext.try_get(), "output_strides", None)
    if reported is None or reported or state.report.kind != "forward":
        return  # not collected, or already reported (a fallback after the stages had run)
    output = next(n for n in reversed(state.gm.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    strides = dict(state.report.output_strides)
    if not strides:  # a fallback before the report was written: read the rewritten graph
        strides = padded_output_strides(state.gm)
    state.report.output_strides = strides
    reported.extend(strides.get(i) for i in range(len(values)))


def _run_stages_or_restore(state: CompileState) -> Callable:
    """Run the stages, or take their result from the graph cache (runtime/graph_cache.py)."""
    key = None
    if _graph_cache_applies(state):
        # Whether a padded matmul result may be returned changes the code of a graph that has one
        padded_from = padded_outputs_from(state.report.kind) if has_unaligned_matmul(state.gm) else None
        kind = state.report.kind + (f", padded outputs from {padded_from}" if padded_from is not None else "")
        relaid_from = relayout_outputs_from(state.report.kind)  # saved tensors may change layout
        kind += f", saved outputs relaid from {relaid_from}" if relaid_from is not None else ""
        key = graph_cache.graph_key(state.gm, kind, state.target, state.options)
        entry = graph_cache.lookup(key) if key is not None else None
        if entry is not None:
            started = time.perf_counter()
            _restore(state, entry)
            state.report.stage_seconds["graph cache"] = time.perf_counter() - started
            return state.call
    shape_env = shape_env_of(state.example_inputs)
    marks = graph_cache.shape_env_marks(shape_env)
    for name, stage in STAGES:
        started = time.perf_counter()
        stage(state)
        state.report.stage_seconds[name] = time.perf_counter() - started
        _dump(name, state)
    if key is not None:
        if graph_cache.shape_env_marks(shape_env) != marks:
            graph_cache.not_stored("the compile added shape guards")
        else:
            graph_cache.store(key, _cache_entry(state))
    return state.call


def _graph_cache_applies(state: CompileState) -> bool:
    dumping = state.options.dump or os.environ.get("TORCHFUSE_DUMP")
    return graph_cache.enabled() and state.target in ("cpp", "triton") and not dumping


def _cache_entry(state: CompileState) -> graph_cache.GraphEntry:
    constant_targets = {n.name: str(n.target) for n in state.gm.graph.nodes
                        if n.op == "get_attr" and n.name in state.graph.constants}
    report = copy.deepcopy(state.report)
    return graph_cache.GraphEntry(report.wrapper_source, dict(state.wrapper_constants), state.launched_kernels(),
                                  constant_targets, report, dict(state.predictions), dict(state.fixed_args))


# What a cache hit takes from the stored report: everything the stages would have written.
RESTORED_REPORT_FIELDS = ("kernels", "decisions", "fusions", "fallbacks", "fallback_reasons", "device_notes", "split_reductions",
                          "combined_launches", "ir_text",
                          "wrapper_source", "input_buffers", "output_buffers", "eager_bytes",
                          "output_strides")  # not binaries: _restore fills it


def _restore(state: CompileState, entry: graph_cache.GraphEntry) -> None:
    launchers = _load_launchers(entry.kernels, state.report.name)
    tensor_constants = {name: graph_cache.attribute(state.gm, target) for name, target in entry.constant_targets.items()}
    state.kernels, state.launchers, state.wrapper_constants = entry.kernels, launchers, entry.wrapper_constants
    state.predictions = entry.predictions
    _compile_ahead(state)
    state.fixed_args = getattr(entry, "fixed_args", {})  # absent from entries stored before it existed
    state.call = wrapper.bind_wrapper(entry.wrapper_source, entry.wrapper_constants, tensor_constants, launchers,
                                      state.report.name, state.ahead, _tuners(state), state.fixed_args)
    stored = copy.deepcopy(entry.report)
    for name in RESTORED_REPORT_FIELDS:
        setattr(state.report, name, getattr(stored, name))


def _load_launchers(kernels: dict, graph_name: str) -> dict:
    """What the wrapper calls for each rendered kernel: C++ kernels from one library for the
    graph, Triton kernels compiled for the GPU or, on CPU tensors, run by Triton's interpreter."""
    cpp_kernels = {n: k for n, k in kernels.items() if isinstance(k, CppKernel)}
    launchers = cpp_build.load_graph_kernels(cpp_kernels, graph_name)
    for name, kernel in kernels.items():
        if not isinstance(kernel, CppKernel):
            launchers[name] = kernel_cache.load_kernel(kernel.source, kernel.function, kernel.device != "cuda")
    return launchers


def _run_with_aten(gm: torch.fx.GraphModule, output_strides: dict[int, tuple] | None = None) -> Callable:
    """Run the FX graph with ATen; the outputs at the positions of ``output_strides`` are given
    those strides (what aot_autograd was already told)."""
    def call(args: list) -> Any:
        values = list(args)
        args.clear()
        outputs = gm(*values)
        if not output_strides:
            return outputs
        outputs = list(outputs)
        for position, strides in output_strides.items():
            tensor = outputs[position]
            outputs[position] = wrapper.ensure_layout(tensor, tuple(tensor.shape), tuple(strides))
        return outputs

    return call


def _fallback_output_strides(state: CompileState) -> dict[int, tuple]:
    """The strides the ATen fallback must give its outputs. Strides already reported to
    aot_autograd are a promise (the backward is compiled for them); when none were, only the
    padded matmul results of the rewritten graph differ from eager's, and the report says so."""
    reported = getattr(TracingContext.try_get(), "output_strides", None)
    if reported:
        return {position: strides for position, strides in enumerate(reported) if strides is not None}
    state.report.output_strides = padded_output_strides(state.gm)
    return {}


def _checked(call: Callable, gm: torch.fx.GraphModule, name: str) -> Callable:
    """Run the graph with ATen too and compare every output (the ``check`` option)."""

    def run(args: list) -> Any:
        values = list(args)
        expected = gm(*values)
        actual = call(list(values))
        args.clear()
        for position, (a, e) in enumerate(zip(actual, expected)):
            if isinstance(e, torch.Tensor) and not _matches(a, e):
                raise AssertionError(f"torchfuse {name}: output {position} differs from ATen "
                                     f"(max abs diff {(a.double() - e.double()).abs().max().item():.3g})")
        return actual

    return run


def _matches(actual: Any, expected: torch.Tensor) -> bool:
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if not expected.is_floating_point():
        return torch.equal(actual, expected)
    tol = 1e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-4
    return torch.allclose(actual.double(), expected.double(), rtol=tol, atol=tol, equal_nan=True)


def _dump(stage: str, state: CompileState) -> None:
    wanted = set(state.options.dump) | set(filter(None, os.environ.get("TORCHFUSE_DUMP", "").split(",")))
    if stage in wanted:
        print(f"===== torchfuse {state.report.name} stage {stage} "
              f"({state.report.stage_seconds.get(stage, 0) * 1000:.1f} ms) =====")
        print(_stage_text(stage, state))


def _stage_text(stage: str, state: CompileState) -> str:
    if stage == "aten":
        return state.gm.code
    if stage == "ir":
        return format_graph(state.graph)
    if stage == "schedule":
        return "\n".join(str(k) for k in state.report.kernels) + "\n" + "\n".join(str(d) for d in state.plan.decisions)
    if stage == "kernels":
        return "\n\n".join(k.source or "" for k in state.report.kernels if k.source)
    return state.report.wrapper_source


# -- the stages -------------------------------------------------------------------------------
def stage_aten(state: CompileState) -> None:
    """The input graph, as aot_autograd gave it (nothing to do but dump it)."""


def stage_lower(state: CompileState) -> None:
    share_casts_of_views(state.gm)  # cast(view(x)) beside cast(x): one cast, viewed
    # CUDA 16-bit matmuls only: operands with unaligned rows get zero-padded copies, results with
    # unaligned rows padded strides (an inference graph returns such a result without copying it)
    pad_unaligned_operands(state.gm)
    pad_unaligned_matmuls(state.gm, padded_from=padded_outputs_from(state.report.kind))
    state.report.output_strides = padded_output_strides(state.gm)
    if state.target == "triton":  # ATen adds a cuDNN convolution's bias with a kernel of its own
        split_convolution_bias(state.gm)
    if state.target == "cpp":  # measured on CPUs only so far (see docs/decisions.md)
        split_bias_into_pointwise_users(state.gm)
        if state.report.kind == "inference":  # a forward graph's saved tensors keep their layouts
            convolutions_channels_last(state.gm)
    # With deterministic algorithms on, GPU kernels must not add with atomics (their order varies):
    # those scatters stay ATen's deterministic kernels. C++ scatters add in a fixed order.
    unordered_adds = not (state.target == "triton" and torch.are_deterministic_algorithms_enabled())
    state.graph = lower(state.gm, state.report.name, unordered_adds)
    # Buffers read through a permuted view are stored the way their readers walk them; a forward
    # graph's saved tensors among them are reported to aot_autograd with their new strides.
    state.report.device_notes = place_on_one_device(state.graph)
    if state.target == "triton":
        # Reductions with too few outputs to fill a GPU become two stages (codegen/triton/split.py):
        # those Triton renders, i.e. CUDA nodes, or every node when only the interpreter runs.
        cuda = any(getattr(n, "device", None) is not None and n.device.type == "cuda" for n in state.graph.nodes)
        state.report.split_reductions = split_reductions(state.graph, {"cuda"} if cuda else {"cpu"})
    state.report.fallbacks = list(state.graph.fallbacks)
    state.report.fallback_reasons = dict(state.graph.fallback_reasons)
    state.report.ir_text = format_graph(state.graph)


def stage_schedule(state: CompileState) -> None:
    # Stored buffers take the layout their readers walk (scheduler/reader_layout.py); a forward
    # graph's saved tensors among them are reported to aot_autograd with their new strides. ATen
    # runs the FX graph instead: its outputs keep eager's layouts.
    movable = relayout_outputs_from(state.report.kind) if state.target != "aten" else None
    state.plan = scheduling.schedule(state.graph, movable_outputs_from=movable)
    state.report.output_strides = {**state.report.output_strides, **state.plan.relaid_outputs}
    check_one_device(state.plan.kernels, state.graph.buffers)
    state.report.decisions = [d for d in state.plan.decisions if not d.fused]
    state.report.fusions = [d for d in state.plan.decisions if d.fused]
    # Bytes each kernel moves against eager's, for the report (sizes at the example inputs).
    traffic = TrafficCounter(state.graph, state.plan.kernels, shape_env_of(state.example_inputs))
    state.report.eager_bytes = traffic.graph_eager_bytes()
    state.report.input_buffers = [b.name for b in state.graph.inputs]
    state.report.output_buffers = [o.buffer for o in state.graph.outputs if o.buffer is not None]
    for item in state.plan.items:
        if isinstance(item, FusedKernel):
            moved = traffic.fused(item)
            # A scatter is a pointwise kernel over its source that adds into its output: the
            # public kinds stay {"pointwise", "reduction", "extern"} (design.md).
            kind, accumulates = ("pointwise", True) if item.kind == "scatter" else (item.kind, False)
            kernel = KernelReport(item.name, kind, item.origins, accumulates=accumulates)
        else:
            moved = traffic.extern(item.node)
            kernel = KernelReport(item.name, "extern", [str(item.node.target)])
        kernel.reads, kernel.writes, kernel.eager_bytes = moved.reads, moved.writes, moved.eager_bytes
        state.report.kernels.append(kernel)


def stage_kernels(state: CompileState) -> None:
    if state.target == "aten":
        return
    if state.target == "cpp":
        _cpp_kernels(state, state.plan.kernels)
        return

    def hint(expr) -> int:
        try:
            return size_hint(expr, None)
        except (ValueError, TypeError):
            return 0  # symbolic: choose code that works for every size

    # In a GPU graph, kernels over CPU tensors (shape arithmetic before a .to("cuda")) are
    # built for the CPU; in a graph of CPU tensors alone (tests) Triton's interpreter runs all.
    on_gpu = any(k.device.type == "cuda" for k in state.plan.kernels)
    builds_cpu = on_gpu and cpp_build.compiler_available()
    on_cpu = [k for k in state.plan.kernels if k.device.type == "cpu"] if builds_cpu else []
    _cpp_kernels(state, on_cpu)
    by_name = {k.name: k for k in state.report.kernels}
    for kernel in state.plan.kernels:
        if kernel in on_cpu:
            state.report.device_notes.append(f"{kernel.name} runs on the CPU (C++): its tensors are CPU tensors")
            continue
        rendered = render_triton_kernel(kernel, state.graph.buffers, hint)
        state.kernels[kernel.name] = rendered
        by_name[kernel.name].source = kernel_cache.module_source(rendered.source)
        for scalar in rendered.scalar_args:
            state.report.device_notes.append(f"{kernel.name} receives {scalar} (a 0-d CPU tensor) by value, as eager does")
    _combine_launches(state)
    launched = state.launched_kernels()
    state.launchers.update(_load_launchers({n: k for n, k in launched.items() if n not in state.launchers},
                                           state.report.name))
    if on_gpu:
        state.predictions = predict_launches(state.graph, state.plan, launched, state.example_inputs)
        _compile_ahead(state)


def _combine_launches(state: CompileState) -> None:
    """Small independent pointwise kernels run as one launch (codegen/triton/combo.py), unless
    ``TORCHFUSE_COMBINE_LAUNCHES=0``; the report lists each combined launch's kernels."""
    if os.environ.get("TORCHFUSE_COMBINE_LAUNCHES", "1") == "0":
        return
    items, groups, combined = combo.combine_launches(state.plan.items, state.kernels, state.plan.in_place)
    state.plan.items, state.plan.launch_groups = items, groups
    state.kernels.update(combined)
    state.report.combined_launches = {name: list(parts) for name, parts in groups.items()}


def _compile_ahead(state: CompileState) -> None:
    """Start compiling the GPU kernels' predicted launches in the worker pool (triton_ahead.py);
    the wrapper's launchers get their loaders. The report says what each kernel got."""
    if not state.predictions:
        return
    configs = None
    if state.options.autotune:  # the candidates (or the choice on disk), compiled ahead with the rest
        configs = autotune.configs_to_compile(_tunable(state.kernels), state.predictions, triton_ahead.default_config)
    state.ahead = triton_ahead.compile_ahead(state.kernels, state.launchers, state.predictions, configs=configs)
    for name, prediction in state.predictions.items():
        if name in state.ahead:
            state.report.binaries[name] = "compiled ahead"
        elif isinstance(prediction, Unpredicted):
            state.report.binaries[name] = f"at its first launch: {prediction.reason}"
        else:
            state.report.binaries[name] = "at its first launch: compiling ahead was not possible (no GPU, or off)"


def _cpp_kernels(state: CompileState, kernels: list) -> None:
    """These kernels in one C++ translation unit: one compiler call, cached on disk."""
    if not kernels:
        return
    rendered, launchers = cpp_build.build_graph_kernels(kernels, state.graph.buffers, state.report.name)
    state.kernels.update(rendered)
    state.launchers.update(launchers)
    by_name = {k.name: k for k in state.report.kernels}
    for name, kernel in rendered.items():
        by_name[name].source = kernel.source


def stage_wrapper(state: CompileState) -> None:
    if state.target == "aten":
        state.call = _run_with_aten(state.gm)
        return
    call, source, constants, fixed_args = wrapper.build_wrapper(state.graph, state.plan, state.kernels,
                                                                state.launchers, state.ahead, _tuners(state))
    state.report.wrapper_source = source
    state.wrapper_constants, state.fixed_args = constants, fixed_args
    state.call = call


def _tuners(state: CompileState) -> dict[str, autotune.KernelTuner] | None:
    """Under autotuning, a tuner per Triton kernel, recording its choices in the graph's report."""
    if not state.options.autotune:
        return None

    def record(choice: autotune.Choice) -> None:
        state.report.autotune.append(_autotune_entry(choice))

    return {name: autotune.KernelTuner(name, kernel, record) for name, kernel in _tunable(state.kernels).items()}


def _tunable(kernels: dict) -> dict[str, TritonKernel]:
    """The Triton kernels autotuning may time: not combined launches (``TritonKernel.parts``)."""
    return {name: kernel for name, kernel in kernels.items() if isinstance(kernel, TritonKernel) and not kernel.parts}


def _autotune_entry(choice: autotune.Choice) -> AutotuneEntry:
    timings = dict(choice.timings)
    us = lambda seconds: None if seconds is None else seconds * 1e6  # noqa: E731
    return AutotuneEntry(choice.kernel, f"{choice.xnumel} x {choice.rnumel}", autotune.describe(choice.config),
                         autotune.describe(choice.default), choice.how, us(timings.get(choice.config)),
                         us(timings.get(choice.default)), len(choice.timings), choice.seconds)


def _note_untuned_cpp_kernels(state: CompileState) -> None:
    """Autotuning has nothing to tune in C++ kernels: say so in the report, and once per process."""
    cpp = [name for name, kernel in state.kernels.items() if isinstance(kernel, CppKernel)]
    if not state.options.autotune or not cpp:
        return
    why = "not tuned: C++ kernels (CPU tensors) keep their fixed loops"
    state.report.autotune += [AutotuneEntry(name, "", "", "", why) for name in cpp]
    cpp_build.warn_once("torchfuse: autotuning (mode='max-autotune') tunes Triton kernels for GPUs only; "
                        "C++ kernels for CPU tensors run as in the default mode")


STAGES: list[tuple[str, Callable[[CompileState], None]]] = [
    ("aten", stage_aten),
    ("ir", stage_lower),
    ("schedule", stage_schedule),
    ("kernels", stage_kernels),
    ("wrapper", stage_wrapper),
]
