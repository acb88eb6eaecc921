"""The warm cache's key: everything AOTAutograd's result depends on, as text.

``key_parts(gm, args, aot_config)`` describes, from Dynamo's captured graph and AOTAutograd's
fake inputs:

- the graph: every node's op, name, target, arguments, ``stack_trace`` and any other metadata
  that reaches AOTAutograd (activation-checkpoint tags, custom annotations), and the values of its
  tensor constants. A node must call ATen or torch itself (torch's own Python or C functions,
  whose behaviour its version fixes) or torchfuse (whose source is in the key): a call of user
  code (``allow_in_graph``), a custom op, a higher-order op (its subgraph) or a submodule makes
  the graph ``Uncacheable``;
- every input: its type, shape, strides, storage offset, dtype, device, requires_grad, whether it
  is a leaf, a view, an inference tensor, a parameter, and which earlier input it is or shares
  memory with (AOTAutograd dedupes inputs and builds synthetic bases from aliasing ones);
- AOTAutograd's own configuration (``aot_config``: parameters count, static inputs, ...);
- the global state tracing reads: grad mode, inference mode, autocast per device, deterministic
  algorithms, the default dtype, the attention and cuDNN flags, the GPUs' names and capabilities,
  torch.backends flags, functorch's and Dynamo's configuration;
- torch's version and build, Python's version.

Static shapes only (a symbolic size is ``Uncacheable``), and torchfuse's own part (its source,
options, environment, machine) comes from the caller.
"""
from __future__ import annotations

import builtins
import hashlib
import sys
import types
from dataclasses import fields, is_dataclass
from typing import Any, Iterator

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from torchfuse.frontend.aot_snapshot import Uncacheable

FORMAT = "torchfuse-aot-key-1"
# ATen op namespaces whose ops a version of torch fixes (a custom op's code can change).
OP_NAMESPACES = frozenset({"aten", "prims"})
# Modules of C functions that a version of torch (or Python) fixes.
BUILTIN_MODULES = ("torch", "_operator", "operator", "math", "builtins", "_functools")
# Node metadata that never reaches AOTAutograd's result (or is described apart).
IGNORED_META = frozenset({"example_value", "val", "grapharg", "tensor_dict", "nn_module_stack", "source_fn_stack",
                          "stack_trace", "from_node", "seq_nr", "creation_timestamp", "tensor_meta",
                          "_dynamo_source", "is_wrapped"})
# AOTConfig fields that are callables or per-compile identities, not configuration.
IGNORED_AOT_CONFIG = frozenset({"fw_compiler", "bw_compiler", "inference_compiler", "partition_fn", "decompositions",
                                "aot_id", "cache_info", "precompile_backend_id"})


def key_parts(gm: torch.fx.GraphModule, args: list[Any], aot_config: Any) -> Iterator[str]:
    """The key's parts, or ``Uncacheable`` with the reason this graph cannot have a key."""
    yield FORMAT
    yield f"torch {torch.__version__} {torch.version.git_version} python {sys.version}"
    yield from global_state()
    yield from _aot_config(aot_config)
    yield from _graph(gm)
    yield from _inputs(args)


# -- the captured graph ----------------------------------------------------------------------
def _graph(gm: torch.fx.GraphModule) -> Iterator[str]:
    for name, child in gm.named_children():
        raise Uncacheable(f"the captured graph holds a submodule ({name}: {type(child).__name__})")
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise Uncacheable("the captured graph calls a module")
        meta = sorted((k, _canonical(v, f"node metadata {k!r}")) for k, v in node.meta.items() if k not in IGNORED_META)
        yield "|".join((node.op, node.name, _target(node.target), _argument(node.args), _argument(node.kwargs),
                        str(node.meta.get("stack_trace") or ""), repr(meta)))
        if node.op == "get_attr":
            yield _constant(gm, node.target)


def _target(target: Any) -> str:
    """The name of what a node calls, when a version of torch fixes what it does."""
    if isinstance(target, str):
        return target  # a method name, or a placeholder / get_attr / output target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace = str(target).split(".")[0]
        if namespace not in OP_NAMESPACES:
            raise Uncacheable(f"the captured graph calls the custom op {target}")
        return f"op:{target}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        raise Uncacheable(f"the captured graph calls the higher-order op {target.__name__}")
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    torch_code = module == "torch" or module.startswith("torch.")
    c_function = isinstance(target, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType,
                                     types.WrapperDescriptorType))
    if torch_code or (c_function and module.split(".")[0] in BUILTIN_MODULES) or target in vars(builtins).values():
        return f"{module}.{name}"
    if module == "torchfuse" or module.startswith("torchfuse."):
        # torchfuse's own rewrites (SDPA -> frontend.attention.fused_attention): its source is
        # part of every key (aot_store.key_text), so the name fixes what the call does.
        return f"{module}.{name}"
    raise Uncacheable(f"the captured graph calls {module}.{name}")


def _argument(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_argument(v) for v in value)
        return f"{type(value).__name__}[{inner}]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_argument(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({_argument(value.start)},{_argument(value.stop)},{_argument(value.step)})"
    if isinstance(value, torch.Tensor):
        raise Uncacheable("the captured graph has a tensor argument")
    if callable(value) and not isinstance(value, type):
        return _target(value)
    return _canonical(value, "an argument")


