"""Graphs that mix devices: CPU scalars in GPU kernels, CPU kernels in GPU graphs, index tensors
on the CPU (lowering/devices.py, ir/devices.py).

Without a GPU, graphs are traced with fake CUDA tensors and compiled up to the wrapper (Triton
compiles a GPU kernel only at its first launch); the generated GPU kernels then run in Triton's
interpreter on CPU tensors, which checks their values. With a GPU the same programs run for real.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import assert_close, compile_strict
from torchfuse.codegen.triton.kernel import render_kernel
from torchfuse.diagnostics.report import report
from torchfuse.ir.expr import Const, Load, Op
from torchfuse.ir.graph import Buffer, Pointwise
from torchfuse.lowering.devices import check_one_device, place_on_one_device
from torchfuse.lowering.driver import lower
from torchfuse.options import Options
from torchfuse.pipeline import compile_graph
from torchfuse.runtime.cpp_build import compiler_available
from torchfuse.runtime.kernel_cache import load_kernel
from torchfuse.runtime.launch import Launcher
from torchfuse.scheduler.schedule import schedule


def scaled_rows(x, s):
    """A GPU reduction and epilogue reading a CPU scalar twice."""
    return (x * s).sum(-1) + s


def cpu_then_cuda(x, s, n):
    """Values computed on the CPU (from a CPU scalar) before moving to the GPU."""
    ramp = (torch.arange(x.shape[-1]) * s + n).to(x.device)
    return x * ramp, ramp.sum()


def _fake_cuda_graph(fn, *specs):
    """``fn`` traced with fake tensors: each spec is (shape, dtype, device)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in specs]
    return make_fx(fn, tracing_mode="fake")(*fakes), fakes


def test_cpu_scalar_is_a_kernel_argument_and_no_kernel_mixes_devices():
    gm, fakes = _fake_cuda_graph(cpu_then_cuda, ((8, 16), torch.float32, "cuda"), ((), torch.float32, "cpu"),
                                 ((), torch.int64, "cpu"))
    compile_graph(gm, fakes, "inference", Options(strict=True))
    graph = report().graphs[-1]
    assert graph.target == "triton" and not graph.error
    notes = "\n".join(graph.device_notes)
    if compiler_available():
        assert "runs on the CPU (C++)" in notes  # the ramp kernel, over CPU tensors
        cpu_kernels = [k for k in graph.kernels if k.source and 'extern "C"' in k.source]
        assert len(cpu_kernels) == 1 and "arange" in " ".join(cpu_kernels[0].ops)
    # The GPU kernels read no CPU memory: the ramp reaches them through ATen's copy.
    assert "_to_copy" in graph.wrapper_source
    assert str(report()).count("devices:") == len(graph.device_notes)


def test_scalar_argument_kernel_computes_eagers_values():
    """The GPU kernel that reads a CPU scalar, run in Triton's interpreter on CPU tensors."""
    gm, _ = _fake_cuda_graph(scaled_rows, ((37, 300), torch.bfloat16, "cuda"), ((), torch.float32, "cpu"))
    graph = lower(gm, "g")
    assert place_on_one_device(graph) == []  # a scalar needs no copy
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    (kernel,) = plan.kernels
    rendered = render_kernel(kernel, graph.buffers, lambda e: int(e))
    assert rendered.scalar_args == ["s_1"] and "s_1" not in rendered.pointer_args
    assert "tl.full([1, 1], scalar0, tl.float32)" in rendered.source

    x = torch.randn(37, 300).bfloat16()
    s = torch.tensor(0.37)
    outputs = {name: torch.empty(graph.buffers[name].shape, dtype=graph.buffers[name].dtype)
               for name in rendered.pointer_args if name not in ("x_1",)}
    args = [x if name == "x_1" else outputs[name] for name in rendered.pointer_args] + [s.item()]
    launcher = Launcher(load_kernel(rendered.source, rendered.function, interpret=True), "reduction", rendered.persistent)
    launcher(37, 300, *args)
    (result,) = outputs.values()
    assert_close(result, scaled_rows(x, s), reference=scaled_rows(x.double(), s.double()))


