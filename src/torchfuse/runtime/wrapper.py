"""Generate the Python wrapper that runs one compiled graph.

The wrapper is readable Python (``print(compiled.wrapper_source)``): it reads sizes from
its inputs, allocates buffers (reusing dead ones of the same size), launches kernels, calls
ATen for Extern nodes, frees buffers after their last use and returns the outputs.

Every name the wrapper itself introduces (helpers, constants, kernels) starts with ``tf_``:
buffer names come from the graph, and a saved tensor may be called ``as_strided`` or ``max``
(timm's MobileNetV3 backward had an input named ``as_strided`` that hid the helper).
"""
from __future__ import annotations

from typing import Any, Callable

import sympy
import torch

from torchfuse.codegen.cpp.kernel import CppKernel
from torchfuse.codegen.float_sizes import float_size_text
from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.codegen.triton.printer import print_index
from torchfuse.ir.graph import Buffer, Extern, ExternArg, Graph, ScatterAdd
from torchfuse.ir.symbols import contiguous_strides, is_float_size
from torchfuse.runtime.launch import Launcher
from torchfuse.scheduler.kernel import ExternKernel, FusedKernel
from torchfuse.scheduler.schedule import Schedule


def py(expr: Any) -> str:
    """Python text for a size expression (float-valued ones in Python's own arithmetic)."""
    expr = sympy.sympify(expr)
    if is_float_size(expr):
        return float_size_text(expr, str, repr)
    return print_index(expr, "tf_max", "tf_min")


