"""Combined launches (codegen/triton/combo.py): small independent pointwise kernels run by one
launch. Checked through Triton's interpreter: the results, which kernels may share a launch
(never one that reads what is written after its group started), the partition of programs for
every block size the launcher or the autotuner may choose, and the switch that turns it off."""
from __future__ import annotations

import copy

import pytest
import sympy
import torch

import torchfuse
from conftest import assert_close, compile_strict
from opcheck import check_outputs, floats
from torchfuse.codegen.triton import combo
from torchfuse.codegen.triton.kernel import PROGRAM_ID, TritonKernel, flat_prologue
from torchfuse.ir.expr import Const
from torchfuse.ir.graph import Pointwise
from torchfuse.runtime import graph_cache, kernel_cache
from torchfuse.scheduler.kernel import ExternKernel, FusedKernel, KernelMember

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


class SqueezeExcite(torch.nn.Module):
    """EfficientNet's pattern under autocast: every convolution casts its weight (and bias) first."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(channels, 4 * channels, 1, bias=False)
        self.depthwise = torch.nn.Conv2d(4 * channels, 4 * channels, 3, padding=1, groups=4 * channels, bias=False)
        self.reduce = torch.nn.Conv2d(4 * channels, channels, 1)
        self.gate = torch.nn.Conv2d(channels, 4 * channels, 1)
        self.project = torch.nn.Conv2d(4 * channels, channels, 1, bias=False)

    def forward(self, x):
        y = torch.nn.functional.silu(self.expand(x))
        y = torch.nn.functional.silu(self.depthwise(y))
        g = torch.sigmoid(self.gate(torch.nn.functional.silu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return x + self.project(y * g)


def _model_and_input(seed: int):
    torch.manual_seed(seed)
    x = floats((2, 8, 6, 5), torch.float32, specials=[], seed=seed).to(memory_format=torch.channels_last)
    model = torch.nn.Sequential(SqueezeExcite(), SqueezeExcite()).eval()
    return model.to(x.device, memory_format=torch.channels_last), x


@pytest.fixture
def recorded(monkeypatch):
    """Every call of ``combine_launches``: (items before, kernels, in-place map, result)."""
    calls = []
    original = combo.combine_launches

    def record(items, kernels, in_place):
        result = original(items, kernels, in_place)
        calls.append((list(items), dict(kernels), dict(in_place), result))
        return result

    monkeypatch.setattr(combo, "combine_launches", record)
    return calls


def _check_groups(items, kernels, in_place, result) -> int:
    """Each group's parts are consecutive in the new order, read nothing another part writes,
    and moved (up or down to the group's launch) past nothing that writes what they read or
    reads what they write."""
    ordered, groups, combined = result
    assert sorted(map(id, ordered)) == sorted(map(id, items)), "combining lost or added an item"
    names = [item.name for item in ordered]
    position = {item.name: i for i, item in enumerate(items)}
    launch_at = {tuple(items[p].name for p in g.members): g.at for g in combo.plan_launch_groups(items, kernels, in_place)}
    for name, parts in groups.items():
        start = names.index(parts[0])
        assert tuple(names[start:start + len(parts)]) == parts
        assert combined[name].pointer_args == [a for p in parts for a in kernels[p].pointer_args]
        at = launch_at[parts]
        for part in parts:
            q = position[part]
            reads, writes = _reads(items[q], kernels), _writes(items[q], in_place)
            assert not any(m.node.name in in_place for m in items[q].members)
            passed = items[at:q] if q > at else items[q + 1:at + 1]
            for other in passed + [items[position[p]] for p in parts if p != part]:
                assert not reads & _writes(other, in_place), f"{part} moved before {other.name}, which writes it"
                if other.name not in parts:
                    assert not writes & _reads(other, kernels), f"{part} moved after {other.name}, which reads it"
    return sum(len(parts) for parts in groups.values())


def _reads(item, kernels) -> set[str]:
    if isinstance(item, ExternKernel):
        return set(item.node.reads())
    return set(kernels[item.name].pointer_args) - {m.node.name for m in item.members}


def _writes(item, in_place) -> set[str]:
    """Buffers an item writes: an ATen call's outputs, a kernel's stores (and the inputs written in place)."""
    if isinstance(item, ExternKernel):
        return {b.name for b in item.node.outputs}
    stored = {m.node.name for m in item.members if m.stored}
    return stored | {in_place[n] for n in stored if n in in_place}


def _assert_like_eager(got: torch.Tensor, model: torch.nn.Module, x: torch.Tensor) -> None:
    """``got`` as close to float64 as eager under autocast is. Not bit for bit eager's: the
    Triton target adds a convolution's bias in the kernel after it, one bf16 rounding fewer
    than eager's separate add (lowering/bias_epilogue.py)."""
    with torch.no_grad():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            want = model(x)
        reference = copy.deepcopy(model).double()(x.double())
    assert_close(got, want, reference=reference)


def _compiled_output(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torchfuse.reset()
    torch._dynamo.reset()
    compiled = compile_strict(model, options={"target": "triton"})
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
        return compiled(x)


def test_weight_casts_share_launches_and_results_are_exact(recorded, monkeypatch):
    """Under autocast each convolution's weight cast is a kernel of its own: they join the
    launch of the kernel before them, and the outputs are bit for bit those of every kernel
    launched alone."""
    model, x = _model_and_input(seed=3)
    monkeypatch.setenv("TORCHFUSE_COMBINE_LAUNCHES", "0")
    alone = _compiled_output(model, x)
    monkeypatch.delenv("TORCHFUSE_COMBINE_LAUNCHES")
    got = _compiled_output(model, x)
    torch.testing.assert_close(got, alone, rtol=0, atol=0)
    _assert_like_eager(got, model, x)
    (graph,) = torchfuse.report().graphs
    combined = sum(len(parts) for parts in graph.combined_launches.values())
    assert len(graph.combined_launches) >= 4 and combined >= 12, graph.combined_launches
    launches = [line for line in graph.wrapper_source.splitlines() if line.strip().startswith("tf_kernel")]
    assert len(launches) == len(graph.generated_kernels) - combined + len(graph.combined_launches)
    assert "one launch (combo0)" in str(graph)
    assert _check_groups(*recorded[0]) == combined


def test_a_kernel_reading_what_an_aten_call_wrote_since_the_group_began_keeps_its_place(recorded):
    """``c`` reads the matmul's result, computed after ``a``'s kernel: it may not join ``a``'s
    launch; ``d`` reads only an input and joins a launch."""
    def fn(x, y, w, z):
        a = torch.sin(x)
        m = a @ w
        c = torch.cos(m) + 1
        d = torch.tanh(y) * 2
        e = torch.exp(z) - 1
        return m, c, d, e

    torchfuse.reset()
    args = [floats((24, 24), torch.float32, specials=[], seed=s) for s in range(4)]
    check_outputs(fn, *args, compiled=compile_strict(fn, options={"target": "triton"}), scale_tol=True)
    items, kernels, in_place, result = recorded[0]
    _check_groups(items, kernels, in_place, result)
    (graph,) = torchfuse.report().graphs
    ops_of = {k.name: " ".join(k.ops) for k in graph.kernels}
    groups = [" | ".join(ops_of[p] for p in parts) for parts in graph.combined_launches.values()]
    assert any("tanh" in g for g in groups), groups
    assert not any("sin" in g and "cos" in g for g in groups), groups


def test_the_group_check_catches_a_kernel_moved_past_its_producer(recorded, monkeypatch):
    """The check above fails when dependencies are ignored (a kernel reading nothing, to the planner)."""
    accesses = combo._accesses
    monkeypatch.setattr(combo, "_accesses", lambda item, kernels, in_place: (set(), accesses(item, kernels, in_place)[1]))

    def fn(x, w):
        m = torch.sin(x) @ w
        return m, torch.cos(m)

    torchfuse.reset()
    args = [floats((24, 24), torch.float32, specials=[], seed=s) for s in range(2)]
    with pytest.raises(UnboundLocalError):  # the cosine's launch now comes before the matmul
        compile_strict(fn, options={"target": "triton"})(*args)
    with pytest.raises(AssertionError, match="moved before"):
        _check_groups(*recorded[0])


def test_a_kernel_left_alone_sinks_to_a_later_launch(recorded):
    """In a backward graph each weight gradient is cast by a kernel between two ATen calls with a
    reduction after it: it cannot move up into a launch, but it can move down to the next one
    (nothing in between reads it). Training results match eager's."""
    torch.manual_seed(6)
    x = floats((2, 8, 6, 5), torch.float32, specials=[], seed=6).to(memory_format=torch.channels_last)
    model = torch.nn.Sequential(SqueezeExcite(), torch.nn.BatchNorm2d(8), SqueezeExcite()).train()
    model = model.to(x.device, memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    torchfuse.reset()
    compiled = compile_strict(model, options={"target": "triton"})
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        got, want = compiled(x), twin(x)
    got.float().square().sum().backward()
    want.float().square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2)
    sunk = 0
    for items, kernels, in_place, result in recorded:
        _check_groups(items, kernels, in_place, result)
        sunk += sum(group.at > min(group.members) for group in combo.plan_launch_groups(items, kernels, in_place))
    assert sunk >= 2, sunk


def test_kernels_writing_an_input_in_place_keep_their_own_launch(recorded):
    """An optimizer-like update writes its parameters in place: another part of a launch could
    read them concurrently, so such kernels are never parts."""
    def step(p1, p2, g1, g2):
        p1.add_(g1, alpha=-0.1)
        p2.add_(g2, alpha=-0.1)
        return (p1 * 2).sum() + torch.sin(g1).sum()

    torchfuse.reset()
    args = [floats((300,), torch.float32, specials=[], seed=s) for s in range(4)]
    expected_args = [a.clone() for a in args]
    compiled = compile_strict(step, options={"target": "triton"})
    torch.testing.assert_close(compiled(*args), step(*expected_args))
    for got, want in zip(args, expected_args):
        torch.testing.assert_close(got, want)
    for items, kernels, in_place, result in recorded:
        _check_groups(items, kernels, in_place, result)


@pytest.mark.parametrize("xblock", [16, 128, 1024])
def test_every_block_size_covers_every_part(recorded, xblock):
    """A combined kernel's grid is its parts' sizes rounded up to COMBO_BLOCK, divided by the
    launch's XBLOCK: each part runs whole and programs past the last part do nothing."""
    def fn(a, b, c):
        return torch.sin(a), torch.cos(b) + 1, c * 3

    torchfuse.reset()
    sizes = (37, 1500, 1024)
    args = [floats((n,), torch.float32, specials=[], seed=n) for n in sizes]
    compile_strict(fn, options={"target": "triton"})(*args)
    _, _, _, (_, groups, combined) = recorded[0]
    (name, parts), = groups.items()
    kernel = combined[name]
    assert len(parts) == 3 and kernel.int_args == list(sizes) and int(kernel.xnumel) == 1024 + 2048 + 1024
    outputs = [torch.full((n,), float("nan"), device=args[0].device) for n in sizes]
    by_buffer = dict(zip(kernel.pointer_args, [args[0], outputs[0], args[1], outputs[1], args[2], outputs[2]]))
    assert len(by_buffer) == 6
    launch = kernel_cache.load_kernel(kernel.source, kernel.function, args[0].device.type == "cpu")
    launch[(int(kernel.xnumel) // xblock,)](*by_buffer.values(), *kernel.int_args, int(kernel.xnumel), XBLOCK=xblock)
    for got, want in zip(outputs, fn(*args)):
        torch.testing.assert_close(got, want)


def test_switch_off(monkeypatch):
    monkeypatch.setenv("TORCHFUSE_COMBINE_LAUNCHES", "0")
    model, x = _model_and_input(seed=4)
    _assert_like_eager(_compiled_output(model, x), model, x)
    (graph,) = torchfuse.report().graphs
    assert graph.combined_launches == {} and "one launch" not in graph.wrapper_source


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_combined_launches_on_the_gpu_match_separate_ones(monkeypatch):
    """On the GPU: the same results as with every kernel launched alone, and fewer launches."""
    model, x = _model_and_input(seed=5)
    model, x = model.cuda(), x.cuda()  # floats() makes CUDA tensors already on a GPU machine
    results, launches = [], []
    for switch in ("1", "0"):
        monkeypatch.setenv("TORCHFUSE_COMBINE_LAUNCHES", switch)
        torchfuse.reset()
        torch._dynamo.reset()
        compiled = compile_strict(model, options={"target": "triton"})
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(compiled(x))
        (graph,) = torchfuse.report().graphs
        launches.append(sum(1 for line in graph.wrapper_source.splitlines() if line.strip().startswith("tf_kernel")))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert launches[0] < launches[1], launches


def _lone_kernel(name: str, device: str):
    """A pointwise kernel writing one buffer from nothing, on ``device`` (no GPU needed to plan)."""
    node = Pointwise(f"buf_{name}", (8,), torch.float32, torch.device(device), Const(torch.float32, 1.0))
    item = FusedKernel(name, (8,), members=[KernelMember(node, {}, "pointwise")])
    source = f"@jit\ndef f_{name}(ptr0, xnumel, XBLOCK: tl.constexpr):\n    {flat_prologue(PROGRAM_ID)}\n"
    kernel = TritonKernel(name, source, [node.name], [], sympy.Integer(8), sympy.Integer(0), "pointwise", False,
                          function=f"f_{name}")
    return item, kernel


def test_parts_of_a_launch_share_one_device():
    """A launch runs on one GPU: kernels on another device keep their own launches."""
    made = [_lone_kernel(name, device) for name, device in (("a", "cuda:0"), ("b", "cuda:1"), ("c", "cuda:0"))]
    items, kernels = [item for item, _ in made], {kernel.name: kernel for _, kernel in made}
    groups = combo.plan_launch_groups(items, kernels, {})
    assert [[items[p].name for p in group.members] for group in groups] == [["a", "c"]]


def test_a_graph_from_the_disk_cache_keeps_its_combined_launches(monkeypatch, tmp_path):
    """A later process (here: the memory caches cleared) loads the combined kernels, not their
    parts, and gets the same results and report."""
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHFUSE_GRAPH_CACHE", "1")  # off in the tests (conftest.py)
    model, x = _model_and_input(seed=9)
    reports, outputs = [], []
    for _ in range(2):
        graph_cache.clear_memory()
        before = graph_cache.stats.disk_hits
        outputs.append(_compiled_output(model, x))
        (graph,) = torchfuse.report().graphs
        reports.append((graph.combined_launches, graph_cache.stats.disk_hits - before))
    assert reports[0][0] and reports[1][0] == reports[0][0]
    assert reports[1][1] == 1, reports
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    _assert_like_eager(outputs[0], model, x)