def _gpu_gather_with_cpu_index():
    """x[i] * 2 with x on the GPU and i on the CPU, as lowering gives it: a gathered load of x
    whose row index is read from i. Built by hand: fake CUDA indexing needs a CUDA build."""
    gm, _ = _fake_cuda_graph(lambda x, i: x * 2, ((8, 4), torch.float32, "cuda"), ((3,), torch.int64, "cpu"))
    graph = lower(gm, "g")
    node = graph.nodes[-1]
    index = Load(torch.int64, "i_1", (node.vars[0],))
    body = Op(torch.float32, "mul", (Load(torch.float32, "x_1", (index, node.vars[1])), Const(torch.float32, 2.0)))
    graph.nodes[-1] = Pointwise(node.name, (3, 4), node.dtype, node.device, body, "aten.index.Tensor")
    graph.buffers[node.name] = Buffer.contiguous(node.name, (3, 4), node.dtype, node.device)
    return graph


def test_cpu_index_tensor_of_a_gpu_gather_is_copied_to_the_gpu():
    graph = _gpu_gather_with_cpu_index()
    notes = place_on_one_device(graph)
    assert len(notes) == 1 and "i_1 (cpu) copied to cuda" in notes[0]
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    (kernel,) = plan.kernels
    assert "i_1_cuda" in render_kernel(kernel, graph.buffers).pointer_args


def test_check_one_device_refuses_a_kernel_that_reads_another_devices_memory():
    graph = _gpu_gather_with_cpu_index()
    plan = schedule(graph)  # without place_on_one_device: the kernel reads i_1 on the CPU
    with pytest.raises(RuntimeError, match="touches i_1 on cpu"):
        check_one_device(plan.kernels, graph.buffers)


def test_scheduler_never_fuses_or_inlines_across_devices():
    gm, _ = _fake_cuda_graph(lambda x, s: ((s * 3).to(x.device) + x, (s * 3) + 1),
                             ((), torch.float32, "cuda"), ((), torch.float32, "cpu"))
    graph = lower(gm, "g")
    place_on_one_device(graph)
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    devices = {k.name: k.device.type for k in plan.kernels}
    assert sorted(devices.values()) == ["cpu", "cuda"], devices


def size_scale(x, s):
    """What decompositions make of sizes inside GPU graphs: 0-d CPU tensors (scalar_tensor has no
    device argument), float64 in between, then a float32 scale applied on the GPU."""
    n = torch.ops.aten.scalar_tensor.default(7).to(torch.float64)
    scale = (n / (n * 2.0 + s)).to(torch.float32)
    return x * scale


def test_a_cpu_value_computed_from_scalars_is_recomputed_in_the_gpu_kernel():
    gm, fakes = _fake_cuda_graph(size_scale, ((8, 16), torch.float32, "cuda"), ((), torch.float32, "cpu"))
    graph = lower(gm, "g")
    place_on_one_device(graph)
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    (kernel,) = plan.kernels  # no CPU kernel: the float64 chain runs inside the GPU kernel
    assert kernel.device.type == "cuda"
    rendered = render_kernel(kernel, graph.buffers, lambda e: int(e))
    assert rendered.scalar_args == ["s_1"] and rendered.pointer_args == ["x_1", kernel.members[-1].node.name]
    x, s = torch.randn(8, 16), torch.tensor(0.25)
    out = torch.empty(8, 16)
    Launcher(load_kernel(rendered.source, rendered.function, interpret=True), "pointwise")(128, 0, x, out, s.item())
    assert_close(out, size_scale(x, s), reference=size_scale(x.double(), s.double()))


