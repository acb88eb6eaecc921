"""`torchfuse bench`: runs the suites, checks accuracy, writes results.json/.md/.png (on a CPU here)."""
from __future__ import annotations

import json

import pytest
import torch

from torchfuse.bench import cases, measure
from torchfuse.bench.runner import main


def test_bench_writes_every_result_file_with_sound_numbers(tmp_path):
    status = main(["--quick", "--device", "cpu", "--suite", "micro", "--cases", "bias_gelu,layer_norm",
                   "--out", str(tmp_path), "--repeats", "2"])
    assert status == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    assert [r["case"] for r in payload["results"]] == ["bias_gelu", "layer_norm"]
    for result in payload["results"]:
        assert set(result["ms"]) == {"eager", "inductor", "torchfuse"}
        assert all(ms > 0 for ms in result["ms"].values())
        assert result["rel_err"]["torchfuse"] <= result["error_bound"]
        assert result["cold_s"]["torchfuse"] > 0 and result["warm_s"]["torchfuse"] > 0  # second process ran
        # One warm process per backend, plus Dynamo alone (the floor under every warm time).
        assert set(result["warm_s"]) == {"inductor", "torchfuse", "dynamo"}
        assert 0 < result["warm_s"]["dynamo"] < result["cold_s"]["inductor"]
        # The part inside each backend, cold and warm: a share of the whole first call.
        for backend in ("inductor", "torchfuse"):
            assert 0 < result["backend_cold_s"][backend] < result["cold_s"][backend]
            assert 0 < result["backend_warm_s"][backend] < result["warm_s"][backend]
        assert set(result["backend_warm_s"]) == {"inductor", "torchfuse"}  # Dynamo alone has no backend
        assert result["bytes_moved"] > 0  # memory-bound: bandwidth is reported
    assert payload["copy_gbs"] > 0
    markdown = (tmp_path / "results.md").read_text()
    assert "| bias_gelu | micro |" in markdown and "geometric-mean speedup" in markdown
    assert "warm s ind/tf/dyn" in markdown and "in backend warm s ind/tf" in markdown
    assert (tmp_path / "results.png").stat().st_size > 0


def test_bench_rejects_unknown_cases_and_backends(tmp_path, capsys):
    assert main(["--cases", "no_such_case", "--out", str(tmp_path)]) == 2
    assert "unknown case" in capsys.readouterr().out
    assert main(["--backends", "eager,tvm", "--out", str(tmp_path)]) == 2
    assert "backends must" in capsys.readouterr().out


def test_gpu_models_are_not_selected_on_a_cpu():
    names = {c.name for c in cases.select("models", torch.device("cpu"))}
    assert names == {"mlp", "transformer_block", "convnet"}
    assert "resnet50_infer" in {c.name for c in cases.select("models", torch.device("cuda"))}


def test_relative_error_never_accepts_nan():
    ref = torch.ones(4)
    assert measure.relative_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref) == float("inf")
    assert measure.relative_error(ref.clone(), ref) == 0.0


@pytest.mark.parametrize("name", ["mlp", "convnet"])
def test_cpu_model_workloads_match_their_float64_reference(name):
    (case,) = cases.select("models", torch.device("cpu"), {name})
    workload = case.build(torch.device("cpu"), True)
    out = workload.make_step(lambda fn: fn)()
    assert measure.relative_error(out, workload.reference()) < 1e-5
