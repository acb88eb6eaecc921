"""The whole-graph cache (runtime/graph_cache.py): a graph compiled again, in this process or a
later one, skips the stages and gives the same kernels, results and report; any change that could
change the code is a miss."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, compile_strict
from torchfuse.runtime import graph_cache


@pytest.fixture
def cache_on(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_GRAPH_CACHE", "1")
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _restored() -> list[bool]:
    return ["graph cache" in g.stage_seconds for g in torchfuse.report().graphs]


def _compile_twice(fn, *make_inputs, dynamic=None, backward=False):
    """Compile and run ``fn`` twice, forgetting everything in memory in between; returns the outputs
    (and input gradients), reports and whether each graph came from the cache, per compile."""
    runs = []
    for _ in range(2):
        torchfuse.reset()
        inputs = [make() for make in make_inputs]
        out = compile_strict(fn, dynamic=dynamic)(*inputs)
        grads = []
        if backward:
            out.sum().backward()
            grads = [x.grad for x in inputs if x.requires_grad]
        reports = [(g.kind, [(k.name, k.kind, k.source) for k in g.kernels], g.wrapper_source,
                    [str(d) for d in g.fusions]) for g in torchfuse.report().graphs]
        runs.append((out, grads, reports, _restored()))
    return runs


def _tensor(*shape, grad=False, seed=0):
    """A maker of the same fresh tensor each call."""
    return lambda: torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE).requires_grad_(grad)


def _mutating(x, y):
    x.mul_(2).add_(y)
    return (x * y).sum(-1)


def _with_constant(x):
    return x * torch.tensor([1.5, -2.0, 0.25], device=x.device)


CASES = {
    "softmax_and_gelu": (lambda x, b: (F.gelu(x + b), x.softmax(-1)), [_tensor(37, 61), _tensor(61, seed=1)]),
    "matmul_epilogue": (lambda x, w: torch.relu(x @ w) * 0.5, [_tensor(33, 40), _tensor(40, 24, seed=1)]),
    "input_mutation": (_mutating, [_tensor(9, 13), _tensor(9, 13, seed=1)]),
    "tensor_constant": (_with_constant, [_tensor(5, 3)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (96,), w, b), [_tensor(17, 96), _tensor(96, seed=1), _tensor(96, seed=2)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_graph_compiled_again_comes_from_the_cache(cache_on, name):
    fn, make_inputs = CASES[name]
    (first, _, first_reports, first_restored), (again, _, again_reports, again_restored) = \
        _compile_twice(fn, *make_inputs)
    assert first_restored and not any(first_restored)
    assert again_restored and all(again_restored)
    for a, b in zip(torch.utils._pytree.tree_leaves(first), torch.utils._pytree.tree_leaves(again)):
        assert torch.equal(a, b)  # the same kernels on the same inputs: the same bits
    assert again_reports == first_reports


def test_training_graphs_come_from_the_cache_and_give_the_same_gradients(cache_on):
    fn = lambda x, w: (torch.tanh(x @ w) * x.sum(-1, keepdim=True)).softmax(-1)  # noqa: E731
    first, again = _compile_twice(fn, _tensor(12, 20, grad=True), _tensor(20, 20, grad=True, seed=1), backward=True)
    assert [g for g in first[3]] == [False, False] and again[3] == [True, True]  # forward, backward
    assert torch.equal(first[0], again[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], again[1]))


def test_a_dynamic_graph_from_the_cache_serves_every_size(cache_on):
    fn = lambda x: (x * x.sigmoid()).sum(-1)  # noqa: E731
    for size, expect_restored in ((5, False), (7, True)):
        torchfuse.reset()
        compiled = compile_strict(fn, dynamic=True)
        for rows in (size, size + 4):
            x = torch.randn(rows, 11).to(DEVICE)
            torch.testing.assert_close(compiled(x), fn(x))
        assert _restored() == [expect_restored]


def test_any_change_that_could_change_the_code_is_a_miss(cache_on):
    """The same ops with another scalar, shape, dtype, layout or constant value compile anew."""
    x = torch.randn(6, 10).to(DEVICE)
    variants = [
        (lambda x: x * 2.0, x),
        (lambda x: x * 3.0, x),
        (lambda x: x * 2.0, x[:, :9]),  # another shape, and strided
        (lambda x: x * 2.0, x.double()),
        (lambda x: x * 2.0, x.t()),
        (_with_constant, torch.randn(4, 3).to(DEVICE)),
    ]
    for fn, value in variants:
        torchfuse.reset()
        torch.testing.assert_close(compile_strict(fn)(value), fn(value))
        assert _restored() == [False], fn
    # The constant inlined into the kernel (0-d), another value: the graphs' code is the same.
    for scale, expect_restored in ((2.5, False), (2.5, True), (-4.0, False)):
        torchfuse.reset()
        fn = lambda x, s=scale: x * torch.tensor(s, device=x.device)  # noqa: E731
        torch.testing.assert_close(compile_strict(fn)(x), x * scale)
        assert _restored() == [expect_restored], scale


def test_a_damaged_entry_is_a_miss_and_is_replaced(cache_on):
    fn = lambda x: torch.tanh(x) + 1  # noqa: E731
    x = torch.randn(8, 8).to(DEVICE)
    compile_strict(fn)(x)
    (entry,) = list((cache_on / "graphs").rglob("*.pkl"))
    entry.write_bytes(b"not a pickle")
    torchfuse.reset()
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    assert _restored() == [False]
    torchfuse.reset()
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    assert _restored() == [True]  # written again by the compile that missed


def test_a_later_process_compiles_nothing(cache_on):
    """A second process restores the graph from disk: no lowering, no C++ compiler call."""
    script = (
        "import sys; sys.path[:0] = [%r, %r]\n"
        "import torch, torchfuse\n"
        "from conftest import compile_strict\n"
        "from torchfuse.runtime import cpp_build\n"
        "x = torch.linspace(-3, 3, 60).reshape(6, 10)\n"
        "out = compile_strict(lambda x: torch.nn.functional.silu(x).sum(0))(x)\n"
        "(graph,) = torchfuse.report().graphs\n"
        "print(sorted(graph.stage_seconds), cpp_build.stats.compiler_calls, out.sum().item())\n"
    ) % (str(Path(__file__).parents[1] / "src"), str(Path(__file__).parent))
    lines = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")[-2]
             for _ in range(2)]
    assert lines[0].startswith("['aten', 'ir', 'kernels', 'schedule', 'wrapper']")
    assert lines[1].startswith("['graph cache'] 0 ")
    assert lines[0].split()[-1] == lines[1].split()[-1]  # the same result


def test_the_cache_is_off_when_stages_are_dumped(cache_on, capsys):
    fn = lambda x: x.exp() - 1  # noqa: E731
    x = torch.randn(4, 4).to(DEVICE)
    for _ in range(2):
        torchfuse.reset()
        compile_strict(fn, options={"dump": ["kernels"]})(x)
        assert _restored() == [False]
    assert "stage kernels" in capsys.readouterr().out
