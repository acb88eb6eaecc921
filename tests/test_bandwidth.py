"""Generated kernels' bandwidth for ``torchfuse bench --profile`` and scripts/gpu_profile.py
(bench/bandwidth.py): bytes from the report, time from the profiler, share of a copy."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import torchfuse
from conftest import compile_strict
from torchfuse.bench import bandwidth, output, runner
from torchfuse.bench.profile import KernelTime, StepProfile


@pytest.fixture
def compiled_kernel_name(compile_target):
    """A pointwise kernel over a [512, 1024] float32 input: 2 MB read, 2 MB written."""
    if compile_target != "triton":
        pytest.skip("the profiler names Triton kernels")
    x = torch.randn(512, 1024)
    compile_strict(lambda t: t * 2 + 1)(x)
    (kernel,) = [k for g in torchfuse.report().graphs for k in g.kernels if k.source]
    return bandwidth.kernel_function_name(kernel.source)


def test_a_kernel_is_named_as_the_profiler_shows_it_and_sized_from_the_report(compiled_kernel_name):
    assert compiled_kernel_name.startswith("tf_poi_")
    sizes = bandwidth.generated_kernel_bytes(torchfuse.report().graphs)
    assert sizes == {compiled_kernel_name: [2 * 512 * 1024 * 4]}


def test_bandwidth_is_bytes_over_time_per_call_slowest_share_first():
    sizes = {"tf_a": [100 << 20], "tf_b": [10 << 20]}
    kernels = [KernelTime("tf_a", 0.4, 2), KernelTime("tf_b", 0.01, 1), KernelTime("nvjet_gemm", 1.0, 3)]
    rows = bandwidth.kernel_bandwidths(kernels, sizes, copy_gbs=4000.0)
    assert [r.name for r in rows] == ["tf_a", "tf_b"]  # cuBLAS's GEMM has no size here
    a = rows[0]
    assert a.us_per_call == pytest.approx(200.0)
    assert a.gbs == pytest.approx((100 << 20) / 200e-6 / 1e9)
    assert a.share == pytest.approx(a.gbs / 4000.0)
    assert bandwidth.worst_big_kernels(rows) == [a]  # tf_b moves less than 64 MB
    line = bandwidth.format_bandwidths("case", rows)
    assert "tf_a 100 MB in 200.0 us" in line and "< 70%" in line


def test_a_kernel_run_at_several_sizes_gets_the_mean_of_its_calls():
    """A size-generic kernel (a flat pointwise one) under one name: each size runs once a step."""
    def graph(*moved):
        kernels = [SimpleNamespace(source="@triton.jit\ndef tf_poi_x(ptr0):\n    pass", bytes_read=m, bytes_written=8)
                   for m in moved]
        return SimpleNamespace(kernels=kernels)

    sizes = bandwidth.generated_kernel_bytes([graph(64, 128), graph(192)])
    assert sizes == {"tf_poi_x": [72, 136, 200]}
    (row,) = bandwidth.kernel_bandwidths([KernelTime("tf_poi_x", 0.003, 3)], sizes, 1000.0)
    assert row.bytes == 136 and row.us_per_call == pytest.approx(1.0)
    # calls that do not split evenly over the sizes: no figure rather than a guess
    assert bandwidth.kernel_bandwidths([KernelTime("tf_poi_x", 0.003, 4)], sizes, 1000.0) == []
    assert bandwidth.generated_kernel_bytes([graph(None)]) == {}


def test_bench_output_lists_the_worst_big_kernels_per_torchfuse_backend(capsys):
    result = runner.CaseResult("bert_mlm_train", "models")
    result.profiles = {"torchfuse": StepProfile(4.0, 2.5, 3.5, 100, [KernelTime("tf_red_1", 1.0, 1)])}
    result.bandwidths = {"torchfuse": bandwidth.kernel_bandwidths(result.profiles["torchfuse"].top,
                                                                  {"tf_red_1": [2 << 30]}, 4000.0)}
    text = output.markdown([result], {}, 4000.0, 1, True)
    assert "bert_mlm_train / torchfuse: worst kernels of 64 MB or more: tf_red_1 2048 MB in 1000.0 us" in text
    output.print_table([result], math.nan)
    assert "tf_red_1" in capsys.readouterr().out
