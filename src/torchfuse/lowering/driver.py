"""The generic lowering loop: walk the ATen FX graph once and apply one rule per op."""
from __future__ import annotations

from typing import Any

import operator

import sympy
import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from torchfuse.frontend.symbolic import constant_value, is_symbolic, offset_of, shape_of, strides_of, to_sympy
from torchfuse.ir.expr import Const
from torchfuse.ir.graph import Buffer, Extern, ExternArg, Graph, GraphOutput, Pointwise, Reduction
from torchfuse.ir.symbols import PyFloorDiv, PyMod
from torchfuse.lowering import registry
from torchfuse.lowering import rules  # noqa: F401  (importing it registers every rule)
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.extern import lower_extern
from torchfuse.lowering.values import TensorValue


def lower(gm: torch.fx.GraphModule, name: str = "graph", unordered_adds: bool = True) -> Graph:
    """Lower an ATen-level FX graph into an ``ir.Graph``.

    Args:
        gm: a graph from aot_autograd whose nodes carry ``meta['val']`` (fake tensors).
        name: a name for reports.
        unordered_adds: whether accumulating scatters may add in a varying order (GPU atomics);
            False keeps them ATen calls (deterministic algorithms on the Triton target).
    Returns:
        The loop-level graph. Ops without a rule become Extern calls, listed in ``fallbacks``
        (with the rule's reason in ``fallback_reasons`` when it gave one).
    """
    graph = Graph(name=name)
    ctx = LoweringContext(graph, unordered_adds)
    env: dict[torch.fx.Node, Any] = {}
    placeholder_position = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = _lower_placeholder(ctx, node, placeholder_position)
            placeholder_position += 1
        elif node.op == "call_function":
            ctx.current_origin = _op_name(node.target)
            env[node] = _lower_call(ctx, node, env)
        elif node.op == "output":
            graph.outputs = [_lower_output(ctx, out, env) for out in _flatten_outputs(node.args[0])]
        elif node.op == "get_attr":
            env[node] = _lower_constant(ctx, node.name, getattr(gm, node.target))
    return graph


def _op_name(target: Any) -> str:
    return str(getattr(target, "_name", None) or getattr(target, "__name__", target)).replace("aten::", "aten.")


def _lower_placeholder(ctx: LoweringContext, node: torch.fx.Node, position: int) -> Any:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        buffer = Buffer(node.name, shape_of(value), value.dtype, value.device, strides_of(value), offset_of(value))
        ctx.graph.inputs.append(buffer)
        ctx.add_buffer(buffer)
        for dim, size in enumerate(buffer.shape):
            if isinstance(size, sympy.Symbol):
                ctx.graph.size_sources.setdefault(size, (position, dim))
        return TensorValue.of_buffer(node.name, buffer.shape, value.dtype, value.device)
    # A SymInt (or plain int) input: the wrapper reads its value from the argument list.
    ctx.graph.inputs.append(Buffer(node.name, (), torch.int64, torch.device("cpu"), ()))
    expr = to_sympy(value) if value is not None else None
    if isinstance(expr, sympy.Symbol):
        ctx.graph.size_sources[expr] = (position, None)
    return expr


def _lower_constant(ctx: LoweringContext, name: str, tensor: torch.Tensor) -> TensorValue:
    """A tensor the graph holds (a lifted constant): a scalar is inlined, else a buffer."""
    if tensor.dim() == 0:
        value = constant_value(tensor)
        return ctx.pointwise((), tensor.dtype, tensor.device, lambda idx: Const(tensor.dtype, value))
    buffer = Buffer(name, shape_of(tensor), tensor.dtype, tensor.device, strides_of(tensor), offset_of(tensor))
    ctx.add_buffer(buffer)
    ctx.graph.constants[name] = tensor
    return TensorValue.of_buffer(name, buffer.shape, tensor.dtype, tensor.device)


