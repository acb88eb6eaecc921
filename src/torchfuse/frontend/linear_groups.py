"""One matmul for the linear layers that read the same input.

Attention's query, key and value projections, a gated MLP's gate and up projections and a
cross-attention's key and value each call ``F.linear`` on one input with their own weights.
Every matmul costs a host-side cuBLAS call (~15-18 us on the H100 box, the largest single item
of T5's training step under cProfile: 327 a step) and, in the backward, two more. Concatenating
the weights (and biases) of such a group along the output features gives one linear whose
output, split along its last dimension, holds each layer's result: the forward makes one matmul
instead of n, and aot_autograd's backward one for the input's gradient and one for the weights'
(T5: 109 forward linears become 62; BERT: 74 become 50).

Each output element is the same dot product as before; cuBLAS may pick another algorithm for
the wider matmul, so results agree to rounding, as with any change of kernel. The weights'
concatenation costs a copy of the group's weights a call: under autocast it fuses with the cast
to the compute dtype that happens anyway; otherwise a group merges only when its weights are
small (``MAX_COPIED_WEIGHT_BYTES``) in a training graph or its input has many rows per output
feature (``ROWS_PER_FEATURE``), so small-batch inference with large weights keeps its matmuls. The
split outputs are strided views, which ``view`` and ``reshape`` of their leading or last
dimensions accept.

Runs on Dynamo's graph, before aot_autograd traces it (``aot.py``), so autograd differentiates
the concatenation and split like any other op. If aot_autograd cannot trace the merged graph
(a ``view`` that the strided outputs refuse), the caller traces the original instead.
"""
from __future__ import annotations

import operator
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx
import torch.nn.functional as F

from torchfuse.frontend.fx_outputs import returned

LINEAR_CALLS = (torch._C._nn.linear, F.linear)
# Dynamo writes ``with torch.autocast(...)`` inside a graph as calls of these: a group may not
# span one, since its members would then compute in different dtypes.
AUTOCAST_MARKERS = tuple(getattr(torch.amp.autocast_mode, name) for name in ("_enter_autocast", "_exit_autocast")
                         if hasattr(torch.amp.autocast_mode, name))
# Groups merged in graphs aot_autograd traced, by their output sizes ("2x768+768"): for the
# report, tests and diagnosis.
merged: Counter = Counter()
# Graphs whose merged form aot_autograd could not trace (traced unmerged instead), by error.
refused: Counter = Counter()


def summary() -> str:
    """One line for ``report()``: the groups merged in this process, and why graphs were traced
    unmerged; empty when nothing was tried."""
    if not merged and not refused:
        return ""
    groups = ", ".join(f"{sizes} x{count}" for sizes, count in merged.most_common())
    line = f"linear layers on a shared input, one matmul each group: {sum(merged.values())} groups ({groups})"
    if refused:
        line += "; traced unmerged: " + "; ".join(f"{why} x{count}" for why, count in refused.most_common())
    return line


@dataclass(frozen=True)
class LinearCall:
    node: torch.fx.Node
    weight: torch.fx.Node
    bias: torch.fx.Node | None
    out_features: int


@dataclass
class Merged:
    """The groups merged in a graph module (in place), and how to put it back as it was."""

    gm: torch.fx.GraphModule
    labels: list[str]  # each group's output sizes, "3x768+768+768"
    undo: list[Callable[[], None]] = field(default_factory=list)

    def restore(self) -> None:
        """The module as before the merge (aot_autograd refused the merged one)."""
        for step in reversed(self.undo):
            step()
        self.undo.clear()
        self.gm.recompile()


