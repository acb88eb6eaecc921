"""Predict each Triton launch of a graph before it runs, so its binary can be compiled ahead.

With static shapes the wrapper's launches are fixed when the graph compiles: the sizes, hence the
block sizes (``launch_configs.pointwise_config`` / ``reduction_config``), the dtype of every pointer and,
nearly always, whether it is 16-byte aligned, which is what Triton specializes a pointer on:

- buffers the wrapper allocates, or reuses whole, start where their allocation does (aligned);
- graph inputs, and kernels writing a mutated input in place, as the example input's storage
  offset says (the allocation itself is aligned);
- tensor constants as their real address says;
- results of ATen calls are assumed aligned (fresh allocations; a view with an odd offset would
  be mispredicted, and that launch compiles through Triton as before).

What cannot be predicted is left to Triton at the first launch, with the reason: symbolic sizes
(``dynamic=True``), and integer CPU scalars passed by value, whose value decides Triton's
specialization. A wrong prediction costs a compile, never a wrong binary: the launcher keys
every launch by the real arguments (``launch.Launcher``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy
import torch

from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.ir.graph import Graph
from torchfuse.runtime.launch import PointerArg
from torchfuse.scheduler.schedule import Schedule


@dataclass(frozen=True)
class PredictedLaunch:
    """One launch as the wrapper will make it: sizes and the class of every argument."""

    xnumel: int
    rnumel: int  # 0 for pointwise kernels
    args: tuple[Any, ...]  # PointerArg for tensors, the value for scalars, in argument order


@dataclass(frozen=True)
class Unpredicted:
    """A kernel whose launch is left to Triton's first-launch compile, and why."""

    reason: str


def predict_launches(graph: Graph, plan: Schedule, kernels: dict[str, Any],
                     example_inputs: list[Any]) -> dict[str, PredictedLaunch | Unpredicted]:
    """The launch of every GPU Triton kernel in ``kernels`` (by kernel name).

    Args:
        graph: the lowered graph (buffers, inputs, constants).
        plan: its schedule (which kernels write a mutated input in place).
        kernels: rendered kernels by name; C++ kernels and interpreter kernels are skipped.
        example_inputs: the graph's example inputs (fake tensors), in ``graph.inputs`` order.
    """
    alignment = _input_alignment(graph, plan, example_inputs)
    predictions: dict[str, PredictedLaunch | Unpredicted] = {}
    for name, kernel in kernels.items():
        if isinstance(kernel, TritonKernel) and kernel.device == "cuda":
            predictions[name] = _predict(kernel, graph, alignment)
    return predictions


def _predict(kernel: TritonKernel, graph: Graph, alignment: dict[str, bool]) -> PredictedLaunch | Unpredicted:
    xnumel = sympy.sympify(kernel.xnumel)
    rnumel = sympy.sympify(kernel.rnumel) if kernel.kind == "reduction" else sympy.Integer(0)
    if kernel.size_args or not (xnumel.is_Integer and rnumel.is_Integer):
        return Unpredicted("symbolic sizes: block sizes and integer classes are known only at the first launch")
    if int(xnumel) <= 0:
        return Unpredicted("empty: never launched")
    args: list[Any] = []
    for name in kernel.pointer_args:
        args.append(PointerArg(graph.buffers[name].dtype, alignment.get(name, True)))
    for name in kernel.scalar_args:
        dtype = graph.buffers[name].dtype
        if dtype == torch.bool:
            args.append(True)
        elif dtype.is_floating_point:
            args.append(0.5)  # any float: Triton passes every Python float as fp32, unspecialized
        else:
            return Unpredicted(f"integer CPU scalar {name}: Triton specializes on its value (1, multiple of 16)")
    args += kernel.int_args
    return PredictedLaunch(int(xnumel), int(rnumel), tuple(args))


def _input_alignment(graph: Graph, plan: Schedule, example_inputs: list[Any]) -> dict[str, bool]:
    """Buffers whose alignment is not simply "allocated here": inputs, in-place targets, constants."""
    aligned: dict[str, bool] = {}
    for buffer, example in zip(graph.inputs, example_inputs):
        if isinstance(example, torch.Tensor):
            aligned[buffer.name] = (example.storage_offset() * example.element_size()) % 16 == 0
    for written, target in plan.in_place.items():
        aligned[written] = aligned.get(target, True)
    for name, tensor in graph.constants.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda":
            aligned[name] = tensor.data_ptr() % 16 == 0
    return aligned