def _lower_call(ctx: LoweringContext, node: torch.fx.Node, env: dict) -> Any:
    if node.target is operator.getitem:
        container = env[node.args[0]]
        return container[node.args[1]]
    if node.target in SIZE_ARITHMETIC:
        args = _symints_to_sympy(torch.fx.node.map_arg(node.args, lambda n: env[n]))
        return SIZE_ARITHMETIC[node.target](*[sympy.sympify(a) for a in args])
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    args, kwargs = _symints_to_sympy(args), _symints_to_sympy(kwargs)
    # Kernels have no complex arithmetic: an op touching complex tensors runs as ATen (exact).
    rule = None if _touches_complex(node) else registry.lookup(node.target)
    if rule is not None:
        ctx.fallback_reason = None
        nodes_before = len(ctx.graph.nodes)
        result = rule(ctx, node, *args, **kwargs)
        if result is not NotImplemented:
            _adopt_eager_layout(ctx, node, result, nodes_before)
            return result
        if ctx.fallback_reason:
            ctx.graph.fallback_reasons[_op_name(node.target)] = ctx.fallback_reason
    ctx.graph.fallbacks.append(_op_name(node.target))
    return lower_extern(ctx, node, args, kwargs)


def _adopt_eager_layout(ctx: LoweringContext, node: torch.fx.Node, result: Any, nodes_before: int) -> None:
    """Lay out a buffer this rule just made as eager's result is (when dense): an intermediate
    that stays a buffer (read by two kernels) is then read in its inputs' layout. Row-major by
    default, a channels-last batch norm's gradient was written NCHW, and every reduction over
    it read strided."""
    meta = node.meta.get("val")
    if not isinstance(result, TensorValue) or not isinstance(meta, torch.Tensor) or meta.layout != torch.strided:
        return
    new = ctx.graph.nodes[nodes_before:]
    made_here = any(n.name == result.buffer and isinstance(n, (Pointwise, Reduction)) for n in new)
    read_by_extern = any(isinstance(n, Extern) and result.buffer in n.reads() for n in new)
    if made_here and not read_by_extern and result.is_identity and result.shape == ctx.graph.buffers[result.buffer].shape:
        ctx.relayout(result, strides_of(meta))


def _touches_complex(node: torch.fx.Node) -> bool:
    values = [node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in tree_leaves(values))


# Arithmetic on sizes (SymInts) that Dynamo records as graph nodes, evaluated symbolically.
SIZE_ARITHMETIC = {
    operator.add: lambda a, b: a + b,
    operator.sub: lambda a, b: a - b,
    operator.mul: lambda a, b: a * b,
    # Python semantics: the operands may be negative ((n - 3) % n); PyMod/PyFloorDiv become
    # ModIndex/FloorDiv themselves where the base is provably non-negative.
    operator.floordiv: PyFloorDiv,
    operator.mod: PyMod,
    operator.neg: lambda a: -a,
    torch.sym_max: sympy.Max,
    torch.sym_min: sympy.Min,
}


def _symints_to_sympy(value: Any) -> Any:
    if is_symbolic(value):
        return to_sympy(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_symints_to_sympy(v) for v in value)
    if isinstance(value, dict):
        return {k: _symints_to_sympy(v) for k, v in value.items()}
    return value


def _flatten_outputs(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _lower_output(ctx: LoweringContext, out: Any, env: dict) -> GraphOutput:
    if not isinstance(out, torch.fx.Node):
        return GraphOutput(None, constant=out)
    value = env[out]
    if not isinstance(value, TensorValue):
        return GraphOutput(None, constant=value)
    meta = out.meta.get("val")
    if ctx.is_whole_free_buffer(value) and isinstance(meta, torch.Tensor):
        ctx.adopt_traced_layout(value, strides_of(meta))  # eager's layout: a transposed result stays so
        buffer = ctx.graph.buffers[value.buffer]
        return GraphOutput(value.buffer, buffer.shape, buffer.strides)
    arg = ctx.extern_arg(value)  # a strided view of an existing buffer, or a copy
    return GraphOutput(arg.buffer, arg.shape, arg.strides, arg.offset)
