"""Shared test helpers: compile with the test target (C++ on CPU, Triton on GPU), compare with float64.

``compile_strict`` compiles for ``TEST_TARGET``: ``$TORCHFUSE_TEST_TARGET`` if set, else
``triton`` with a GPU (or without a C++ compiler) and ``cpp`` on CPU-only machines (CI).
On those, the modules in ``TRITON_TOO`` run twice, ``[cpp]`` and ``[triton]`` (Triton's interpreter),
so the Triton renderer stays tested without a GPU while the whole suite runs on C++.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

import torchfuse

# Generated kernels go to a per-session cache so tests never see a stale one. The process that
# made it removes it at exit (pytest-xdist's workers inherit the variable and share the folder).
if "TORCHFUSE_CACHE_DIR" not in os.environ:
    os.environ["TORCHFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchfuse-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TORCHFUSE_CACHE_DIR"], ignore_errors=True)
# Nor another test's compile of the same graph (a test that breaks a stage on purpose must reach
# it): the whole-graph cache is off, except in tests/test_graph_cache.py.
os.environ.setdefault("TORCHFUSE_GRAPH_CACHE", "0")

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"


def _default_target() -> str:
    from torchfuse.runtime.cpp_build import compiler_available

    return "triton" if HAS_GPU or not compiler_available() else "cpp"


TEST_TARGET = os.environ.get("TORCHFUSE_TEST_TARGET") or _default_target()
# The renderer-level tests (every op, reduction and gather): also through Triton's interpreter.
TRITON_TOO = {"test_elementwise.py", "test_reductions.py", "test_indexing.py", "test_patterns.py", "test_mutation.py",
              "test_embedding_backward.py", "test_bandwidth.py",
              "test_reader_layout.py"}
_target = [TEST_TARGET]  # the target of the running test (see the compile_target fixture)

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9, torch.float16: 2e-2, torch.bfloat16: 3e-2}


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


def pytest_generate_tests(metafunc):
    module = os.path.basename(str(metafunc.module.__file__))
    if TEST_TARGET == "cpp" and module in TRITON_TOO and "compile_target" in metafunc.fixturenames:
        metafunc.parametrize("compile_target", ["cpp", "triton"], indirect=True)


@pytest.fixture(autouse=True)
def compile_target(request):
    """The target ``compile_strict`` uses in this test (parametrized for ``TRITON_TOO``)."""
    _target[0] = getattr(request, "param", TEST_TARGET)
    yield _target[0]
    _target[0] = TEST_TARGET


@pytest.fixture(autouse=True)
def fresh_state():
    torchfuse.reset()
    yield
    torchfuse.reset()


def compile_strict(fn, **kwargs):
    """Compile with the test's target forced (see ``TEST_TARGET``), failing loudly on any internal error.

    ``TORCHFUSE_TEST_DYNAMIC=1`` compiles every test that does not choose with ``dynamic=True``:
    the same suite then exercises symbolic sizes (kernels generic in every size).
    """
    options = {"target": _target[0], "strict": True}
    options.update(kwargs.pop("options", {}))
    if kwargs.get("dynamic") is None and os.environ.get("TORCHFUSE_TEST_DYNAMIC") == "1":
        kwargs["dynamic"] = True
    return torchfuse.compile(fn, options=options, **kwargs)


def compile_cpp(fn, **kwargs):
    """Compile for the C++ target (on any machine), failing loudly on any internal error."""
    options = {"target": "cpp", "strict": True}
    options.update(kwargs.pop("options", {}))
    return torchfuse.compile(fn, options=options, **kwargs)


def to_float64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, (list, tuple)):
        return type(value)(to_float64(v) for v in value)
    return value


def assert_close(actual, expected, dtype=None, reference=None):
    """``actual`` vs ``expected`` (eager) with the float64 ``reference`` deciding the tolerance.

    Passes when the compiled result is as close to the float64 result as eager is, up to
    the dtype's tolerance. NaN must appear exactly where eager has NaN.
    """
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        refs = reference if reference is not None else [None] * len(expected)
        for a, e, r in zip(actual, expected, refs):
            assert_close(a, e, dtype, r)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if not expected.is_floating_point():
        assert torch.equal(actual.cpu(), expected.cpu()), f"{actual} != {expected}"
        return
    nan_expected = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan_expected), "NaN where eager has none (or the reverse)"
    tol = TOLERANCE[dtype or expected.dtype]
    ref = (reference if reference is not None else expected).to(torch.float64)
    a, e = actual.to(torch.float64), expected.to(torch.float64)
    finite = ~nan_expected & torch.isfinite(ref)
    assert torch.equal(actual[~finite & ~nan_expected].to(torch.float64), e[~finite & ~nan_expected])
    scale = ref[finite].abs().max().item() if finite.any() else 1.0
    error = (a[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    eager_error = (e[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    assert error <= max(2 * eager_error, tol * max(scale, 1.0)), f"max error {error:.3g} (eager {eager_error:.3g}, scale {scale:.3g})"


def generated_kernel_count() -> int:
    return sum(len(g.generated_kernels) for g in torchfuse.report().graphs)
