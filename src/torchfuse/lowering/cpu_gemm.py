"""Pick the faster CPU GEMM library for each linear layer: MKL (``addmm``/``mm``) or oneDNN.

ATen's ``addmm`` calls MKL's sgemm. oneDNN's linear (``mkldnn._linear_pointwise``, the op
Inductor's CPU backend uses) is faster on some shapes and slower on others. Measured on the
2-core AVX-512 VM of docs/cpu_bench (float32, both with their own threads): 256x512 @ 512x2048
1.35 against 1.56 ms; 2048x256 @ 256x1024 2.74 against 2.64; 37x100 @ 100x300 32 against
22 us. So the choice is measured, once per shape and thread count in a process, on random
operands: oneDNN is taken only when it is clearly faster (``MIN_GAIN``), since a choice made
on noise would flip from run to run.

Only float32 linear layers: ``x @ w.t()`` with ``w`` a contiguous [N, K] weight (its transposed
view), ``x`` a contiguous [M, K] matrix, numeric sizes. Both libraries return a contiguous
[M, N] result, so the rewritten node keeps the original's metadata.
"""
from __future__ import annotations

import time

import torch

from torchfuse.frontend.symbolic import outside_fake_mode

aten = torch.ops.aten

MIN_MULTIPLY_ADDS = 1 << 24  # smaller GEMMs take microseconds: MKL wins or it does not matter
MIN_GAIN = 0.08  # oneDNN must be at least 8% faster
_WARM_UP_CALLS = 3  # oneDNN builds its primitive on the first call and settles after a few
_TIMING_ROUNDS = 7
_choices: dict[tuple, bool] = {}  # (m, k, n, bias, threads) -> use oneDNN


def use_faster_gemm_library(gm: torch.fx.GraphModule) -> int:
    """Rewrite the linear layers where oneDNN measured faster; returns how many."""
    if not _onednn_available():
        return 0
    rewritten = 0
    for node in list(gm.graph.nodes):
        shape = _linear_shape(node)
        if shape is not None and _onednn_is_faster(*shape):
            _rewrite(gm.graph, node)
            rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _linear_shape(node: torch.fx.Node) -> tuple[int, int, int, bool] | None:
    """(m, k, n, has_bias) for an eligible ``mm(x, w.t())`` or ``addmm(bias, x, w.t())``."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    has_bias = node.target is aten.addmm.default
    if has_bias and (node.kwargs or len(node.args) != 3):
        return None  # beta or alpha given
    x, w_t = (v.meta.get("val") if isinstance(v, torch.fx.Node) else None for v in node.args[-2:])
    bias = node.args[0].meta.get("val") if has_bias and isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(x, torch.Tensor) or not isinstance(w_t, torch.Tensor):
        return None
    if x.device.type != "cpu" or x.dtype != torch.float32 or w_t.dtype != torch.float32:
        return None
    if has_bias and (not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.dtype != torch.float32):
        return None  # only a per-column bias maps onto the linear op
    (m, k), n = x.shape, w_t.shape[1]
    if not all(isinstance(size, int) for size in (m, k, n)) or m * k * n < MIN_MULTIPLY_ADDS:
        return None
    if not x.is_contiguous() or w_t.stride() != (1, k):
        return None
    return m, k, n, has_bias


def _onednn_is_faster(m: int, k: int, n: int, has_bias: bool) -> bool:
    key = (m, k, n, has_bias, torch.get_num_threads())
    if key not in _choices:
        with outside_fake_mode(), torch.no_grad():
            gen = torch.Generator().manual_seed(0)
            x, w, bias = (torch.randn(shape, generator=gen) for shape in ((m, k), (n, k), (n,)))
            mkl = _best_time(lambda: torch.addmm(bias, x, w.t()) if has_bias else torch.mm(x, w.t()))
            onednn = _best_time(lambda: torch.ops.mkldnn._linear_pointwise(x, w, bias if has_bias else None,
                                                                            "none", [], ""))
        _choices[key] = onednn < (1 - MIN_GAIN) * mkl
    return _choices[key]


def _best_time(run) -> float:
    for _ in range(_WARM_UP_CALLS):
        run()
    best = float("inf")
    for _ in range(_TIMING_ROUNDS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    x, w_t = node.args[-2:]
    bias = node.args[0] if node.target is aten.addmm.default else None
    with graph.inserting_before(node):
        weight = graph.call_function(aten.permute.default, (w_t, [1, 0]))  # the contiguous [N, K]
        linear = graph.call_function(torch.ops.mkldnn._linear_pointwise.default, (x, weight, bias, "none", [], ""))
    with w_t.meta["val"].fake_mode:
        weight.meta["val"] = aten.permute.default(w_t.meta["val"], [1, 0])
    linear.meta["val"] = node.meta["val"]  # contiguous [M, N], as from addmm
    node.replace_all_uses_with(linear)
    graph.erase_node(node)
