"""Outer reductions name their rows' chunk (codegen/triton/chunks.py): values of a whole chunk
(a layer norm's per-token statistics in its weight gradient's split stage) load as a
``[RBLOCK, 1]`` column where every lane of a program is in one chunk, and the default launch
makes that so (launch_configs.align_to_chunks). Checked on the rendered source, on the launch
rule, and for results through Triton's interpreter with both branches of the kernel: an XBLOCK
that divides the chunk and one that straddles chunks."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

import torchfuse
from conftest import DEVICE, assert_close
from helpers.rendering import rendered_kernels
from torchfuse.codegen.triton import chunks, split
from torchfuse.diagnostics.coalescing import launcher
from torchfuse.runtime import launch_configs
from torchfuse.runtime.launch_configs import Config, align_to_chunks, cdiv

SMALL = split.SplitPolicy(min_elements=256, min_programs=64, target_programs=8, min_program_elements=32, outer_lanes=4)


def layer_norm_weight_grads(grad, x, mean, rstd):
    """A layer norm's weight and bias gradients from its saved statistics (one per token)."""
    return (grad * ((x - mean) * rstd)).sum(0), grad.sum(0)


def _inputs(tokens: int, channels: int, dtype=torch.float32, device="cpu") -> list[torch.Tensor]:
    make = lambda *shape: torch.randn(*shape, device=device).to(dtype)  # noqa: E731
    return [make(tokens, channels), make(tokens, channels), make(tokens, 1).float(),
            (torch.rand(tokens, 1, device=device) + 0.5)]


def _statistics_loads(source: str) -> list[str]:
    """The loads of the [tokens, 1] statistics: their offsets name no lane."""
    return [line for line in source.splitlines() if "tl.load(" in line and "xindex" not in line
            and "xlane" not in line and "rindex" in line]


@pytest.mark.parametrize("channels", [768, 96])
def test_row_statistics_load_once_a_row(channels):
    """The split stage of the weight gradients reads mean and rstd by chunk (a column of the
    tile), and its default launch keeps every program inside one chunk."""
    kernels = rendered_kernels(layer_norm_weight_grads, _inputs(32 * 3136 if channels == 96 else 4096, channels))
    (stage,) = [k for k in kernels if k.kind == "reduction" and k.outer and "ptr5" in k.source]
    stats = _statistics_loads(stage.source)
    assert len(stats) == 2 and all("xchunk" in line and "xcmask & rmask" in line for line in stats), stage.source
    assert f"if {channels} % XBLOCK == 0:" in stage.source
    assert stage.chunk_lanes == channels
    assert stage.live_tiles == 4  # two accumulators, grad and x: the statistics are columns
    xblock, _ = launcher(stage).config(int(stage.xnumel), int(stage.rnumel)).constexprs
    assert channels % xblock == 0


def position_bias_grad(grad, probs, row_dot):
    """T5's relative-position bias gradient: the softmax backward summed over the batch, with
    one value per query row (``row_dot``) read across the keys."""
    return (probs * (grad - row_dot)).sum(0)


def test_per_query_values_load_once_a_row():
    """Over [B, H, Q, K] scores the chunk is a query row of K keys: its softmax term loads as a
    column, and K // 512-style coarser rows go through the chunk."""
    b, h, q, k = 4, 8, 512, 512
    kernels = rendered_kernels(position_bias_grad, [torch.randn(b, h, q, k), torch.rand(b, h, q, k),
                                                    torch.randn(b, h, q, 1)])
    (total,) = [k for k in kernels if k.kind == "reduction"]
    assert total.outer and total.chunk_lanes == k, total.source
    (row_load,) = _statistics_loads(total.source)
    assert "xchunk" in row_load and "xcmask & rmask" in row_load, total.source


@pytest.mark.parametrize("shape", [(3, 2, 5, 64), (2, 3, 7, 96)], ids=str)
def test_position_bias_gradient_matches_float64(prologues, shape):
    b, h, q, k = shape
    args = [torch.randn(*shape, device=DEVICE), torch.rand(*shape, device=DEVICE), torch.randn(b, h, q, 1, device=DEVICE)]
    compiled = torch.compile(position_bias_grad, backend="torchfuse", options={"target": "triton", "strict": True})
    assert_close(compiled(*args), position_bias_grad(*args), reference=position_bias_grad(*(a.double() for a in args)))
    assert prologues == [k]