def merge_shared_input_linears(gm: torch.fx.GraphModule) -> Merged | None:
    """Merge each group of ``F.linear`` calls on the same input in ``gm``, in place; None when
    there is none. Rewriting in place and undoing on a refusal costs one recompile of the
    module (~55 ms for T5's 1015-node graph here) where a copy cost three times that, and a
    warm start pays it too (the warm cache is keyed by the merged graph)."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    markers = [order[n] for n in gm.graph.nodes if n.op == "call_function" and n.target in AUTOCAST_MARKERS]
    by_input: dict[torch.fx.Node, list[LinearCall]] = defaultdict(list)
    for node in gm.graph.nodes:
        call = _linear_call(node)
        if call is not None:
            by_input[node.args[0]].append(call)
    merged = Merged(gm, [])
    for calls in by_input.values():
        for group in _compatible_groups(calls, order, markers):
            merged.undo.append(_merge(gm.graph, group))
            merged.labels.append(f"{len(group)}x{'+'.join(str(c.out_features) for c in group)}")
    if not merged.labels:
        return None
    gm.recompile()
    return merged


def _linear_call(node: torch.fx.Node) -> LinearCall | None:
    """``node`` as a linear call whose weight is a 2-D tensor of known sizes, else None."""
    if node.op != "call_function" or node.target not in LINEAR_CALLS:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    x, weight, bias = args[0], node.kwargs.get("weight", args[1]), node.kwargs.get("bias", args[2])
    if set(node.kwargs) - {"weight", "bias"} or not isinstance(x, torch.fx.Node) or not isinstance(weight, torch.fx.Node):
        return None
    if bias is not None and not isinstance(bias, torch.fx.Node):
        return None
    w = _example(weight)
    if w is None or w.dim() != 2 or not isinstance(w.shape[0], int) or not isinstance(w.shape[1], int):
        return None
    if bias is not None and (_example(bias) is None or _example(bias).shape != (w.shape[0],)):
        return None
    if _returned(node):
        return None
    return LinearCall(node, weight, bias, w.shape[0])


# Dynamo-graph calls whose result may share memory with their first argument.
VIEW_METHODS = frozenset({"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "T", "mT",
                          "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "narrow",
                          "split", "chunk", "unbind", "select", "movedim", "swapaxes", "swapdims",
                          "contiguous", "detach", "as_strided", "unfold", "diagonal", "__getitem__",
                          "float", "to", "type", "type_as", "half", "bfloat16"})
VIEW_FUNCTIONS = frozenset({operator.getitem, torch.reshape, torch.transpose, torch.permute, torch.t,
                            torch.unsqueeze, torch.squeeze, torch.flatten, torch.narrow, torch.split,
                            torch.chunk, torch.unbind, torch.select, torch.movedim, torch.swapaxes,
                            torch.as_strided, torch.diagonal, torch.detach})


def _returned(node: torch.fx.Node) -> bool:
    """Whether the graph returns ``node``'s result, or something that may be a view of it.
    Merged, the members' results are slices of one tensor sharing its version counter: an
    in-place change to a returned one would trip autograd's check on another saved for the
    backward, where eager's separate results would not."""
    return returned(node, _may_view)