def _constant(gm: torch.fx.GraphModule, target: str) -> str:
    """A tensor constant's layout and a digest of its bytes (tracing may read its value)."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise Uncacheable(f"the captured graph holds a {type(value).__name__} attribute")
    data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype, as bytes
    digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    return f"constant {target} {_tensor(value)} {digest}"


# -- the inputs ------------------------------------------------------------------------------
def _inputs(args: list[Any]) -> Iterator[str]:
    storages: dict[Any, int] = {}
    for position, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            first_same = next((i for i, other in enumerate(args[:position]) if other is value), None)
            storage = StorageWeakRef(value.untyped_storage())
            shares = storages.setdefault(storage, position)
            yield f"input {position}: {_tensor(value)} same={first_same} shares={shares}"
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Uncacheable("symbolic sizes")
        elif value is None or isinstance(value, (bool, int, float)):
            yield f"input {position}: {type(value).__name__} {value!r}"
        else:
            raise Uncacheable(f"an input of type {type(value).__name__}")


def _tensor(value: torch.Tensor) -> str:
    sizes = (*value.shape, *value.stride(), value.storage_offset())
    if not all(isinstance(s, int) for s in sizes):
        raise Uncacheable("symbolic sizes")
    if value.layout != torch.strided:
        raise Uncacheable(f"a {value.layout} tensor")
    if value.is_quantized or value.is_nested:
        raise Uncacheable("a quantized or nested tensor")
    return (f"{type(value).__name__} param={isinstance(value, torch.nn.Parameter)} {value.dtype} {value.device} "
            f"{tuple(value.shape)} {tuple(value.stride())} +{value.storage_offset()} grad={value.requires_grad} "
            f"leaf={value.is_leaf} view={value._is_view()} inference={value.is_inference()} "
            f"neg={value.is_neg()} conj={value.is_conj()}")


# -- configuration and global state ----------------------------------------------------------
def _aot_config(aot_config: Any) -> Iterator[str]:
    if not is_dataclass(aot_config):
        raise Uncacheable(f"AOTAutograd's configuration is a {type(aot_config).__name__}")
    for item in fields(aot_config):
        if item.name not in IGNORED_AOT_CONFIG:
            yield f"aot_config.{item.name}={_canonical(getattr(aot_config, item.name), f'aot_config.{item.name}')}"


def global_state() -> Iterator[str]:
    """What tracing reads from outside the graph and its inputs."""
    yield f"grad={torch.is_grad_enabled()} inference_mode={torch.is_inference_mode_enabled()}"
    yield f"default_dtype={torch.get_default_dtype()}"
    yield (f"deterministic={torch.are_deterministic_algorithms_enabled()} "
           f"warn_only={torch.is_deterministic_algorithms_warn_only_enabled()}")
    autocast = [(d, torch.get_autocast_dtype(d)) for d in torch._C._autocast_supported_devices()
                if torch.is_autocast_enabled(d)]
    yield f"autocast={autocast} cache={torch.is_autocast_cache_enabled()}"
    cuda = torch.backends.cuda
    yield (f"sdp flash={cuda.flash_sdp_enabled()} mem_efficient={cuda.mem_efficient_sdp_enabled()} "
           f"math={cuda.math_sdp_enabled()} cudnn={cuda.cudnn_sdp_enabled()}")
    cudnn = torch.backends.cudnn
    yield (f"cudnn={cudnn.enabled} deterministic={cudnn.deterministic} benchmark={cudnn.benchmark} "
           f"tf32={cudnn.allow_tf32} matmul_tf32={cuda.matmul.allow_tf32} "
           f"precision={torch.get_float32_matmul_precision()} mkldnn={torch.backends.mkldnn.enabled}")
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            yield f"cuda:{index} {props.name} {props.major}.{props.minor}"
    if _saved_tensors_hooks_active():
        raise Uncacheable("saved-tensor hooks are active")
    yield f"functorch {_config(torch._functorch.config, strict=True)}"
    yield f"dynamo {_config(torch._dynamo.config, strict=False)}"


def _saved_tensors_hooks_active() -> bool:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return False
    try:
        return top(True) is not None
    except TypeError:
        return top() is not None


def _config(module: Any, strict: bool) -> str:
    """A config module's values; an entry with no stable text is Uncacheable when ``strict``
    (it may change tracing), else left out (Dynamo's: it shaped the captured graph, keyed as is)."""
    parts = []
    for name, value in sorted(module.get_config_copy().items()):
        try:
            parts.append(f"{name}={_canonical(value, f'config {name}')}")
        except Uncacheable:
            if strict:
                raise
    return ";".join(parts)


def _canonical(value: Any, what: str) -> str:
    """Text that is the same in every process for equal values (sets sorted, no addresses)."""
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("symbolic sizes")
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[" + ",".join(_canonical(v, what) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return "set[" + ",".join(sorted(_canonical(v, what) for v in value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(sorted(f"{_canonical(k, what)}:{_canonical(v, what)}" for k, v in value.items())) + "}"
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text or "object at" in text:
        raise Uncacheable(f"{what} has no stable text ({type(value).__name__})")
    return f"{type(value).__name__}:{text}"