def test_a_cpu_value_that_reads_cpu_memory_is_stored_by_a_cpu_kernel():
    """Here the chain reads a float64 CPU tensor, which no kernel scalar can carry exactly."""
    gm, fakes = _fake_cuda_graph(lambda x, d: x * (d * 3).to(torch.float32),
                                 ((8, 16), torch.float32, "cuda"), ((), torch.float64, "cpu"))
    graph = lower(gm, "g")
    place_on_one_device(graph)
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    assert sorted(k.device.type for k in plan.kernels) == ["cpu", "cuda"]
    gpu = next(k for k in plan.kernels if k.device.type == "cuda")
    (value,) = render_kernel(gpu, graph.buffers).scalar_args  # the CPU kernel's float32 result
    # The wrapper keeps that value alive until the GPU launch has read it.
    compile_graph(gm, fakes, "inference", Options(strict=True))
    source = report().graphs[-1].wrapper_source
    assert f"{value}.item()" in source and source.index(f"{value}.item()") < source.index(f"del {value}")


def shift_right(ids):
    """T5's ``_shift_right`` as aot_autograd gives it: ``shifted[..., 0] = 0`` copies a CPU
    tensor constant (Dynamo lifts the 0) into a GPU slice."""
    aten = torch.ops.aten
    shifted = aten.slice_scatter.default(aten.new_zeros.default(ids, list(ids.shape)),
                                         aten.slice.Tensor(ids, 1, 0, -1), 1, 1)
    start = aten.copy.default(aten.select.int(shifted, 1, 0), aten.lift_fresh_copy.default(torch.tensor(5)))
    return aten.select_scatter.default(shifted, start, 1, 0) * 3


def test_a_cpu_constant_copied_into_a_gpu_tensor_is_a_kernel_scalar():
    """No C++ kernel and no ATen copy: a graph with C++ kernels cannot be a CUDA graph."""
    gm, fakes = _fake_cuda_graph(shift_right, ((3, 16), torch.int64, "cuda"))
    graph = lower(gm, "g")
    assert place_on_one_device(graph) == []
    plan = schedule(graph)
    check_one_device(plan.kernels, graph.buffers)
    (kernel,) = plan.kernels
    assert kernel.device.type == "cuda"
    rendered = render_kernel(kernel, graph.buffers, lambda e: int(e))
    assert rendered.scalar_args == []  # lowering folds the small constant into the kernel
    ids = torch.randint(1, 1000, (3, 16))
    out = torch.empty(3, 16, dtype=torch.int64)
    launcher = Launcher(load_kernel(rendered.source, rendered.function, interpret=True), "pointwise")
    launcher(48, 0, ids, out)
    assert torch.equal(out, shift_right(ids))
    compile_graph(gm, fakes, "inference", Options(strict=True))
    assert report().graphs[-1].device_notes == []


# -- on a GPU -------------------------------------------------------------------------------------
def _cuda_cases():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 300, generator=gen)
    return {
        "scalar float32": (scaled_rows, (x.cuda().bfloat16(), torch.tensor(0.3))),
        "scalar int64 and bool": (lambda x, n, b: torch.where(b, x * n, x - n),
                                  (x.cuda(), torch.tensor(3), torch.tensor(True))),
        "scalar float64 (copied)": (lambda x, s: x * s, (x.cuda(), torch.tensor(0.1, dtype=torch.float64))),
        "cpu kernel then copy": (cpu_then_cuda, (x.cuda(), torch.tensor(0.5), torch.tensor(2))),
        "cpu index tensor": (lambda x, i: x[i] * 2, (x.cuda(), torch.tensor([3, 0, 63, 5]))),
        "cuda tensors from cpu inputs": (lambda s: torch.ones(5, device="cuda") * s, (torch.tensor(1.5),)),
        "cpu float64 chain from sizes": (size_scale, (x.cuda(), torch.tensor(0.25))),
        "cpu constant copied into a gpu slice": (shift_right, (torch.randint(1, 9, (3, 16)).cuda(),)),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_cuda_cases()) if torch.cuda.is_available() else ["no cuda"])
def test_mixed_device_graphs_match_eager_on_the_gpu(case):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fn, args = _cuda_cases()[case]
    got, want = compile_strict(fn)(*args), fn(*args)
    ref = fn(*[a.double() if a.is_floating_point() else a for a in args])
    leaves = torch.utils._pytree.tree_leaves
    for g, w, r in zip(leaves(got), leaves(want), leaves(ref)):
        assert g.device == w.device
        assert_close(g, w, reference=r)
    assert not any(g.error for g in torchfuse.report().graphs)
