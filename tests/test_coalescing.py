"""Generated Triton kernels read and write memory the way a GPU wants it, checked on the CPU.

For each layout case the graph goes through the pipeline's own stages for the Triton target
(lowering, split reductions, scheduling, rendering), at the sizes of real models. Nothing
runs: the test evaluates each kernel's index math with numpy, for the block sizes the launcher
would pick. Neighbouring lanes of a warp hold neighbouring elements of a tile's last axis, so

- every load and store of a large buffer must step by 1 along that axis (coalesced); the step
  may jump where one contiguous run of the buffer ends and the next starts, at most once in
  32 lanes;
- except in a pointwise kernel tiled in 2-D ([YBLOCK, XBLOCK], codegen/triton/tiles2d.py),
  where each access may do so along either axis instead: on a GPU Triton gives every load
  and store its own layout, its lanes along the axis its pointer is contiguous in (its
  coalescing pass orders each access's axes by the contiguity its axis analysis finds), and
  moves values between the layouts through shared memory. The rule is the same (steps of 1,
  at most one jump in 32 lanes), so that axis holds runs of 32 elements or more;
- a kernel reading a large input must launch at least as many programs as an H200 has SMs
  (a reduction with few outputs is split, or tiles more finely).

A gathered access (its offset needs a value loaded first: an embedding row, the weight row an
embedding gradient is added into) is evaluated with stand-in loaded values, equal where lanes
load the same element. A row-gathered access whose lanes walk the row contiguously then steps
by 1 except where the row changes, and passes; lanes that each gather a different row do not.
"""
from __future__ import annotations

import re
from unittest.mock import patch

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchfuse import pipeline
from torchfuse.diagnostics.model import GraphReport
from torchfuse.frontend.decompositions import decomposition_table
from torchfuse.options import Options
from torchfuse.diagnostics.coalescing import (Definitions, FakeTriton, Pointer, accesses_at, launcher, load_texts,
                                               sector_use, unit_stride, worst_sector_use)

H200_SMS = 132


def column_sum(x):
    return x.sum(0)


def full_sum(x):
    """A loss: the mean of 8.4 M bf16 values, accumulated in float32."""
    return x.float().pow(2).mean()


def bias_grad(grad):
    """The bias gradient of a linear layer over [B, S] tokens: a sum over the leading dims."""
    return grad.sum((0, 1))


def bn_stats_channels_last(x):
    """Training batch norm's statistics over N*H*W of channels-last activations."""
    var, mean = torch.var_mean(x, (0, 2, 3), correction=0)
    return var, mean


def bn_stats_few_channels(x):
    """MobileNet's first batch norms under autocast: 16 channels, bf16 activations read through
    ``x.float()`` (a producer node whose own layout is not x's), channels-last."""
    var, mean = torch.var_mean(x.float(), (0, 2, 3), correction=0)
    return var, mean


def bn_hardswish_backward(grad, x, mean, rstd, weight):
    """MobileNetV3's batch norm + hardswish backward over channels-last activations: the
    hardswish gradient is read by two kernels (the split statistics and the input gradient),
    so it is a buffer, which must be laid out as eager's (channels-last), not row-major."""
    y = (x - mean.view(1, -1, 1, 1)) * rstd.view(1, -1, 1, 1) * weight.view(1, -1, 1, 1)
    g = torch.ops.aten.hardswish_backward(grad, y)
    return torch.ops.aten.native_batch_norm_backward(g, x, weight, None, None, mean, rstd, True, 1e-5,
                                                     [True, True, False])


def bn_add_relu(x, scale, shift, residual):
    return torch.relu(x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1) + residual)


def transposed_add(x, y):
    return x.t() + y


def bhsd_to_bshd(q):
    """Attention's heads back into the hidden dim: [B, H, S, D] -> [B, S, H * D], a copy."""
    b, h, s, d = q.shape
    return q.permute(0, 2, 1, 3).reshape(b, s, h * d)


def to_channels_last(x):
    return x.contiguous(memory_format=torch.channels_last)


