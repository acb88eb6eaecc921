"""A fixed subset of PyTorch's OpInfo database, compiled and compared with eager.

The full sweep (every op of ``op_db``, slow) is ``python scripts/opinfo_sweep.py``; see
docs/conformance.md. This module runs 78 common ops (elementwise, reductions, views, indexing,
cat/pad, normalization) on their first few float32 samples, through the same code as the sweep,
so CI catches a regression in a rule without the hour-long sweep.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo

from conftest import TEST_TARGET
from scripts.opinfo_sweep import all_ops, compare, main, run_op

MAX_SAMPLES = 3  # the first samples of each op: enough for the rule, keeps the module under a minute

OPS = [
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding", "abs", "neg",
    "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "erf", "pow", "clamp", "where", "maximum",
    "remainder", "fmod", "sign", "floor", "round", "lerp", "addcmul", "isnan", "logical_not", "eq",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus",
    "nn.functional.leaky_relu", "nn.functional.hardtanh",
    # reductions and normalization
    "sum", "mean", "amax", "amin", "prod", "var", "std", "max.reduction_with_dim", "argmax", "argmin",
    "softmax", "log_softmax", "logsumexp", "nn.functional.layer_norm", "any", "all",
    # views
    "view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze", "flatten",
    "narrow", "select", "diagonal", "unfold",
    # indexing, concatenation, padding
    "index_select", "gather", "take_along_dim", "cat", "stack", "nn.functional.pad.constant",
    "nn.functional.pad.reflect", "nn.functional.embedding", "flip", "roll", "tril", "masked_fill",
    "__getitem__",
]


@pytest.fixture(autouse=True)
def generous_recompile_limit():
    """Each sample compiles a new closure of one code object; Dynamo counts them as recompiles."""
    names = [n for n in ("recompile_limit", "cache_size_limit") if hasattr(torch._dynamo.config, n)]
    saved = {n: getattr(torch._dynamo.config, n) for n in names}
    for n in names:
        setattr(torch._dynamo.config, n, 10000)
    yield
    for n, value in saved.items():
        setattr(torch._dynamo.config, n, value)


def test_the_subset_names_real_ops():
    known = all_ops()
    assert [name for name in OPS if name not in known] == []


@pytest.mark.parametrize("name", OPS)
def test_op_matches_eager(name):
    result = run_op(name, TEST_TARGET, "torchfuse", "float32", MAX_SAMPLES)
    failures = [s for s in result.samples if s.outcome in ("mismatch", "error")]
    assert failures == [], f"{name}: " + "; ".join(f"sample {s.index} {s.outcome}: {s.detail}" for s in failures)
    assert any(s.outcome == "pass" for s in result.samples), f"{name}: no sample ran: {result.samples}"


def test_the_sweep_runs_backends_side_by_side_in_worker_processes(tmp_path, monkeypatch):
    """Two workers share the ops; both backends run on the same samples; a crash in one backend
    is that backend's error (the other's result on the sample is kept); a deadline leaves ops
    listed as not run, and --resume runs them."""
    path = str(tmp_path / "sweep.json")
    labels = ["torchfuse aten", f"torchfuse {TEST_TARGET}"]
    common = ["--ops", "add,cat", "--max-samples", "1", "--workers", "2", "--json", path, "--progress", "1",
              "--backends", f"torchfuse:aten,torchfuse:{TEST_TARGET}"]
    assert main(common + ["--deadline", "0"]) == 0
    with open(path) as f:
        data = json.load(f)
    assert (data["complete"], data["not_run"], data["results"]) == (False, ["add", "cat"], [])

    monkeypatch.setenv("OPINFO_SWEEP_FAULTS", f"cat:torchfuse-{TEST_TARGET}:0:crash")
    assert main(common + ["--resume", path]) == 0
    with open(path) as f:
        data = json.load(f)
    assert data["complete"] and data["labels"] == labels
    counts = [data["summary"][label]["sample_counts"] for label in labels]
    assert counts == [{"pass": 2, "mismatch": 0, "error": 0, "skip": 0}, {"pass": 1, "mismatch": 0, "error": 1, "skip": 0}]
    pair = data["side_by_side"][0]
    assert pair["samples"] == 2
    [only_aten] = pair[f"torchfuse aten passes, {labels[1]} does not"]
    assert (only_aten["op"], only_aten["index"], only_aten["other"]) == ("cat", 0, "error")
    assert "worker crashed" in only_aten["detail"]


def test_a_mismatch_names_the_worst_element():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    actual = torch.tensor([[1.0, 2.0], [3.5, 4.001]])
    why = compare(actual, expected, expected.double(), "float32")
    assert "2 of 4 elements" in why and "worst at (1, 0): 3.5 vs eager 3" in why


# The comparison itself: the sweep is only as good as its judge.


def test_compare_accepts_nan_where_eager_has_nan():
    expected = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare(expected.clone(), expected, expected.double(), "float32") is None


def test_compare_rejects_nan_where_eager_has_a_number():
    expected = torch.tensor([1.0, 2.0])
    assert "NaN" in compare(torch.tensor([1.0, float("nan")]), expected, expected.double(), "float32")


def test_compare_rejects_a_number_where_eager_has_nan():
    expected = torch.tensor([1.0, float("nan")])
    assert compare(torch.tensor([1.0, 0.0]), expected, expected.double(), "float32") is not None


def test_compare_rejects_wrong_values_sign_of_infinity_dtype_and_shape():
    expected = torch.tensor([1.0, float("inf")])
    assert compare(torch.tensor([1.01, float("inf")]), expected, expected.double(), "float32") is not None
    assert compare(torch.tensor([1.0, float("-inf")]), expected, expected.double(), "float32") is not None
    assert compare(expected.double(), expected, expected.double(), "float32") is not None
    assert compare(expected[:1], expected, expected.double(), "float32") is not None
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]), None, "float32") is not None


def test_compare_allows_rounding_as_large_as_eagers():
    reference = torch.tensor([1.0, 1e8], dtype=torch.float64)
    expected = reference.float()
    assert compare(expected * (1 + 2e-7), expected, reference, "float32") is None
    assert compare((expected, 3), (expected, 3), (reference, 3), "float32") is None
    assert compare((expected, 3), (expected, 4), (reference, 4), "float32") is not None

