"""An ATen graph from AOTAutograd as plain data that pickles, and back.

The warm cache (``aot_cache.py``) keeps the forward and backward graphs AOTAutograd handed to
the pipeline, so that a later process can hand the same graphs to the pipeline again without
tracing. A ``GraphSnapshot`` holds what the pipeline reads of a graph: every node (op, name,
target, arguments), each node's ``meta['val']`` as a ``TensorSpec`` (shape, strides, storage
offset, dtype, device, requires_grad), its ``stack_trace``, the values of tensor constants and the
example inputs. ``rebuild`` makes a GraphModule whose nodes carry fake tensors of exactly those
layouts, so the pipeline's graph cache (``runtime/graph_cache.py``), which keys on the same
facts, finds the graph compiled before.

Static shapes only: a symbolic size, a higher-order op, a tensor subclass or an argument of a
type not listed here raises ``Uncacheable`` with the reason, and the graph is not cached.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule


class Uncacheable(Exception):
    """The warm cache cannot describe this graph; the message is the reason, counted in the report."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: str
    requires_grad: bool


@dataclass(frozen=True)
class NodeRef:
    name: str


@dataclass(frozen=True)
class OpRef:
    """An ATen op by name (``aten::add``, overload ``Tensor``), or a function of ``FUNCTIONS``."""
    qualified_name: str
    overload: str | None


@dataclass(frozen=True)
class NodeSpec:
    op: str
    name: str
    target: Any  # str (placeholder, get_attr, output) or OpRef
    args: Any
    kwargs: Any
    val: Any  # TensorSpec, nested tuples/lists of them, numbers, None
    stack_trace: str | None


@dataclass(frozen=True)
class GraphSnapshot:
    nodes: tuple[NodeSpec, ...]
    constants: dict[str, torch.Tensor]  # get_attr target -> tensor
    example_inputs: tuple[Any, ...]  # TensorSpec, int, float, bool or None per input

    def rebuild(self, fake_mode: FakeTensorMode) -> tuple[torch.fx.GraphModule, list[Any]]:
        """The graph again, with fake tensors of ``fake_mode`` as its values and example inputs."""
        graph = torch.fx.Graph()
        env: dict[str, torch.fx.Node] = {}
        for spec in self.nodes:
            target = _resolve_target(spec.target)
            args, kwargs = _decode(spec.args, env), _decode(spec.kwargs, env)
            node = graph.create_node(spec.op, target, args, kwargs, name=spec.name)
            if node.name != spec.name:
                raise ValueError(f"node {spec.name} came back as {node.name}")
            if spec.val is not None:
                node.meta["val"] = _fake(spec.val, fake_mode)
            if spec.stack_trace is not None:
                node.meta["stack_trace"] = spec.stack_trace
            env[spec.name] = node
        root = torch.nn.Module()
        for target, tensor in self.constants.items():
            _set_attribute(root, target, tensor)
        # Lazy: its Python code is generated only if it ever runs (a graph run with ATen).
        gm = _LazyGraphModule(root, graph)
        return gm, [_fake(x, fake_mode) for x in self.example_inputs]


def snapshot(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> GraphSnapshot:
    """``gm`` and its example inputs as a GraphSnapshot, or ``Uncacheable`` with the reason."""
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "get_attr", "call_function", "output"):
            raise Uncacheable(f"ATen graph has a {node.op} node")
        if node.op == "get_attr":
            value = _attribute(gm, node.target)
            if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
                raise Uncacheable(f"ATen graph holds a {type(value).__name__} attribute")
            constants[node.target] = value
        nodes.append(NodeSpec(node.op, node.name, _encode_target(node), _encode(node.args), _encode(node.kwargs),
                              _value_spec(node.meta.get("val")), node.meta.get("stack_trace")))
    return GraphSnapshot(tuple(nodes), constants, tuple(_value_spec(x) for x in example_inputs))


# Python functions an ATen graph may call besides ATen ops (multi-output ops' results).
FUNCTIONS = {"operator.getitem": operator.getitem}


def _encode_target(node: torch.fx.Node) -> Any:
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return OpRef(target._schema.name, target._overloadname)
    for name, function in FUNCTIONS.items():
        if target is function:
            return OpRef(name, None)
    raise Uncacheable(f"ATen graph calls {getattr(target, '__name__', type(target).__name__)}")


def _resolve_target(target: Any) -> Any:
    if not isinstance(target, OpRef):
        return target
    if target.overload is None:
        return FUNCTIONS[target.qualified_name]
    namespace, name = target.qualified_name.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), name), target.overload)


# Argument values that stand for themselves (and pickle as themselves).
PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return NodeRef(value.name)
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, PLAIN) and not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    raise Uncacheable(f"ATen graph has an argument of type {type(value).__name__}")


def _decode(value: Any, env: dict[str, torch.fx.Node]) -> Any:
    if isinstance(value, NodeRef):
        return env[value.name]
    if isinstance(value, (list, tuple)):
        items = [_decode(v, env) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _decode(v, env) for k, v in value.items()}
    return value


def _value_spec(value: Any) -> Any:
    """A node's value or an example input as plain data (fake tensors as TensorSpec)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("symbolic sizes")
    if isinstance(value, torch.Tensor):
        if type(value) not in (FakeTensor, torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
            raise Uncacheable(f"a {type(value).__name__} ({value.layout}) value")
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if not all(isinstance(s, int) for s in sizes):
            raise Uncacheable("symbolic sizes")
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype,
                          str(value.device), value.requires_grad)
    if isinstance(value, (list, tuple)):
        items = [_value_spec(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if value is None or isinstance(value, (int, float, bool)):
        return value
    raise Uncacheable(f"a value of type {type(value).__name__}")


def _fake(value: Any, fake_mode: FakeTensorMode) -> Any:
    if isinstance(value, TensorSpec):
        # A meta tensor of that layout made fake directly: dispatching the factory through the
        # fake mode costs twice as much, thousands of times in a large graph.
        if value.offset == 0:
            meta = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device="meta")
        else:
            extent = sum((size - 1) * stride for size, stride in zip(value.shape, value.stride) if size > 0)
            base = torch.empty(value.offset + extent + 1, dtype=value.dtype, device="meta")
            meta = base.as_strided(value.shape, value.stride, value.offset)
        tensor = fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, meta, torch.device(value.device))
        return tensor.requires_grad_(True) if value.requires_grad else tensor
    if isinstance(value, (list, tuple)):
        items = [_fake(v, fake_mode) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _attribute(module: torch.nn.Module, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _set_attribute(root: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, name = target.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    setattr(module, name, value)