def _tuple(values) -> str:
    items = [py(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class WrapperWriter:
    def __init__(self, graph: Graph, plan: Schedule, kernels: dict[str, TritonKernel | CppKernel]) -> None:
        self.graph = graph
        self.plan = plan
        self.kernels = kernels
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}  # names the wrapper uses -> objects
        self.live: set[str] = set()
        # Dead buffers kept for a later allocation of the same size, each with the index of a
        # placeholder line where it died: that line becomes its ``del`` if nothing reuses it.
        self.free_pool: dict[tuple, list[tuple[str, int]]] = {}
        self.allocated_here: set[str] = set()
        self.read_later: set[str] = set()  # buffers a kernel, an extern or the return reads
        self.fresh_extern_outputs: set[str] = set()  # extern results aliasing no input
        # Buffers whose memory this wrapper allocated (storage offset 0, so 16-byte aligned on
        # CUDA), under any of their names: a kernel's key need not read their dtype and address.
        self.aligned_here: set[str] = set()
        # Launcher constant -> argument positions fixed at every call (``Launcher.fixed_args``):
        # aligned own buffers and literal integers.
        self.fixed_args: dict[str, frozenset[int]] = {}
        # The CUDA devices of the graph's buffers: with one, its buffers take tf_empty_cuda.
        self.cuda_devices = {b.device.index for b in graph.buffers.values() if b.device.type == "cuda"}
        self.uses_cuda_allocator = False

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def write(self) -> str:
        names = [b.name for b in self.graph.inputs]
        if names:
            self.emit(f"{', '.join(names)}{',' if len(names) == 1 else ''} = args")
        self.emit("args.clear()")
        for symbol, (position, dim) in sorted(self.graph.size_sources.items(), key=lambda kv: kv[0].name):
            source = names[position]
            self.emit(f"{symbol.name} = {source}.size({dim})" if dim is not None else f"{symbol.name} = int({source})")
        if any(isinstance(k, CppKernel) for k in self.kernels.values()):
            self.emit("tf_threads = tf_num_threads()  # C++ kernels follow torch.set_num_threads")
        self._preamble_end = len(self.lines)  # where the CUDA allocator's choice goes (write's end)
        last_use = self._last_uses()
        self.read_later = set(last_use) | self.graph.output_names()
        # Inputs are dropped after their last use too: a backward graph's inputs are the saved
        # activations, which aot_autograd hands over (it clears its own references), so the
        # ones the first layers' gradients no longer need are freed as the graph goes on, as
        # eager's autograd frees them. Kept to the end, ViT-B/16's training step peaked 336 MB
        # above eager's on the H200 (all activations alive beside all weight gradients).
        self.live.update(b.name for b in self.graph.inputs if b.name in self.graph.buffers)  # not SymInts
        group_of = {part: name for name, parts in self.plan.launch_groups.items() for part in parts}
        for step, item in enumerate(self.plan.items):
            if isinstance(item, FusedKernel) and item.name in group_of:
                # A combined launch runs at its first part; the later parts are in it.
                if self.plan.launch_groups[group_of[item.name]][0] == item.name:
                    self._emit_combined(group_of[item.name], step, last_use)
            elif isinstance(item, FusedKernel):
                self._emit_kernel(item, step, last_use)
            else:
                self._emit_extern(item.node)
            self._free(step, last_use)
        self._free_unreused()
        self.emit(f"return ({', '.join(self._output(o) for o in self.graph.outputs)}{',' if len(self.graph.outputs) == 1 else ''})")
        if self.uses_cuda_allocator:
            self.lines.insert(self._preamble_end, "    " + self._cuda_allocator())
        return "def call(args):\n" + "\n".join(line for line in self.lines if line) + "\n"

    def _cuda_allocator(self) -> str:
        """The line choosing ``tf_empty_cuda``: torch's allocation on the current CUDA device
        without the dispatcher (~4 us a buffer less than ``torch.empty_strided`` on the H200)
        when the buffers' device is the current one; else ``torch.empty_strided`` on theirs."""
        (index,) = self.cuda_devices
        if index is None:  # "cuda": the current device, as torch.empty_strided reads it too
            return "tf_empty_cuda = tf_empty_strided_cuda"
        device = self._const(torch.device("cuda", index), "device")
        return (f"tf_empty_cuda = tf_empty_strided_cuda if tf_cuda_current_device() == {index} "
                f"else tf_empty_on({device})")

    # -- buffers ---------------------------------------------------------------------------
    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for step, item in enumerate(self.plan.items):
            if isinstance(item, ExternKernel):
                reads = item.node.reads()
            else:  # pointers, and CPU scalars passed by value (read with .item() at the launch)
                compiled = self.kernels[item.name]
                reads = compiled.pointer_args + list(getattr(compiled, "scalar_args", ()))
                reads += [m.node.base for m in item.members if isinstance(m.node, ScatterAdd)]  # taken over
            for name in reads:
                last[name] = step
            if isinstance(item, FusedKernel):  # a mutated input named as its new value's memory
                for member in item.members:
                    target = self.plan.in_place.get(member.node.name)
                    if target is not None:
                        last[target] = max(last.get(target, step), step)
        return last

    def _free(self, step: int, last_use: dict[str, int]) -> None:
        keep = self.graph.output_names()
        for name in sorted(self.live):
            if last_use.get(name, -1) <= step and name not in keep:
                self.live.discard(name)
                key = self._pool_key(self.graph.buffers[name])
                if name in self.allocated_here:
                    self.free_pool.setdefault(key, []).append((name, len(self.lines)))  # kept for reuse
                    self.lines.append("")
                else:
                    self.emit(f"del {name}")

    def _free_unreused(self) -> None:
        """A pooled buffer that no later allocation took is deleted where it died, not kept to the end."""
        for entries in self.free_pool.values():
            for name, line in entries:
                self.lines[line] = f"    del {name}"
        self.free_pool.clear()

    @staticmethod
    def _pool_key(buffer: Buffer) -> tuple:
        """Dead buffers reused for a new one: row-major ones by size (through a ``.view`` when
        the shapes differ), others (channels-last activations) only at the same shape and strides."""
        if buffer.strides == _contiguous(buffer):
            return (sympy.sympify(buffer.numel), buffer.dtype, str(buffer.device))
        return (sympy.sympify(buffer.numel), buffer.dtype, str(buffer.device), tuple(buffer.shape), tuple(buffer.strides))

    def _allocate(self, buffer: Buffer) -> None:
        if buffer.name in self.plan.in_place:  # the kernel writes the mutated input directly
            target = self.plan.in_place[buffer.name]
            self.emit(f"{buffer.name} = {target}  # new value of {target}, written in place (its copy_)")
            self.live.add(buffer.name)
            return
        device = self._const(buffer.device, "device")
        dtype = self._const(buffer.dtype, "dtype")
        key = self._pool_key(buffer)
        if self.free_pool.get(key):
            old, _ = self.free_pool[key].pop()
            if old in self.aligned_here:
                self.aligned_here.add(buffer.name)
            if tuple(self.graph.buffers[old].shape) == tuple(buffer.shape):  # no view to make (~1 us a call)
                self.emit(f"{buffer.name} = {old}; del {old}  # reuse dead buffer")
            else:
                self.emit(f"{buffer.name} = {old}.view({_tuple(buffer.shape)}); del {old}  # reuse dead buffer")
        elif buffer.device.type == "cuda" and len(self.cuda_devices) == 1:
            self.uses_cuda_allocator = True
            self.emit(f"{buffer.name} = tf_empty_cuda({_tuple(buffer.shape)}, {_tuple(buffer.strides)}, {dtype})")
            self.aligned_here.add(buffer.name)
        else:
            self.emit(f"{buffer.name} = tf_empty_strided({_tuple(buffer.shape)}, {_tuple(buffer.strides)}, dtype={dtype}, device={device})")
            self.aligned_here.add(buffer.name)
        self.live.add(buffer.name)
        self.allocated_here.add(buffer.name)

    def _const(self, value: Any, prefix: str) -> str:
        for name, existing in self.constants.items():
            if existing == value and type(existing) is type(value):
                return name
        name = f"tf_{prefix}{len(self.constants)}"
        self.constants[name] = value
        return name

    # -- kernels and externs ---------------------------------------------------------------
    def _bind_outputs(self, kernel: FusedKernel, step: int, last_use: dict[str, int],
                      shared: frozenset[str] | set[str] = frozenset()) -> None:
        """Memory for each buffer the kernel stores: a mutated input's (plan.in_place, _allocate),
        a scatter's base, a dead buffer the kernel reads element-wise (not one in ``shared``), or
        a new or pooled allocation."""
        compiled = self.kernels[kernel.name]
        for member in kernel.members:
            if isinstance(member.node, ScatterAdd):
                self._take_over_base(member.node)
            elif member.stored:
                reused = None if member.node.name in self.plan.in_place else \
                    self._in_place_source(compiled, member.node.name, step, last_use, shared)
                if reused:  # the old name is dropped after the kernel, never pooled for reuse
                    target = self.graph.buffers[member.node.name]
                    same_shape = tuple(target.shape) == tuple(self.graph.buffers[reused].shape)
                    view = "" if same_shape else f".view({_tuple(target.shape)})"
                    self.emit(f"{member.node.name} = {reused}{view}  # overwrites the dead buffer {reused}")
                    self.allocated_here.discard(reused)
                    self.live.add(member.node.name)
                    self.allocated_here.add(member.node.name)
                    if reused in self.aligned_here:
                        self.aligned_here.add(member.node.name)
                else:
                    self._allocate(self.graph.buffers[member.node.name])

    def _emit_combined(self, name: str, step: int, last_use: dict[str, int]) -> None:
        """One launch of a group's kernels (codegen/triton/combo.py), the parts at consecutive
        steps. A part overwrites a dead input only if no other part reads it: the parts run
        concurrently, so another part could still be reading it."""
        parts = self.plan.items[step:step + len(self.plan.launch_groups[name])]
        assert [p.name for p in parts] == list(self.plan.launch_groups[name]), "a group's parts must be consecutive"
        for i, part in enumerate(parts):
            others = {arg for other in parts if other is not part for arg in self.kernels[other.name].pointer_args}
            self._bind_outputs(part, step + i, last_use, shared=others)
        compiled = self.kernels[name]
        self.emit(f"# {name}: one launch of {', '.join(p.name for p in parts)}")
        args = ", ".join([*compiled.pointer_args, *map(str, compiled.int_args)])
        fn = self._const(compiled, "kernel")
        literals = range(len(compiled.pointer_args), len(compiled.pointer_args) + len(compiled.int_args))
        self._fix_args(fn, compiled.pointer_args, literals)
        self.emit(f"{fn}.launch({py(compiled.xnumel)}, 0, {args})")

    def _emit_kernel(self, kernel: FusedKernel, step: int, last_use: dict[str, int]) -> None:
        compiled = self.kernels[kernel.name]
        self._bind_outputs(kernel, step, last_use)
        # CPU scalars a GPU kernel reads are passed by value (ir/devices.py), as eager does.
        scalars = [f"{name}.item()" for name in getattr(compiled, "scalar_args", ())]
        args = compiled.pointer_args + scalars + [s.name for s in compiled.size_args]
        fn = self._const(compiled, "kernel")
        self.emit(f"# {kernel.name}: {', '.join(kernel.origins)}")
        if isinstance(compiled, CppKernel):
            # A ctypes call: raw pointers (data_ptr() includes the storage offset), int64
            # sizes, the thread count. Empty loops make zero-size launches no-ops.
            pointers = [f"{name}.data_ptr()" for name in compiled.pointer_args]
            sizes = [s.name for s in compiled.size_args]
            self.emit(f"{fn}({', '.join(pointers + sizes + ['tf_threads'])})")
        else:  # a runtime.launch.Launcher: (xnumel, rnumel, arguments)
            self._fix_args(fn, compiled.pointer_args)
            rnumel = py(compiled.rnumel) if compiled.kind == "reduction" else "0"
            self.emit(f"{fn}.launch({py(compiled.xnumel)}, {rnumel}, {', '.join(args)})")

    def _fix_args(self, launcher: str, pointers: list[str], literals: range = range(0)) -> None:
        """Record the launch arguments that are the same at every call of this graph: pointers
        to our own allocations, literal integers. A launcher called from several lines keeps
        only what is fixed at all of them."""
        fixed = frozenset([i for i, name in enumerate(pointers) if name in self.aligned_here] + list(literals))
        self.fixed_args[launcher] = self.fixed_args.get(launcher, fixed) & fixed

    def _take_over_base(self, node: ScatterAdd) -> None:
        """A scatter adds into its base's memory (zeros, or a copy of its input, written by an
        earlier kernel that nothing else reads): its buffer is that tensor under a new name, and
        the old name is dropped without being pooled for reuse."""
        base = node.base
        if base not in self.live or base in self.graph.output_names() or base not in self.allocated_here:
            raise RuntimeError(f"{node.name} would accumulate into {base}, which the wrapper does not own "
                               "(a torchfuse bug: lowering gives every scatter a fresh base)")
        self.emit(f"{node.name} = {base}; del {base}  # {node.name} accumulates into {base}'s memory")
        if base in self.aligned_here:
            self.aligned_here.add(node.name)
        self.live.discard(base)
        self.allocated_here.discard(base)
        self.live.add(node.name)
        self.allocated_here.add(node.name)

    def _in_place_source(self, compiled, name: str, step: int, last_use: dict[str, int],
                         shared: frozenset[str] | set[str] = frozenset()) -> str | None:
        """A dead input the kernel may overwrite to produce ``name``: one the renderer allows
        (``CppKernel.in_place``, ``TritonKernel.in_place``), read for the last time here, and ours:
        allocated by this wrapper or returned by an ATen op that aliases none of its inputs;
        never a graph input, output or constant."""
        keep = self.graph.output_names() | {b.name for b in self.graph.inputs} | set(self.graph.constants)
        for source in getattr(compiled, "in_place", {}).get(name, []):
            if source in keep or source in shared or source not in self.live or last_use.get(source, -1) != step:
                continue
            if source in self.allocated_here or source in self.fresh_extern_outputs:
                return source
        return None

    def _emit_extern(self, node: Extern) -> None:
        fn = self._const(node.target, "aten_op")
        reads_only = _writes_no_argument(node.target)
        args = ", ".join(self._extern_value(a, reads_only) for a in node.args)
        kwargs = "".join(f", {k}={self._extern_value(v, reads_only)}" for k, v in node.kwargs.items())
        self.emit(f"# {node.name}: {node.target}")
        result = f"{node.name}_result"
        self.emit(f"{result} = {fn}({args}{kwargs})")
        fresh = _returns_fresh_tensors(node.target)
        for buffer, path in zip(node.outputs, node.output_paths):
            if buffer.name not in self.read_later:
                # Unread outputs keep no name: their traced shape may be wrong (fake tensors
                # give embedding_bag's unused offsets output one element too few).
                continue
            access = result + "".join(f"[{i}]" for i in path)
            self.emit(f"{buffer.name} = tf_ensure_layout({access}, {_tuple(buffer.shape)}, {_tuple(buffer.strides)})")
            self.live.add(buffer.name)
            if fresh:
                self.fresh_extern_outputs.add(buffer.name)
        # The buffers above hold what is still read; the call's own name would keep every
        # result (and each unread output) alive until the graph returns.
        self.emit(f"del {result}")

    def _extern_value(self, value: Any, reads_only: bool = False) -> str:
        """An extern call's argument; views of buffers an op only reads (``reads_only``) are
        reinterpreted (``tf_reinterpret``), the others made with ``torch.as_strided``."""
        if isinstance(value, ExternArg):
            return self._view(value.buffer, value.shape, value.strides, value.offset, reads_only)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self._extern_value(v, reads_only) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, sympy.Expr):
            return py(value) if value.is_integer or not value.is_number else self._extern_value(float(value))
        if isinstance(value, float):
            return repr(value) if value == value and abs(value) != float("inf") else f"float('{value}')"
        if isinstance(value, (bool, int, str, type(None))):
            return repr(value)
        return self._const(value, "const")

    def _view(self, name: str, shape, strides, offset, reads_only: bool = False) -> str:
        """``name`` seen with these sizes, strides and storage offset (as traced: absolute).

        The offset is written relative to the buffer's own: Dynamo does not guard storage
        offsets, so a graph input (and an ATen view of one) may arrive at another offset than
        the traced one; the kernels index from ``data_ptr()``, which includes it, and so must
        the views. A view only read by an ATen op is made with ``tf_reinterpret`` (a
        ``torch._C`` binding that sets sizes and strides on a new tensor of the same storage):
        ~0.6 against ~1.2 us for ``torch.as_strided``, which goes through the dispatcher, and a
        training step makes hundreds. Its result is no autograd view and shares no version
        counter with its base, so a tensor an op writes, or one the graph returns, is made
        with ``tf_as_strided_from`` (``as_strided`` at the base's offset plus the relative one)."""
        buffer = self.graph.buffers[name]
        if tuple(shape) == buffer.shape and tuple(strides) == buffer.strides and sympy.sympify(offset) == buffer.offset:
            return name
        helper = "tf_reinterpret" if reads_only else "tf_as_strided_from"
        return f"{helper}({name}, {_tuple(shape)}, {_tuple(strides)}, {py(sympy.sympify(offset) - buffer.offset)})"

    def _output(self, out) -> str:
        if out.buffer is None:
            value = out.constant
            return py(value) if isinstance(value, sympy.Expr) else self._extern_value(value)
        return self._view(out.buffer, out.shape, out.strides, out.offset)


