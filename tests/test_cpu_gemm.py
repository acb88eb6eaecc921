"""Linear layers on the C++ target use oneDNN where it measured faster than MKL (lowering/cpu_gemm.py)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import torchfuse
from conftest import compile_cpp
from torchfuse.lowering import cpu_gemm
from torchfuse.runtime import cpp_build

pytestmark = [pytest.mark.skipif(not cpp_build.compiler_available(), reason="needs a C++ compiler"),
              pytest.mark.skipif(not cpu_gemm._onednn_available(), reason="needs oneDNN")]


@pytest.fixture
def choice(monkeypatch):
    """Decide the library without timing: ``choice.value`` says whether oneDNN wins."""
    class Choice:
        value = True
        asked: list = []

    def decide(*shape):
        Choice.asked.append(shape)
        return Choice.value

    monkeypatch.setattr(cpu_gemm, "_onednn_is_faster", decide)
    Choice.asked = []
    return Choice


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 300)).eval()


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "mkl"])
def test_linear_layers_match_float64_with_either_library(choice, onednn):
    choice.value = onednn
    model, x = _mlp(), torch.randn(300, 64)
    with torch.no_grad():
        got = compile_cpp(model)(x)
        want = copy.deepcopy(model).double()(x.double())
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4), (got.double() - want).abs().max()
    wrapper = torchfuse.report().graphs[0].wrapper_source
    assert ("mkldnn._linear_pointwise" in wrapper) == onednn, wrapper
    # fc1's bias moved into the GELU kernel (bias_epilogue), so only fc2 passes one.
    assert sorted(choice.asked) == [(300, 64, 1024, False), (300, 1024, 300, True)]


def test_only_float32_linear_layers_of_some_size_are_considered(choice):
    def fn(x, w, w64, b2d):
        small = x[:4, :8] @ w[:8, :8].t()  # a few multiply-adds
        doubles = (x.double() @ w64.t()).float()  # float64
        full_bias = torch.addmm(b2d, x, w.t())  # a [M, N] addend, not a linear bias
        return small, doubles, full_bias

    x, w = torch.randn(512, 256), torch.randn(512, 256)
    compile_cpp(fn)(x, w, w.double(), torch.randn(512, 512))
    assert choice.asked == []


def test_the_timing_uses_real_tensors_inside_a_fake_mode(monkeypatch):
    """Compiling runs inside AOTAutograd's fake mode: timing fake tensors timed nothing, and
    every choice came out as whichever library's Python path was shorter."""
    seen = []

    def fake_time(run):
        seen.append(run())
        return 1.0

    monkeypatch.setattr(cpu_gemm, "_best_time", fake_time)
    monkeypatch.setattr(cpu_gemm, "_choices", {})
    with FakeTensorMode():
        cpu_gemm._onednn_is_faster(64, 256, 1024, True)
    assert len(seen) == 2 and not any(isinstance(t, FakeTensor) for t in seen)
