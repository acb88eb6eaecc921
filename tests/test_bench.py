"""`torchfuse bench`: runs the suites, checks accuracy, writes results.json/.md/.png (on a CPU here)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from torchfuse.bench import cases, measure, models, output, runner, suites
from torchfuse.bench.runner import main
from torchfuse.frontend import aot_cache


def test_bench_writes_every_result_file_with_sound_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFUSE_GRAPH_CACHE", "1")  # the caches a warm process finds (off in tests)
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
        # torchfuse's warm process took every captured graph from the warm cache: no tracing.
        if aot_cache.install_hooks() is None:  # a torch the warm cache was written for
            assert result["tf_split_warm"]["aot_hits"] >= 1 and result["tf_split_warm"]["aot_misses"] == 0
            assert result["tf_split_cold"]["aot_misses"] >= 1
        assert 0 <= result["tf_split_warm"]["gc"]
        assert result["bytes_moved"] > 0  # memory-bound: bandwidth is reported
    assert payload["copy_gbs"] > 0
    markdown = (tmp_path / "results.md").read_text()
    assert "| bias_gelu | micro |" in markdown and "geometric-mean speedup" in markdown
    assert "warm s ind/tf/dyn" in markdown and "in backend warm s ind/tf" in markdown
    assert "gc s; warm hit/miss" in markdown
    assert (tmp_path / "results.png").stat().st_size > 0


def test_bench_rejects_unknown_cases_and_backends(tmp_path, capsys):
    assert main(["--cases", "no_such_case", "--out", str(tmp_path)]) == 2
    assert "unknown case" in capsys.readouterr().out
    assert main(["--backends", "eager,tvm", "--out", str(tmp_path)]) == 2
    assert "backends must" in capsys.readouterr().out


def test_gpu_models_are_not_selected_on_a_cpu():
    names = {c.name for c in suites.select("models", torch.device("cpu"))}
    assert names == {"mlp", "transformer_block", "convnet"}
    assert "resnet50_infer" in {c.name for c in suites.select("models", torch.device("cuda"))}


def test_gpu_models_suite_spans_families_modes_and_precisions():
    """Issue 14: at least 12 GPU models across families, inference and training steps."""
    gpu = {c.name for c in suites.select("models", torch.device("cuda"))}
    assert len(gpu) >= 12
    assert {"mistral_train", "llama_hf_infer", "t5_train", "distilbert_infer", "mobilenetv3_train",
            "convnext_tiny_infer", "swin_t_train", "resnet50_infer", "vit_b16_train"} <= gpu
    assert any(n.endswith("_train") for n in gpu) and any(n.endswith("_infer") for n in gpu)


@pytest.mark.parametrize("case", models.GPU_CASES, ids=lambda c: c.name)
def test_gpu_model_quick_variants_build_and_run_eagerly_on_a_cpu(case):
    """Each GPU case's tiny variant builds from a config (no download) and runs; its outputs line
    up with its float64 reference, where it has one. Skipped, with why, without the library."""
    if case.missing():
        pytest.skip(f"needs {', '.join(case.missing())}")
    workload = case.build(torch.device("cpu"), True)
    out = measure.flat_tensors(workload.make_step(lambda fn: fn)())
    assert out and all(torch.isfinite(t).all() for t in out)
    if workload.reference is not None:
        errors = runner.output_errors(out, workload.reference())
        assert len(errors) == len(out) and all(math.isfinite(e) for e in errors)
        assert errors[0] < 5e-2  # the logits, or a training step's loss


def test_each_output_is_bounded_by_eagers_error_on_it():
    """A gradient that is zero in exact arithmetic is noise in every backend: it may not fail a
    correct compile, nor loosen the bound of the other outputs."""
    result = runner.CaseResult("c", "models")
    eager = [1e-3, 3e12, 0.2]  # the loss, a key bias's gradient (zero in exact arithmetic), a noisy one
    runner._judge(result, {"eager": eager, "torchfuse": [1.5e-3, 5e12, 0.6]}, torch.bfloat16)
    assert result.accurate("torchfuse") and result.error_ratio["torchfuse"] == pytest.approx(0.75)
    runner._judge(result, {"eager": eager, "torchfuse": [2e-2, 3e12, 0.2]}, torch.bfloat16)
    result.rel_err = {"eager": 3e12, "torchfuse": 3e12}
    assert not result.accurate("torchfuse") and result.error_ratio["torchfuse"] == pytest.approx(4.0)
    assert "outside its error bound" in result.problems()[0]


def _mlp_case() -> cases.Case:
    (case,) = suites.select("models", torch.device("cpu"), {"mlp"})
    return case


def test_bench_shows_graphs_torchfuse_ran_with_aten(monkeypatch):
    """A graph torchfuse could not compile runs with ATen (a warning the bench silences): the row
    must say so, and it counts as a problem (exit status 1)."""
    from torchfuse import pipeline

    def fail(state):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(pipeline, "STAGES", [("fail", fail)])
    result = runner.run_case(_mlp_case(), ["eager", "torchfuse"], torch.device("cpu"), True, 1, lambda _: None)
    assert result.tf_graphs == 1 and "injected failure" in result.tf_fallbacks[0]
    assert output.torchfuse_status(result).startswith("ATEN 1/1")
    assert "ran 1 of 1 graphs with ATen" in result.problems()[0]
    assert "ATen" in output.markdown([result], {}, math.nan, 1, True).split("Problems:")[1]


def test_a_case_that_cannot_be_built_is_a_failure_not_a_skip():
    def build(device, quick):
        raise ValueError("bad config")

    case = cases.Case("broken", "models", ("cpu",), build)
    result = runner.run_case(case, ["eager", "torchfuse"], torch.device("cpu"), True, 1, lambda _: None)
    assert not result.skipped and "bad config" in result.errors["build"]
    assert result.problems() and output.rows([result], math.nan)[1][0][-1] == "FAIL"


def test_relative_error_never_accepts_nan():
    ref = torch.ones(4)
    assert measure.relative_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref) == float("inf")
    assert measure.relative_error(ref.clone(), ref) == 0.0


@pytest.mark.parametrize("name", ["mlp", "convnet"])
def test_cpu_model_workloads_match_their_float64_reference(name):
    (case,) = suites.select("models", torch.device("cpu"), {name})
    workload = case.build(torch.device("cpu"), True)
    out = workload.make_step(lambda fn: fn)()
    assert measure.relative_error(out, workload.reference()) < 1e-5


def test_profiles_show_wall_against_gpu_time_and_host_cost_per_launch(capsys):
    from torchfuse.bench.profile import KernelTime, StepProfile

    result = runner.CaseResult("gpt2_infer", "models")
    result.profiles = {"eager": StepProfile(10.0, 6.0, 7.0, 200, [KernelTime("gemm", 3.0, 24)]),
                       "torchfuse": StepProfile(4.0, 2.5, 3.5, 100, [KernelTime("kernel3", 0.5, 12)])}
    assert result.profiles["torchfuse"].host_us_per_launch == 35.0
    assert result.profiles["eager"].wall_over_gpu == 10.0 / 6.0
    text = output.markdown([result], {}, math.nan, 1, True)
    assert "gpt2_infer             torchfuse     4.000    2.500     1.60      100    3.500      35.0" in text
    assert "kernel3 0.500 ms x12" in text
    output.print_table([result], math.nan)
    assert "us/launch" in capsys.readouterr().out


@pytest.mark.gpu
def test_profile_of_a_gpu_case():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    case = next(c for c in suites.all_cases() if c.name == "layer_norm")
    result = runner.run_case(case, ["eager", "torchfuse"], torch.device("cuda"), True, 3, lambda _: None, True)
    for backend in ("eager", "torchfuse"):
        p = result.profiles[backend]
        assert p.launches >= 1 and 0 < p.gpu_ms <= p.wall_ms and p.top


def test_max_autotune_backends_get_columns_of_their_own():
    """torchfuse-max-autotune and inductor-max-autotune: speed columns beside the default modes,
    cold/warm compile columns, torchfuse's autotuning split, and a warm process that timed
    launches again is a problem."""
    assert {"torchfuse-max-autotune", "inductor-max-autotune"} <= set(runner.BACKENDS)
    assert {"torchfuse-max-autotune", "inductor-max-autotune"} <= set(runner.CUDA_GRAPH_BACKENDS)
    result = runner.CaseResult("layer_norm", "micro", error_bound=1e-4)
    result.ms = {"eager": 2.0, "inductor": 1.0, "torchfuse": 1.0, "inductor-max-autotune": 0.8,
                 "torchfuse-max-autotune": 0.5}
    result.cold_s = {"torchfuse-max-autotune": 3.0, "inductor-max-autotune": 30.0}
    result.warm_s = {"torchfuse-max-autotune": 0.4, "inductor-max-autotune": 2.0}
    result.tf_autotune_split_cold = {"autotune": 1.25, "autotuned": 7.0}
    result.tf_autotune_split_warm = {"autotune": 0.01, "autotuned": 0.0}
    result.rel_err = {backend: 1e-6 for backend in result.ms}
    header, table = output.rows([result], math.nan)
    row = dict(zip(header, table[0]))
    assert row["torchfuse-max-autotune ms"] == "0.500" and row["torchfuse-max-autotune x"] == "4.00x"
    assert row["inductor-max-autotune x"] == "2.50x"
    header, table = output.compile_rows([result])
    row = dict(zip(header, table[0]))
    assert row["torchfuse-max-autotune cold/warm s"] == "3.00/0.40"
    assert row["tf max-autotune: autotune s (launches timed) cold/warm"] == "1.25 (7) / 0.01 (0)"
    assert not result.problems()
    result.tf_autotune_split_warm["autotuned"] = 3.0
    assert any("autotune cache missed" in problem for problem in result.problems())
    assert compile_time_backends_known()


def compile_time_backends_known() -> bool:
    from torchfuse.bench import compile_time

    return all(callable(compile_time.compiler_for(b)) for b in runner.BACKENDS)


def test_profiled_backends_are_timed_in_turn_round_by_round(monkeypatch):
    """A slow spell of the machine must fall on every backend alike: rounds alternate them."""
    from torchfuse.bench import profile

    order: list[str] = []
    monkeypatch.setattr(profile.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(profile, "_kernel_times", lambda step, steps: {
        "k": profile.KernelTime("k", 1.0, 2.0)})
    steps = {name: (lambda name=name: order.append(name)) for name in ("eager", "inductor", "torchfuse")}
    profiles = profile.profile_steps(steps, rounds=3)
    assert order == ["eager", "inductor", "torchfuse"] * 3
    assert set(profiles) == set(steps) and all(p.gpu_ms == 1.0 and p.launches == 2.0 for p in profiles.values())