def _returns_fresh_tensors(target: Any) -> bool:
    """True for an ATen op whose schema says no output aliases an input (not a view)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return all(ret.alias_info is None for ret in schema.returns)


def _writes_no_argument(target: Any) -> bool:
    """True for an ATen op whose schema marks no argument as written (no in-place, no ``out=``)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return not any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments)


def _reinterpret_function() -> Callable[..., torch.Tensor]:
    """``tf_reinterpret(tensor, sizes, strides, offset)``: a tensor over ``tensor``'s storage with
    these sizes and strides, ``offset`` elements past ``tensor``'s own storage offset. The
    ``torch._C`` binding Dynamo's guards export (not Inductor's code), else ``as_strided``."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    fast = getattr(guards, "_reinterpret_tensor", None)
    if fast is not None:
        return fast
    return as_strided_from


def as_strided_from(tensor: torch.Tensor, sizes: tuple, strides: tuple, offset: int) -> torch.Tensor:
    """``torch.as_strided`` ``offset`` elements past ``tensor``'s own storage offset."""
    return torch.as_strided(tensor, sizes, strides, tensor.storage_offset() + offset)


def _contiguous(buffer: Buffer):
    return contiguous_strides(buffer.shape)


def ensure_layout(tensor: torch.Tensor, shape: tuple, strides: tuple) -> torch.Tensor:
    """Kernels index extern outputs with the strides tracing predicted; enforce them."""
    if tensor is None:  # optional outputs (attention's debug tensors) may be absent
        return None
    if tensor.stride() == strides and tensor.shape == shape:  # the usual case, in two C compares
        return tensor
    if tuple(tensor.shape) == shape and _same_addresses(tensor, strides):
        return tensor
    out = torch.empty_strided(shape, strides, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor.reshape(shape))


