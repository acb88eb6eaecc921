"""``torchfuse.explain``, ``torchfuse.warmup`` and the per-kernel bytes in the report."""
from __future__ import annotations

import inspect

import torch

import torchfuse
from conftest import compile_strict
from torchfuse.diagnostics.model import is_view_op
from torchfuse.tools import advice


def line_of(fn, text: str) -> int:
    """The file line of the first line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def log_and_scale(x):
    y = torch.relu(x) * 2
    scale = y.sum().item()
    return y / scale


def test_explain_reports_break_with_file_line_code_and_fix():
    x = torch.randn(4, 8)
    result = torchfuse.explain(log_and_scale, x)
    assert result.graph_count == 2 and result.break_count == 1
    (info,) = result.graph_breaks
    assert (info.file, info.line) == (__file__, line_of(log_and_scale, ".item()"))
    assert info.code == "scale = y.sum().item()"
    assert "item()" in info.reason and info.advice == advice.ITEM
    text = str(result)
    assert f"{__file__}:{info.line}" in text and advice.ITEM.fix in text
    assert torch.allclose(result.output, log_and_scale(x))  # it ran, with the same answer as eager


def branchy(x):
    if x.mean() > 0:
        return x * 2
    return x - 1


def test_explain_data_dependent_branch():
    result = torchfuse.explain(branchy, torch.ones(8))
    (info,) = result.graph_breaks
    assert info.line == line_of(branchy, "if x.mean()") and info.advice == advice.BRANCH
    assert "torch.where" in info.advice.fix


def noisy(x):
    y = x + 1
    print("step")
    return y * 2


def test_explain_fullgraph_error_is_a_break():
    result = torchfuse.explain(torchfuse.compile(noisy, fullgraph=True), torch.randn(4))
    assert isinstance(result.error, torch._dynamo.exc.Unsupported)
    (info,) = result.graph_breaks
    assert info.line == line_of(noisy, "print(") and info.advice == advice.PRINT
    assert "fullgraph=True" in str(result)


def softmax_scale(x, w):
    return torch.softmax(x @ w, -1) * 2 + torch.cummax(x, 0)[0].sum()


def test_explain_fusion_summary_fallbacks_and_bytes():
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    result = torchfuse.explain(compile_strict(softmax_scale), x, w)
    assert result.graph_breaks == [] and result.graph_count == 1
    (graph,) = result.graphs
    assert "aten.cummax" in result.fallbacks  # no lowering: runs as an ATen call
    summary = result.fusion
    assert summary.generated_kernels == len(graph.generated_kernels) >= 1
    assert summary.eager_kernels == sum(1 for op in graph.aten_ops if not is_view_op(op))
    assert summary.eager_kernels > summary.generated_kernels + summary.extern_calls
    assert summary.bytes_moved == graph.bytes_moved < summary.eager_bytes == graph.eager_bytes
    mm = next(k for k in graph.kernels if k.ops == ["aten.mm.default"])
    assert [(a.shape, a.bytes) for a in mm.reads] == [("f32[8, 16]", 512), ("f32[16, 16]", 1024)]
    assert [(a.shape, a.bytes) for a in mm.writes] == [("f32[8, 16]", 512)]
    assert mm.eager_bytes == 512 + 1024 + 512
    assert "generated kernels" in str(result) and "eager" in str(summary)


def twice_plus_one(x):
    return x * 2 + 1


def test_pointwise_chain_bytes_against_eager():
    compiled = compile_strict(twice_plus_one)
    compiled(torch.randn(4, 8))
    (graph,) = torchfuse.report().graphs
    (kernel,) = graph.kernels
    assert [a.bytes for a in kernel.reads] == [128] and [a.bytes for a in kernel.writes] == [128]
    # eager: mul reads x and writes t (256 B), add reads t and writes out (256 B)
    assert kernel.eager_bytes == graph.eager_bytes == 512
    assert graph.eager_kernel_count == 2


def test_symbolic_sizes_are_evaluated_at_the_example_sizes():
    compiled = compile_strict(twice_plus_one, dynamic=True)
    compiled(torch.randn(6, 8))
    (graph,) = torchfuse.report().graphs
    (kernel,) = graph.kernels
    (read,) = kernel.reads
    assert read.bytes == 6 * 8 * 4 and read.size_expr  # the expression of the symbolic size is kept


def block(x, w):
    return torch.nn.functional.gelu(x @ w)


def test_warmup_compiles_ahead_and_reports_reuse():
    compiled = torchfuse.compile(block)
    w = torch.randn(8, 8)
    report = torchfuse.warmup(compiled, [(torch.randn(2, n, 8), w) for n in (64, 48, 80)])
    first, second, third = report.entries
    assert not first.reused and first.frames_compiled == 1 and first.inputs == "(f32[2, 64, 8], f32[8, 8])"
    assert not second.reused and second.reasons == ["dim 1 of `x`: 64 \u2192 48"]
    assert third.reused  # the recompile made a shape-generic graph
    assert report.compiled == 2 and "reused" in str(report)
    # The real step with a new length compiles nothing.
    after = torchfuse.warmup(compiled, [(torch.randn(2, 33, 8), w)])
    assert after.entries[0].reused


def test_warmup_backward_compiles_backward_graph():
    model = torch.nn.Linear(8, 8)
    compiled = compile_strict(model)
    report = torchfuse.warmup(compiled, [torch.randn(4, 8)], backward=True)
    kinds = [g.kind for g in torchfuse.report().graphs]
    assert "forward" in kinds and "backward" in kinds
    assert report.entries[0].graphs and model.weight.grad is None  # no .grad touched