def to_contiguous(x):
    return x.contiguous()


def _channels_last(*shape):
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def embedding_backward(grad, indices):
    """BERT-base's word-embedding gradient: rows of 768 added into a 30522-row table (row 0 pads)."""
    return torch.ops.aten.embedding_dense_backward(grad, indices, 30522, 0, False)


def swiglu_grad_cat(grad_h, gate, up):
    """A LLaMA block's SwiGLU backward through the fused projection's ``chunk``: the gate and up
    gradients, each computed where it is written, concatenated along the features."""
    g, u, d = gate.float(), up.float(), grad_h.float()
    s = torch.sigmoid(g)
    return torch.cat([(d * u * s * (1 + g * (1 - s))).to(gate.dtype), (d * g * s).to(gate.dtype)], -1)


def rotate_half(x):
    """Rotary embeddings' half rotation of [B, S, H, D] queries: a cat of the negated back half and
    the front half."""
    x1, x2 = x.chunk(2, -1)
    return torch.cat([-x2, x1], -1)


def heads_cat(q, k, v):
    """An attention block's q, k and v gradients, [B, H, S, D], into the fused projection's
    [B, S, 3 * H * D] gradient: each head's D elements are one contiguous run."""
    b, h, s, d = q.shape
    return torch.cat([t.transpose(1, 2).reshape(b, s, h * d) for t in (q, k, v)], -1)


def probs_and_transposed_grad(p, g, s):
    """T5's attention backward under autocast: P cast for one matmul, dS = g - P * s cast, transposed,
    for another (a node over the transposed space whose buffer keeps dS's order)."""
    ds = g - p * s.unsqueeze(-1)
    return p.to(torch.bfloat16), ds.transpose(-1, -2).to(torch.bfloat16)


def relative_position_bias(buckets, table, scores):
    """T5's attention scores plus a relative-position bias, in a forward graph that saves the
    bias for the backward: an embedding lookup of shape [S, S, H] read as [1, H, S, S]."""
    bias = torch.nn.functional.embedding(buckets, table)
    probs = torch.softmax(scores * bias.permute(2, 0, 1).unsqueeze(0), -1)
    return probs, bias


def pad_features(x):
    return torch.nn.functional.pad(x, (0, 8))


def bn_relu_max_pool(x, scale, shift):
    """ResNet's stem: batch norm + ReLU + a padded 3x3 max pool over channels-last activations."""
    y = torch.relu(x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1))
    return torch.nn.functional.max_pool2d(y, 3, 2, 1)