def _same_addresses(tensor: torch.Tensor, strides: tuple) -> bool:
    """Whether ``strides`` put every element of ``tensor`` where its own strides do.

    A size-1 dimension's stride is never multiplied by anything but 0, so it may differ: ATen
    and the meta functions often disagree there, which cost a copy per call.
    """
    if tensor.numel() <= 1:
        return True
    return all(size == 1 or have == want for size, have, want in zip(tensor.shape, tensor.stride(), strides))


def build_wrapper(graph: Graph, plan: Schedule, kernels: dict[str, TritonKernel | CppKernel],
                  launchers: dict[str, Any], ahead: dict[str, tuple[Any, list]] | None = None,
                  tuners: dict[str, Any] | None = None):
    """Compile the wrapper source into a callable ``call(args)``; returns (call, source, constants,
    fixed_args): what ``bind_wrapper`` needs to bind the source again (a graph cache hit)."""
    writer = WrapperWriter(graph, plan, kernels)
    source = writer.write()
    call = bind_wrapper(source, writer.constants, graph.constants, launchers, graph.name, ahead, tuners,
                        writer.fixed_args)
    return call, source, writer.constants, writer.fixed_args


def _empty_on(device: torch.device) -> Callable[..., torch.Tensor]:
    """``torch.empty_strided`` on ``device``, called as ``tf_empty_cuda`` is."""
    return lambda shape, strides, dtype: torch.empty_strided(shape, strides, dtype=dtype, device=device)


