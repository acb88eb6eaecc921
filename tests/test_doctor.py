"""`torchfuse doctor` on the pitfall corpus (tests/pitfalls/): each pitfall is reported with the
script's own file and line and the right advice, in the result and in the printed report."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from torchfuse.tools import advice
from torchfuse.tools.doctor import run_script

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pitfalls")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name: str) -> str:
    return os.path.join(CORPUS, name)


def pitfall_line(name: str, key: str) -> int:
    """The line of ``name`` marked ``# PITFALL: key``."""
    with open(script(name), encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if re.search(rf"# PITFALL: {key}\b", line):
                return number
    raise AssertionError(f"{name} has no '# PITFALL: {key}' line")


def assert_printed(text: str, path: str, line: int, fix: str) -> None:
    assert f"{path}:{line}" in text, text
    assert fix in text, text


BREAKS = [  # script, advice key
    ("item_logging.py", advice.ITEM),
    ("tolist_in_step.py", advice.TOLIST),
    ("print_in_step.py", advice.PRINT),
    ("logging_in_step.py", advice.LOGGING),
    ("tensor_branch.py", advice.BRANCH),
    ("numpy_call.py", advice.NUMPY_CALL),
    ("unsupported_builtin.py", advice.UNSUPPORTED_CALL),
]


@pytest.mark.parametrize("name, expected", BREAKS, ids=[b[0] for b in BREAKS])
def test_graph_break_is_reported_at_its_line_with_its_fix(name, expected):
    result = run_script(script(name))
    assert result.exit_code == 0, result.error
    line = pitfall_line(name, expected.key)
    found = [b for b in result.breaks if b.file == script(name) and b.line == line]
    assert found, [(b.file, b.line, b.advice.key) for b in result.breaks]
    assert found[0].advice == expected
    assert "PITFALL" in found[0].code  # the offending source line itself
    assert_printed(result.text(width=200), script(name), line, expected.fix)


def test_item_fix_says_move_it_out_or_compile_model_and_loss_separately():
    assert "move it out of the compiled region" in advice.ITEM.fix
    assert "compile only the model and the loss function separately" in advice.ITEM.fix
    result = run_script(script("item_logging.py"))
    item = next(b for b in result.breaks if b.advice.key == "item")
    assert "item()" in item.reason


def test_host_copy_to_numpy_is_reported_at_its_line():
    """``.cpu().numpy()``: torch 2.13 captures it (a host copy inside the graph); older versions
    break the graph there. Either way the line and the NumPy advice are reported."""
    name = "cpu_numpy.py"
    line = pitfall_line(name, "numpy")
    result = run_script(script(name))
    reported = [(b.line, b.advice.fix) for b in result.breaks] + [(f.line, f.advice.fix) for f in result.findings]
    assert (line, advice.NUMPY.fix) in reported, reported
    assert_printed(result.text(width=200), script(name), line, advice.NUMPY.fix)


def test_shape_branch_recompile_points_at_the_if():
    name = "shape_branch.py"
    line = pitfall_line(name, "shape_branch")
    result = run_script(script(name))
    branch = [r for r in result.recompiles if r.where is not None and r.where.lineno == line]
    assert branch and branch[0].advice == advice.SHAPE_BRANCH
    assert "x.size()[1]" in branch[0].guard
    assert_printed(result.text(width=200), script(name), line, advice.SHAPE_BRANCH.fix)


def test_list_append_recompiles_on_list_length():
    name = "list_append.py"
    line = pitfall_line(name, "list_mutation")
    result = run_script(script(name))
    grown = [r for r in result.recompiles if r.where is not None and r.where.lineno == line]
    assert len(grown) >= 2 and all(r.advice == advice.LIST_MUTATION for r in grown)
    assert any("len(losses) == 1" in r.guard for r in grown)
    assert_printed(result.text(width=200), script(name), line, advice.LIST_MUTATION.fix)


def test_variable_length_recompile_says_what_changed_and_advises():
    name = "variable_length.py"
    line = pitfall_line(name, "variable_shapes")
    result = run_script(script(name))
    (stats,) = [s for s in result.functions if s.name == "block"]
    assert (stats.filename, stats.lineno, stats.calls) == (script(name), line, 4)
    (recompile,) = stats.recompiles
    assert recompile.what_changed == "dim 1 of `x`: 64 \u2192 48"
    text = result.text(width=200)
    assert "dim 1 of `x`: 64 \u2192 48" in text
    for fix in ("pad inputs to a few fixed lengths", "torch._dynamo.mark_dynamic", "dynamic=True", "dynamic=False"):
        assert fix in text
    assert f"{script(name)}:{line}" in text


def test_recompile_limit_is_a_loud_warning():
    name = "recompile_limit.py"
    line = pitfall_line(name, "recompile_limit")
    result = run_script(script(name))
    (hit,) = result.limit_hits
    assert (hit.function, hit.filename, hit.lineno) == ("normalize", script(name), line)
    (stats,) = [s for s in result.functions if s.name == "normalize"]
    assert stats.limit_hits and stats.verdict()[0] is False
    assert len(stats.recompiles) == hit.limit - 1
    text = result.text(width=200)
    assert f"RECOMPILE LIMIT HIT: normalize ({script(name)}:{line})" in text
    assert "RUNS IN EAGER MODE" in text


def test_compile_time_against_run_time_and_verdict():
    name = "compile_overhead.py"
    line = pitfall_line(name, "compile_overhead")
    result = run_script(script(name))
    (stats,) = [s for s in result.functions if s.name == "scale"]
    assert (stats.lineno, stats.calls, stats.graph_count) == (line, 2, 1)
    assert stats.compile_s > 0 and stats.run_s >= 0
    paid, why = stats.verdict()
    assert paid is False and why.startswith("compiling did not pay off")
    text = result.text(width=200)
    assert f"scale ({script(name)}:{line})" in text and "compiling did not pay off" in text


def test_fullgraph_error_is_reported_as_a_break():
    name = "fullgraph_item.py"
    line = pitfall_line(name, "item")
    result = run_script(script(name))
    assert result.exit_code == 1 and "torch._dynamo.exc" in result.error
    (item,) = [b for b in result.breaks if b.line == line]
    assert item.advice == advice.ITEM and item.file == script(name)
    assert_printed(result.text(width=200), script(name), line, advice.ITEM.fix)


def test_llama_training_loop_with_item_and_variable_lengths():
    name = "llama_training.py"
    line = pitfall_line(name, "item")
    result = run_script(script(name), ["--steps", "3"])
    assert result.exit_code == 0, result.error
    (stats,) = [s for s in result.functions if s.name == "train_step"]
    assert stats.calls == 3 and stats.graph_count >= 2
    assert [b.advice.key for b in result.breaks if b.line == line] == ["item"]
    changes = [r.what_changed for r in result.recompiles]
    assert "dim 1 of `x`: 16 \u2192 12" in changes
    assert any("len(G['losses'])" in r.guard and r.advice == advice.LIST_MUTATION for r in result.recompiles)


def test_cli_prints_report_and_writes_html(tmp_path):
    page = tmp_path / "report.html"
    name = "item_logging.py"
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.path.join(ROOT, "src"))
    run = subprocess.run([sys.executable, "-m", "torchfuse", "doctor", "--html", str(page), script(name)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    line = pitfall_line(name, "item")
    assert_printed(run.stdout, script(name), line, advice.ITEM.fix)
    assert "Compiled functions" in run.stdout and "train_step" in run.stdout
    html = page.read_text()
    assert f"{script(name)}:{line}" in html and "Graph breaks" in html


def test_doctor_reports_a_failing_script(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nraise ValueError('boom')\n")
    result = run_script(str(bad))
    assert result.exit_code == 1 and "ValueError: boom" in result.error
    assert "ValueError: boom" in result.text()


def test_plain_torch_compile_routed_to_torchfuse_with_eager_baseline(tmp_path):
    user = tmp_path / "plain.py"
    user.write_text("import torch\n\n\n@torch.compile\ndef gelu_twice(x):\n"
                    "    return torch.nn.functional.gelu(x) * 2\n\n\n"
                    "for _ in range(3):\n    gelu_twice(torch.randn(16))\n")
    result = run_script(str(user), backend="torchfuse", baseline=True)
    (stats,) = result.functions
    assert (stats.name, stats.lineno, stats.calls) == ("gelu_twice", 4, 3)
    assert stats.graphs and all(g.compile_id for g in stats.graphs)  # torchfuse compiled them
    assert stats.eager_s_per_call is not None and stats.eager_s_per_call > 0  # measured by the baseline run
    assert "eager takes" in stats.verdict()[1]


def test_cuda_graph_reasons_are_listed_with_a_fix(tmp_path):
    script = tmp_path / "ro.py"
    script.write_text("import torch\nimport torchfuse\n"
                      "f = torchfuse.compile(lambda x: torch.relu(x) + 1, mode='reduce-overhead')\n"
                      "for _ in range(3):\n    f(torch.randn(8))\n")
    result = run_script(str(script))
    text = result.text()
    assert "CUDA graphs (mode='reduce-overhead')" in text
    assert "not used: the graph does not run on a CUDA device" in text and "CUDA graphs need CUDA tensors" in text