CASES = {
    "column_sum": (column_sum, lambda: (torch.randn(8192, 768),)),
    "full_sum": (full_sum, lambda: (torch.randn(4096, 2048, dtype=torch.bfloat16),)),
    "bias_grad": (bias_grad, lambda: (torch.randn(8, 512, 2048, dtype=torch.bfloat16),)),
    "bn_stats_channels_last": (bn_stats_channels_last, lambda: (_channels_last(32, 64, 28, 28),)),
    "bn_stats_few_channels": (bn_stats_few_channels,
                              lambda: (_channels_last(64, 16, 56, 56).to(torch.bfloat16),)),
    "bn_hardswish_backward": (bn_hardswish_backward,
                              lambda: (_channels_last(32, 672, 14, 14), _channels_last(32, 672, 14, 14),
                                       torch.randn(672), torch.rand(672) + 0.5, torch.randn(672))),
    "bn_add_relu_channels_last": (bn_add_relu, lambda: (_channels_last(32, 64, 28, 28), torch.randn(64),
                                                        torch.randn(64), _channels_last(32, 64, 28, 28))),
    "transposed_add": (transposed_add, lambda: (torch.randn(4096, 4096), torch.randn(4096, 4096))),
    "bhsd_to_bshd": (bhsd_to_bshd, lambda: (torch.randn(8, 12, 512, 64, dtype=torch.bfloat16),)),
    "nchw_to_channels_last": (to_channels_last, lambda: (torch.randn(32, 64, 56, 56, dtype=torch.bfloat16),)),
    "channels_last_to_nchw": (to_contiguous, lambda: (_channels_last(32, 64, 56, 56),)),
    "key_transpose": (lambda k: k.transpose(-1, -2).contiguous(),
                      lambda: (torch.randn(8, 12, 512, 64, dtype=torch.bfloat16),)),
    "embedding_backward": (embedding_backward, lambda: (torch.randn(8 * 512, 768, dtype=torch.bfloat16),
                                                        torch.randint(0, 30522, (8 * 512,)))),
    "swiglu_grad_cat": (swiglu_grad_cat, lambda: tuple(torch.randn(4096, 2048, dtype=torch.bfloat16) for _ in range(3))),
    "rotate_half": (rotate_half, lambda: (torch.randn(8, 512, 32, 128, dtype=torch.bfloat16),)),
    "pad_features": (pad_features, lambda: (torch.randn(8192, 768, dtype=torch.bfloat16),)),
    "probs_and_transposed_grad": (probs_and_transposed_grad, lambda: (torch.randn(64, 512, 512), torch.randn(64, 512, 512),
                                                                      torch.randn(64, 512))),
    "bn_relu_max_pool_channels_last": (bn_relu_max_pool, lambda: (_channels_last(32, 64, 112, 112).to(torch.bfloat16),
                                                                  torch.randn(64, dtype=torch.bfloat16),
                                                                  torch.randn(64, dtype=torch.bfloat16))),
    "relative_position_bias": (relative_position_bias, lambda: (torch.randint(0, 32, (512, 512)), torch.randn(32, 8),
                                                                torch.randn(2, 8, 512, 512))),
}
# Forward graphs whose outputs from this position on are saved for the backward: their layout
# is the compiler's to choose (scheduler/reader_layout.py).
SAVED_FROM = {"relative_position_bias": 1}
# Cases that read a region of an input under a condition (cat, pad, a padded pooling window).
REGIONS = {"swiglu_grad_cat", "rotate_half", "pad_features", "bn_relu_max_pool_channels_last"}
# Cases whose 1-D kernel would read (or write) across its lanes: each must be tiled in 2-D.
TILED = {"transposed_add", "nchw_to_channels_last", "channels_last_to_nchw", "key_transpose"}


def _rendered(fn, args):
    """(kernel, rendered kernel) for each kernel of ``fn`` on the Triton target, through the
    pipeline's stages, without running anything (``SAVED_FROM`` says which outputs a forward
    graph saves)."""
    saved_from = SAVED_FROM.get(fn.__name__)
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)  # as aot_autograd decomposes
    state = pipeline.CompileState(gm, list(args), Options(target="triton"), "triton", GraphReport("g", "inference", "triton"))
    pipeline.stage_lower(state)
    with patch.object(pipeline, "relayout_outputs_from", lambda kind: saved_from):
        pipeline.stage_schedule(state)
    hint = lambda e: int(e)  # noqa: E731  (static sizes)
    kernels = [(k, pipeline.render_triton_kernel(k, state.graph.buffers, hint)) for k in state.plan.kernels]
    return state.graph, kernels