def _may_view(user: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Whether ``user`` is a Dynamo-graph call that may return a view of ``source``."""
    aliases = (user.op == "call_method" and user.target in VIEW_METHODS) or \
        (user.op == "call_function" and user.target in VIEW_FUNCTIONS)
    return aliases and bool(user.args) and user.args[0] is source


def _example(node: torch.fx.Node) -> torch.Tensor | None:
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None


def _signature(call: LinearCall) -> tuple:
    """What members of a group must share: input features, dtypes, devices, having a bias."""
    w = _example(call.weight)
    b = _example(call.bias) if call.bias is not None else None
    return (w.shape[1], w.dtype, w.device, b is not None, b.dtype if b is not None else None)


def _compatible_groups(calls: list[LinearCall], order: dict, markers: list[int]) -> list[list[LinearCall]]:
    """Groups of two or more calls that may become one: same signature, weights and biases
    defined before the group's first call (where the merged call goes), no autocast boundary
    between its first and last call."""
    by_signature: dict[tuple, list[LinearCall]] = defaultdict(list)
    for call in calls:
        by_signature[_signature(call)].append(call)
    groups = []
    for members in by_signature.values():
        first = min(order[c.node] for c in members)
        members = [c for c in members if order[c.weight] < first and (c.bias is None or order[c.bias] < first)]
        if len(members) < 2:
            continue
        span = (min(order[c.node] for c in members), max(order[c.node] for c in members))
        if any(span[0] < m < span[1] for m in markers) or not _concatenation_is_cheap(members):
            continue
        groups.append(sorted(members, key=lambda c: order[c.node]))
    return groups


# Rows of the input per output feature of the group above which copying the weights each call
# costs little beside the matmul: the copy moves ~2 K N elements, the matmul computes 2 M K N
# products, so at M = 4 N the copy of bfloat16 weights is ~7% of an H100 matmul of BERT's size.
ROWS_PER_FEATURE = 4
# In training, group weights up to this size are copied whatever the rows: reading and writing
# 16 MiB takes ~11 us of an H100's bandwidth, less than the host time of the calls a merge saves
# (a matmul ~15-18 us on the H100 box, three per merged layer with the backward's two), and
# where the step is host-bound (Mistral's: 10.6 ms on the host for 7.2 ms of kernels) that copy
# runs while the GPU would wait anyway. Inference saves one call per layer, and the suite's
# bf16 inference models with such groups are GPU-bound (Llama-HF: 3.1 ms of host time for 6.4
# ms of kernels), where the copy would only add GPU time: there the row rule alone decides.
# Larger weights (a 7B model's projections: ~100 MB a group) would spend more copying than the
# matmul itself.
MAX_COPIED_WEIGHT_BYTES = 16 << 20


def _concatenation_is_cheap(members: list[LinearCall]) -> bool:
    """Concatenating the weights is free when each call casts its weight anyway (autocast: the
    concatenation fuses into the cast), else cheap when the weights are small
    (``MAX_COPIED_WEIGHT_BYTES``) and the call is differentiated, or the input has many rows
    per output feature; a small-batch inference with large weights in the compute dtype would
    pay a weight copy per call about as large as the matmul's own traffic."""
    if all(_example(c.node) is not None and _example(c.node).dtype != _example(c.weight).dtype for c in members):
        return True
    weights, outputs = [_example(c.weight) for c in members], [_example(c.node) for c in members]
    if all(w is not None for w in weights) and all(o is not None and o.requires_grad for o in outputs) and \
            sum(w.numel() * w.element_size() for w in weights) <= MAX_COPIED_WEIGHT_BYTES:
        return True
    x = _example(members[0].node.args[0])
    features = _example(members[0].weight).shape[1]
    if x is None or not isinstance(x.numel(), int) or features == 0:
        return False
    return x.numel() // features >= ROWS_PER_FEATURE * sum(c.out_features for c in members)


def _merge(graph: torch.fx.Graph, group: list[LinearCall]) -> Callable[[], None]:
    """Replace ``group`` (in graph order) by one linear over concatenated weights, split;
    returns what puts the group's own calls back (each where its part of the split was)."""
    first = group[0].node
    sizes = [c.out_features for c in group]
    with graph.inserting_before(first):
        weight = graph.call_function(torch.cat, ([c.weight for c in group], 0))
        bias = graph.call_function(torch.cat, ([c.bias for c in group], 0)) if group[0].bias is not None else None
        out = graph.call_function(F.linear, (first.args[0], weight, bias))
        parts = graph.call_function(torch.split, (out, sizes), {"dim": -1})
        results = [graph.call_function(operator.getitem, (parts, i)) for i in range(len(group))]
    for new in (weight, bias, out, parts, *results):
        if new is not None and "stack_trace" in first.meta:
            new.meta["stack_trace"] = first.meta["stack_trace"]
    originals = [(c.node.target, c.node.args, dict(c.node.kwargs), dict(c.node.meta)) for c in group]
    for call, result in zip(group, results):
        if "stack_trace" in call.node.meta:
            result.meta["stack_trace"] = call.node.meta["stack_trace"]
        call.node.replace_all_uses_with(result)
        graph.erase_node(call.node)

    def undo() -> None:
        for (target, args, kwargs, meta), result in zip(originals, results):
            with graph.inserting_before(result):
                node = graph.call_function(target, args, kwargs)
            node.meta = meta
            result.replace_all_uses_with(node)
        for node in reversed([weight, bias, out, parts, *results]):
            if node is not None:
                graph.erase_node(node)

    return undo