def _cuda_allocation() -> dict[str, Any]:
    """What a wrapper's ``tf_empty_cuda`` line needs: an allocation on the current CUDA device
    that skips the dispatcher (a ``torch._C`` binding Dynamo's guards export, not Inductor's
    code; ``torch.empty_strided`` where this torch lacks it) and the current device's index."""
    fast = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    fast = getattr(fast, "_empty_strided_cuda", None)
    if fast is None:
        fast = lambda shape, strides, dtype: torch.empty_strided(shape, strides, dtype=dtype, device="cuda")  # noqa: E731
    return {"tf_empty_strided_cuda": fast, "tf_cuda_current_device": getattr(torch._C, "_cuda_getDevice", None)}


# ATen calls a model makes at every step that have a Python binding taking the same arguments
# as the overload: the binding parses them and calls the kernel unboxed, where the overload's
# ``__call__`` boxes every argument through the dispatcher (~49 against ~29 us a convolution
# under cProfile on the H200, EfficientNet-B0). Only ops whose other overloads cannot match a
# call of the default's arguments (``out=`` variants need ``out``; mm's ``dtype`` an out dtype).
DIRECT_BINDINGS = ("convolution", "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def direct_binding(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """What the wrapper calls for ``op``: its Python binding when it has one in DIRECT_BINDINGS."""
    name = op._schema.name.removeprefix("aten::")
    if op._overloadname == "default" and name in DIRECT_BINDINGS:
        return getattr(torch._C._VariableFunctions, name, op)
    return op


def bind_wrapper(source: str, constants: dict[str, Any], tensor_constants: dict[str, torch.Tensor],
                 launchers: dict[str, Any], graph_name: str, ahead: dict[str, tuple[Any, list]] | None = None,
                 tuners: dict[str, Any] | None = None, fixed_args: dict[str, frozenset[int]] | None = None):
    """Execute a wrapper's source with the objects it names: ``constants`` from its writer
    (kernels become their launchers, given the binaries compiled ahead for their predicted launch
    in ``ahead``: kernel name -> (``predict.PredictedLaunch``, loaders, one per config), and
    under max-autotune their ``autotune.KernelTuner`` in ``tuners``), the graph's tensor
    constants by buffer name."""
    namespace: dict[str, Any] = {
        "tf_empty_strided": torch.empty_strided, "tf_as_strided_from": as_strided_from,
        "tf_reinterpret": _reinterpret_function(), "tf_ensure_layout": ensure_layout,
        "tf_max": max, "tf_min": min, "tf_num_threads": torch.get_num_threads, "tf_empty_on": _empty_on,
        **_cuda_allocation(),
    }
    namespace.update(tensor_constants)  # lifted tensor constants, by buffer name
    for name, value in constants.items():
        if isinstance(value, TritonKernel):
            kernel = value
            value = Launcher(launchers[kernel.name], kernel.kind, kernel.persistent, outer=kernel.outer, tile=kernel.tile,
                             live_tiles=kernel.live_tiles, fixed_args=(fixed_args or {}).get(name, frozenset()),
                             special_step=kernel.special_step, chunk_lanes=kernel.chunk_lanes)
            if ahead and kernel.name in ahead:
                launch, loads = ahead[kernel.name]
                for load in loads:
                    value.prepare(launch.xnumel, launch.rnumel, launch.args, load, load.config)
            value.tuner = (tuners or {}).get(kernel.name)
        elif isinstance(value, CppKernel):
            value = launchers[value.name]  # the ctypes function
        elif isinstance(value, torch._ops.OpOverload):
            value = direct_binding(value)
        namespace[name] = value
    exec(compile(source, f"<torchfuse wrapper {graph_name}>", "exec"), namespace)
    return namespace["call"]