def _check_kernel(kernel, rendered, buffers) -> list[str]:
    """Problems of one kernel: large accesses that do not step by 1 along the tile's last axis."""
    xnumel, rnumel = int(rendered.xnumel), int(rendered.rnumel)
    config = launcher(rendered).config(xnumel, rnumel)
    blocks = config.blocks()
    # The tile axes an access may walk: the last, or either of a 2-D tiled pointwise kernel's.
    axes = (1, 0) if rendered.tile is not None else (-1,)
    large = xnumel * max(rnumel, 1) // 4
    problems = []
    for pid in sorted({0, config.grid // 2, config.grid - 1}):
        for roffset in sorted({0, (rnumel // 2) // blocks.get("RBLOCK", 1) * blocks.get("RBLOCK", 1)}):
            for access in accesses_at(rendered, buffers, pid, roffset):
                kind, buffer, offset, mask = access.kind, access.buffer, access.offsets, access.mask
                if int(buffer.numel) < large:
                    continue
                found = [unit_stride(offset, mask, axis) for axis in axes]
                if not any(ok for ok, _ in found):
                    steps = np.unique(np.concatenate([s for _, s in found]))[:6]
                    problems.append(f"{kernel.name} {kind} of {buffer.name}: steps {steps} along the "
                                    f"lanes' axis of a {list(mask.shape)} tile (pid {pid}, roffset {roffset})")
    return problems


@pytest.mark.parametrize("case", list(CASES))
def test_large_accesses_are_unit_stride_along_the_lanes(case):
    fn, make = CASES[case]
    graph, kernels = _rendered(fn, make())
    problems = [p for kernel, rendered in kernels for p in _check_kernel(kernel, rendered, graph.buffers)]
    assert not problems, "\n".join(problems + [r.source for _, r in kernels])


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_reading_a_large_input_fill_the_gpu(case):
    fn, make = CASES[case]
    args = make()
    graph, kernels = _rendered(fn, args)
    inputs = {b.name for b in graph.inputs if int(b.numel) >= 1 << 20}
    readers = [(k, r) for k, r in kernels if inputs & set(r.pointer_args)]
    assert readers
    for kernel, rendered in readers:
        grid = launcher(rendered).config(int(rendered.xnumel), int(rendered.rnumel)).grid
        assert grid >= H200_SMS, f"{kernel.name}: {grid} programs\n{rendered.source}"


def test_a_scalar_reduction_runs_in_two_stages():
    """The full sum's first stage writes one partial per chunk; the second reduces those."""
    graph, kernels = _rendered(full_sum, CASES["full_sum"][1]())
    reductions = [r for _, r in kernels if r.kind == "reduction"]
    assert len(reductions) == 2
    first, second = reductions
    assert int(first.xnumel) >= H200_SMS and int(second.xnumel) == 1
    assert int(first.xnumel) * int(first.rnumel) >= 4096 * 2048


def layer_norm_weight_grads(grad, x, mean, rstd):
    return (grad * ((x - mean) * rstd)).sum(0), grad.sum(0)


def test_heavy_outer_reductions_count_their_live_tiles_and_take_smaller_tiles():
    """A LayerNorm's weight and bias gradients hold two reduced tiles and two loads along both
    axes at once (the row statistics are [RBLOCK, 1] columns: codegen/triton/chunks.py):
    ``live_tiles`` 4, and a smaller tile than a plain column sum of the same shape gets (launch.py)."""
    args = [torch.randn(4096, 768), torch.randn(4096, 768), torch.randn(4096, 1), torch.rand(4096, 1)]
    _, kernels = _rendered(layer_norm_weight_grads, args)
    heavy = [r for _, r in kernels if r.kind == "reduction" and r.outer and "ptr5" in r.source]
    assert len(heavy) == 1, [r.source for _, r in kernels]
    assert heavy[0].live_tiles == 4
    _, plain = _rendered(column_sum, [torch.randn(4096, 768)])
    split_stage = [r for _, r in plain if r.kind == "reduction" and r.xnumel == heavy[0].xnumel]
    assert [r.live_tiles for r in split_stage] == [2]

    def tile(rendered) -> int:
        xblock, rblock = launcher(rendered).config(int(rendered.xnumel), int(rendered.rnumel)).constexprs
        return xblock * rblock

    assert tile(heavy[0]) < tile(split_stage[0])


@pytest.mark.parametrize("case", sorted(TILED))
def test_kernels_whose_reads_and_store_disagree_are_tiled(case):
    """The 2-D model above is only granted to kernels rendered as 2-D tiles; and those tiles are
    at least 32 elements along each axis (a warp's lanes along either run)."""
    fn, make = CASES[case]
    _, kernels = _rendered(fn, make())
    (rendered,) = [r for _, r in kernels]
    assert rendered.tile is not None, rendered.source
    config = launcher(rendered).config(int(rendered.xnumel), 0)
    assert min(config.constexprs) >= 32 and config.names == ("YBLOCK", "XBLOCK")


@pytest.mark.parametrize("case", sorted(set(CASES) - TILED))
def test_kernels_whose_reads_and_store_agree_stay_one_dimensional(case):
    fn, make = CASES[case]
    _, kernels = _rendered(fn, make())
    assert all(r.tile is None for _, r in kernels), [r.source for _, r in kernels]



BLOCKED = re.compile(r"^#(\w+) = #ttg\.blocked<\{.*order = \[([\d, ]+)\]")
MEMORY_OP = re.compile(r"tt\.(?:load|store) .*: tensor<(?:\d+x)+!tt\.ptr<\w+>, #(\w+)>")
GLOBAL_ACCESS = re.compile(r"\b(?:ld|st)\.global(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)\b")


def _compile_for_sm90(rendered, graph):
    """The kernel compiled by Triton for an H100/H200 (sm_90; no GPU needed), as the first
    launch on the GPU would compile it."""
    import dataclasses

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from torchfuse.runtime import kernel_cache, triton_ahead
    from torchfuse.runtime.launch import PointerArg
    from torchfuse.runtime.predict import PredictedLaunch

    target = triton_ahead.Target("cuda", 90, 32)
    kernel = dataclasses.replace(rendered, device="cuda")
    fn = kernel_cache.load_kernel(kernel.source, kernel.function, interpret=False)
    args = tuple(PointerArg(graph.buffers[name].dtype, True) for name in kernel.pointer_args)
    spec = triton_ahead.specialize(fn, kernel, PredictedLaunch(int(kernel.xnumel), 0, args), target)
    return triton.compile(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs),
                          target=GPUTarget(target.backend, target.arch, target.warp_size),
                          options={"num_warps": spec.options["num_warps"]})


def _memory_orders(ttgir: str) -> set[tuple[int, ...]]:
    """The layout order (fastest axis first) of every tt.load / tt.store."""
    layouts, found = {}, set()
    for line in ttgir.splitlines():
        if match := BLOCKED.match(line):
            layouts[match.group(1)] = tuple(int(v) for v in match.group(2).split(","))
        elif match := MEMORY_OP.search(line):
            found.add(layouts[match.group(1)])
    return found


@pytest.mark.parametrize("case", sorted(TILED))
def test_triton_coalesces_both_sides_of_a_tile(case):
    """What the 2-D model above relies on, from Triton's compiler itself (sm_90): the read and
    the store of a tiled kernel get layouts of opposite orders (a conversion through shared
    memory between them), and every global load and store instruction moves 16 bytes, which
    Triton emits only where its axis analysis proved each thread's elements contiguous. The
    1-D kernels of these cases read with scalar instructions, one element per lane."""
    fn, make = CASES[case]
    graph, kernels = _rendered(fn, make())
    (rendered,) = [r for _, r in kernels]
    compiled = _compile_for_sm90(rendered, graph)
    assert _memory_orders(compiled.asm["ttgir"]) == {(0, 1), (1, 0)}
    widths = [int(lanes or 1) * int(bits) for lanes, bits in GLOBAL_ACCESS.findall(compiled.asm["ptx"])]
    assert widths and all(w == 128 for w in widths), (sorted(set(widths)), rendered.source)


# Kernels whose every access must compile to 16-byte instructions: the region cases, and reads
# in runs of 16 elements (64 bytes: whole sectors, so not a coalescing problem, but Triton must
# still see the runs through the index's div/mod).
VECTORIZED = {**{name: CASES[name] for name in REGIONS},
              "heads_cat": (heads_cat, lambda: tuple(torch.randn(8, 8, 512, 16) for _ in range(3)))}


@pytest.mark.parametrize("case", sorted(VECTORIZED))
def test_region_reads_are_vectorized(case):
    """A region's load is masked by its condition, not clamped into its source: Triton's axis
    analysis gives ``tl.minimum``/``tl.maximum`` of an index a contiguity of 1, and the load
    becomes one 2-byte instruction per element (codegen/triton/guards.py). Compiled for sm_90,
    every global access of these kernels moves 16 bytes. ``(x % 384) // 16`` in an index hides
    its runs from the same analysis: it is written ``(x // 16) % 24`` (ir/symbols.py)."""
    fn, make = VECTORIZED[case]
    graph, kernels = _rendered(fn, make())
    for _, rendered in kernels:
        compiled = _compile_for_sm90(rendered, graph)
        widths = [int(lanes or 1) * int(bits) for lanes, bits in GLOBAL_ACCESS.findall(compiled.asm["ptx"])]
        assert widths and all(w == 128 for w in widths), (sorted(set(widths)), rendered.source)


# Region cases at small odd sizes, for the bounds check below (it evaluates every lane).
SMALL_REGIONS = {
    "swiglu_grad_cat": (swiglu_grad_cat, lambda: tuple(torch.randn(7, 13, dtype=torch.bfloat16) for _ in range(3))),
    "rotate_half": (rotate_half, lambda: (torch.randn(2, 5, 3, 6),)),
    "nested_cat": (lambda q, k, v: torch.cat([rotate_half(q) * 2, rotate_half(k).exp(), v], -1),
                   lambda: (torch.randn(3, 5, 6), torch.randn(3, 5, 6), torch.randn(3, 5, 7))),
    "pad_both_sides_and_crop": (lambda x: torch.nn.functional.pad(x, (2, 3, -1, 2)) * 2, lambda: (torch.randn(5, 7, 11),)),
    "bn_relu_max_pool_channels_last": (bn_relu_max_pool, lambda: (_channels_last(2, 5, 9, 9), torch.randn(5),
                                                                  torch.randn(5))),
    "max_pool_ceil_mode": (lambda x: torch.nn.functional.max_pool2d(x.relu(), 3, 2, 1, ceil_mode=True),
                           lambda: (torch.randn(2, 3, 10, 10),)),
}


@pytest.mark.parametrize("case", sorted(SMALL_REGIONS))
def test_region_reads_stay_inside_their_buffers(case):
    """Masked instead of clamped, a region's load computes addresses outside its source on the
    lanes of the other regions (and, nested, on those of an outer region's others): its mask
    must exclude every one of them. Evaluated on every lane with numpy."""
    fn, make = SMALL_REGIONS[case]
    graph, kernels = _rendered(fn, make())
    masked = 0
    for kernel, rendered in kernels:
        assert rendered.kind == "pointwise" and rendered.tile is None, rendered.source
        xindex = FakeTriton.arange(0, int(rendered.xnumel))
        pointers = {f"ptr{i}": name for i, name in enumerate(rendered.pointer_args)}
        tl = FakeTriton()
        names = Definitions(rendered.source, {"tl": tl, "xindex": xindex, "xmask": xindex >= 0,
                                              **{p: Pointer() for p in pointers}}, tl)
        for pointer, offset_text, mask_text in load_texts(rendered.source):
            buffer = graph.buffers[pointers[pointer]]
            extent = 1 + sum((int(n) - 1) * int(st) for n, st in zip(buffer.shape, buffer.strides))
            offset = np.broadcast_to(np.asarray(eval(offset_text, {"tl": tl}, names)), xindex.shape)
            mask = np.broadcast_to(np.asarray(eval(mask_text, {"tl": tl}, names)), xindex.shape) if mask_text else True
            read = offset[mask] if mask_text else offset
            assert read.size == 0 or (read.min() >= 0 and read.max() < extent), \
                (kernel.name, pointer, offset_text, mask_text, int(read.min()), int(read.max()), extent, rendered.source)
            masked += "&" in mask_text
    assert masked, "no region load was masked: the case no longer tests guards.py"


def ln_weight_grad_of_nchw(g, x, mean, rstd):
    """Swin's patch embedding: the convolution's NCHW output, permuted to NHWC and layer-normed
    over the channels; the norm's weight gradient sums g * x_hat over every token. Its large
    reads disagree: x walks the reduced positions, g the channels (the outputs)."""
    x_hat = (x.permute(0, 2, 3, 1).float() - mean) * rstd
    return (g.float() * x_hat).sum((0, 1, 2))


# Reductions whose large reads disagree on the contiguous axis: one of them is read across the
# lanes whichever way the tile is laid out.
MIXED = {"ln_weight_grad_of_nchw": (ln_weight_grad_of_nchw, lambda: (
    torch.randn(128, 56, 56, 96, dtype=torch.bfloat16), torch.randn(128, 96, 56, 56, dtype=torch.bfloat16),
    torch.randn(128, 56, 56, 1), torch.rand(128, 56, 56, 1)))}
WINDOW = 32  # programs that run at once, near enough to share L2's copy of a sector


@pytest.mark.parametrize("case", sorted(MIXED))
def test_programs_next_in_launch_order_share_the_sectors_of_a_read_across_lanes(case):
    """A large read across the lanes (2 bytes of each 32-byte sector a lane) is still read from
    DRAM once if the programs that run beside it use the rest of those sectors while L2 holds
    them: over WINDOW programs next in launch order, at least half of every sector touched is
    used. A split whose partials put one output's chunks next to each other ([*out, S]) had the
    neighbours read the other chunks of the same channel instead: 2 bytes of each sector."""
    fn, make = MIXED[case]
    graph, kernels = _rendered(fn, make())
    large = min(int(b.numel) for b in graph.inputs if int(b.numel) >= 1 << 20)
    checked = 0
    for kernel, rendered in kernels:
        config = launcher(rendered).config(int(rendered.xnumel), int(rendered.rnumel))
        for first in sorted({0, config.grid // 2 - WINDOW // 2}):
            touched: dict[str, list] = {}
            for pid in range(first, min(first + WINDOW, config.grid)):
                for access in accesses_at(rendered, graph.buffers, pid):
                    if access.kind == "load" and int(access.buffer.numel) >= large:
                        size = access.buffer.dtype.itemsize
                        touched.setdefault(access.buffer.name, []).append((access.offsets[access.mask].ravel() * size, size))
            for name, parts in touched.items():
                size = parts[0][1]
                addresses = np.unique(np.concatenate([a for a, _ in parts]))
                sectors = np.unique(addresses // 32)
                used = addresses.size * size / (sectors.size * 32)
                assert used >= 0.5, f"{kernel.name} {name}: {used:.0%} of each sector used over {WINDOW} programs"
                checked += 1
    assert checked, "no large read was checked"


def test_sector_use_counts_the_bytes_a_warp_uses_of_the_sectors_it_touches():
    lanes = np.arange(64)[None, :]
    inside = np.ones_like(lanes, dtype=bool)
    assert sector_use(lanes, inside, 2, -1) == 1.0  # contiguous bf16: whole sectors
    assert sector_use(lanes * 96, inside, 2, -1) == 2 / 32  # one bf16 a sector
    assert sector_use(lanes * 2, inside, 4, -1) == 0.5  # every other float32
    assert sector_use(lanes * 96, np.zeros_like(inside), 2, -1) == 1.0  # nothing inside the launch


def test_a_models_worst_accesses_are_reported_by_sector_use():
    """The Swin patch-embedding case through ``worst_sector_use`` (scripts/kernel_widths.py
    --sectors): its gradient read across the lanes uses 2 bytes of each sector, and is listed first."""
    fn, make = MIXED["ln_weight_grad_of_nchw"]
    graph, kernels = _rendered(fn, make())
    first = next(r for _, r in kernels if "g_1" in {graph.buffers[name].name for name in r.pointer_args})
    (kind, name, use), *rest = worst_sector_use(first, graph.buffers, 1 << 20)
    assert (kind, name) == ("load", "g_1") and use == 2 / 32, (kind, name, use)
    assert all(other == 1.0 for _, _, other in rest), rest