def test_reductions_without_chunk_reads_are_unchanged():
    """A plain column sum's split stage and a per-channel statistic name no chunk."""
    kernels = rendered_kernels(lambda x, w: ((x * w).sum(0), x.sum(0)), [torch.randn(8192, 768), torch.randn(768)])
    for kernel in kernels:
        assert "xchunk" not in kernel.source and kernel.chunk_lanes == 0, kernel.source


def test_aligned_launch_keeps_the_tile():
    """XBLOCK drops to the largest power of two dividing the chunk; a looped tile keeps its
    elements in more reduced rows, a persistent one its whole row."""
    looped = Config(768, (64, 8), 4, num_stages=3)
    aligned = align_to_chunks(looped, 96, 49152, 196, persistent=False)
    assert aligned == replace(looped, grid=cdiv(49152, 32), constexprs=(32, 16))
    assert align_to_chunks(looped, 768, 49152, 196, persistent=False) is looped
    assert align_to_chunks(looped, 0, 49152, 196, persistent=False) is looped
    persistent = Config(768, (64, 64), 8)
    assert align_to_chunks(persistent, 96, 49152, 50, persistent=True).constexprs == (32, 64)
    short = align_to_chunks(Config(768, (128, 8), 4), 32, 98304, 12, persistent=False)
    assert short.constexprs == (32, 16)  # RBLOCK covers the 12 rows, no more


@pytest.fixture
def prologues(monkeypatch) -> list[int]:
    """The chunk sizes of the kernels rendered with chunk names, as they render."""
    found: list[int] = []
    real_prologue = chunks.RowChunks.prologue
    monkeypatch.setattr(chunks.RowChunks, "prologue", lambda self, *a: found.append(self.lanes) or real_prologue(self, *a))
    return found


def _straddling(config, chunk_lanes, xnumel, rnumel, persistent):
    """A launch rule that puts 64 lanes in a program whatever the chunk."""
    return replace(config, grid=cdiv(xnumel, 64), constexprs=(64, config.constexprs[1]))


def _check_against_float64(args: list[torch.Tensor]) -> None:
    """The compiled gradients against eager's and float64's, split in two stages."""
    compiled = torch.compile(layer_norm_weight_grads, backend="torchfuse", options={"target": "triton", "strict": True})
    got = compiled(*args)
    expected = layer_norm_weight_grads(*args)
    reference = layer_norm_weight_grads(*(a.double() for a in args))
    for g, e, r in zip(got, expected, reference):
        assert_close(g, e, reference=r)
    splits = [note for graph in torchfuse.report().graphs for note in graph.split_reductions]
    assert splits and all(re.search(r"split in two stages", note) for note in splits)


@pytest.mark.parametrize("aligned", [True, False], ids=["one_chunk_a_program", "straddling"])
@pytest.mark.parametrize("tokens,channels", [(300, 96), (97, 64)])
def test_layer_norm_weight_gradients_match_float64(monkeypatch, prologues, aligned, tokens, channels):
    monkeypatch.setattr(split, "POLICY", SMALL)
    if not aligned:
        monkeypatch.setattr(launch_configs, "align_to_chunks", _straddling)
    _check_against_float64(_inputs(tokens, channels, device=DEVICE))
    assert channels in prologues, torchfuse.report()


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [True, False], ids=["one_chunk_a_program", "straddling"])
def test_swin_sized_weight_gradients_on_a_gpu(monkeypatch, aligned):
    """Swin's first stage: bf16 gradients of 8 x 3136 tokens of 96 channels, split as on a GPU."""
    if not aligned:
        monkeypatch.setattr(launch_configs, "align_to_chunks", _straddling)
    _check_against_float64(_inputs(8 * 3136, 96, torch.bfloat16, device="cuda"))
