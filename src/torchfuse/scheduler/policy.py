"""The "is it worth it?" half of scheduling: when to store a buffer, when to fuse.

Policies are plain functions passed to ``schedule()``, so an experiment can swap one
without touching the mechanism.
"""
from __future__ import annotations

from dataclasses import dataclass

from torchfuse.ir.expr import Op, count_ops, loads, walk
from torchfuse.ir.graph import Pointwise
from torchfuse.scheduler.decisions import FusionDecision
from torchfuse.scheduler.kernel import FusedKernel

# Recomputing a body in each reader beats a store and a reload unless the body is large.
MAX_RECOMPUTED_OPS = 24
MAX_RECOMPUTED_LOADS = 6
# Library calls of dozens of instructions an element (range reduction, polynomials). A table of
# them that a larger reader broadcasts (rotary embeddings' cos and sin of [S, D] angles, read over
# [B, S, H * D]) costs that many calls per element of the reader when inlined: Mistral's q/k/v
# gradient kernel recomputed sin and cos three times an element of its 12.6 MB output and ran at
# 16% of copy bandwidth (60 us on the H100). Not exp, log and sigmoid: one or two hardware
# approximations each in Triton, and storing a squeeze-excitation gate would cost a launch.
TRANSCENDENTAL_OPS = frozenset(
    "expm1 log10 log1p sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh "
    "erf erfc erfinv lgamma".split())
# Store such a table when a reader runs over at least this many times its elements.
BROADCAST_REUSE = 8
# Square roots make a normalization's per-channel scale (an inference batch norm's 1 / sqrt(var +
# eps), of parameters alone): inlined into the [N, C, H, W] kernel that applies it, every element
# recomputed its channel's sqrt and reciprocal, two of the four MUFU instructions an element of
# EfficientNet's BN + SiLU kernels (scripts/kernel_sass.py: their arithmetic bounds 1.4-2x their
# memory bounds on the H100). Stored, the table of parameters alone joins a combined launch.
# Only for readers of NORMALIZER_MIN_READER_ELEMENTS or more: two MUFU an element over 4 M
# elements are ~4 us of an H100's SMs, about what a launch of its own would cost where the
# table cannot join one (a small max-pool after BN + ReLU stays one kernel).
NORMALIZER_OPS = frozenset({"sqrt", "rsqrt"})
NORMALIZER_MIN_READER_ELEMENTS = 1 << 22
# Gathers (a load at an index read from memory) are stored under the same rule: Swin's window
# attention read its relative-position bias, a [3, 49, 49] gather from a [169, 3] table, over
# [2048, 3, 49, 49] scores, i.e. an int64 index, a gathered float32 and the shift mask for each
# score (~16 bytes of cache reads beside 6 of memory traffic); its softmax-backward kernels ran
# at 44-47% of copy bandwidth on the H100. Stored, a reader loads one float32 from a small table.
# Floating-point values only: attention masks gather integer positions into [B, 1, S, 1]
# tables whose readers are small; storing those cost a launch a graph for nothing.


@dataclass(frozen=True)
class RealizeContext:
    is_output: bool
    read_by_extern: bool
    reader_count: int  # nodes that would recompute it if inlined
    read_on_other_device: bool = False  # a reader runs on another device (CPU values in a GPU graph)
    accumulated_into: bool = False  # a scatter's base: the scatter adds into its memory
    elements: int | None = None  # its elements, where static
    reader_elements: int | None = None  # the most elements a reader (stored, or not inlinable) runs over
    # Operations a reader would recompute per element: the node's own and those of its producers
    # of the same size (inlined into it, unless stored for another reason).
    chain_ops: frozenset[str] = frozenset()


def should_realize(node: Pointwise, ctx: RealizeContext) -> FusionDecision:
    """Store ``node``'s buffer (True) or recompute it inside each reader (False)."""
    if ctx.accumulated_into:
        return FusionDecision.yes("a scatter accumulates into its memory")
    if ctx.is_output:
        return FusionDecision.yes("graph output")
    if ctx.read_by_extern:
        return FusionDecision.yes("read by an ATen call")
    if ctx.read_on_other_device:
        return FusionDecision.yes("read by a kernel on another device")
    if ctx.elements and ctx.reader_elements and ctx.reader_elements >= BROADCAST_REUSE * ctx.elements:
        ops = ctx.chain_ops | {e.name for e in walk(node.body) if isinstance(e, Op)}
        if ops & TRANSCENDENTAL_OPS:
            return FusionDecision.yes(f"transcendental calls on {ctx.elements} elements that a reader would "
                                      f"recompute over {ctx.reader_elements}")
        if ops & NORMALIZER_OPS and ctx.reader_elements >= NORMALIZER_MIN_READER_ELEMENTS:
            return FusionDecision.yes(f"square roots on {ctx.elements} elements (a normalization's scale) "
                                      f"that a reader would recompute over {ctx.reader_elements}")
        if node.dtype.is_floating_point and any(load.is_indirect for load in loads(node.body)):
            return FusionDecision.yes(f"a gather of {ctx.elements} elements that a reader would repeat "
                                      f"over {ctx.reader_elements}")
    if ctx.reader_count > 1:
        ops, reads = count_ops(node.body), len(loads(node.body))
        if ops > MAX_RECOMPUTED_OPS or reads > MAX_RECOMPUTED_LOADS:
            return FusionDecision.yes(f"{ctx.reader_count} readers and a large body ({ops} ops, {reads} loads)")
    return FusionDecision.no("cheap to recompute in its readers")


def should_store_shared(large_reads: int, reader_count: int) -> FusionDecision:
    """Store a buffer that several readers would recompute from many full-size buffers.

    ``large_reads`` counts the full-size buffers its body reads once producers that are not
    stored are inlined (a residual stream ``x + a1 + m1 + a2`` reads four). Recomputed in R
    readers it reads those L buffers R times; stored, it reads them once, writes itself once
    and each reader reads it back: R*L against L + 1 + R. Ties go to storing, because an
    inlined chain also keeps every buffer it reads alive until its last reader has run.
    """
    inline_cost, store_cost = reader_count * large_reads, large_reads + 1 + reader_count
    if reader_count > 1 and inline_cost >= store_cost:
        return FusionDecision.yes(f"{reader_count} readers would each re-read {large_reads} full-size buffers")
    return FusionDecision.no("cheap to recompute in its readers")


def should_store_shared_bytes(extra_bytes: list[int], stored_bytes: int) -> FusionDecision:
    """Confirm a ``should_store_shared`` verdict, in bytes an element and with what each reader
    reads anyway.

    ``extra_bytes[r]``: the bytes of the chain's full-size inputs that reader r would load only
    to recompute it (a softmax backward's ``p * dp`` costs a reader that already loads ``p``
    only ``dp``). Stored, one reader loads its inputs anyway, it is written once, and each
    reader loads it back: ``min(extra) + stored_bytes * (1 + R)``, the count rule's
    ``L + 1 + R`` when no reader shares an input. Recomputed: ``sum(extra)``. Ties store.
    """
    reader_count = len(extra_bytes)
    inline_cost = sum(extra_bytes)
    store_cost = min(extra_bytes, default=0) + stored_bytes * (1 + reader_count)
    if inline_cost >= store_cost:
        return FusionDecision.yes(f"{reader_count} readers would re-read {inline_cost} bytes an element "
                                  f"against {store_cost} stored")
    return FusionDecision.no(f"its readers load most of its inputs anyway: recomputing costs {inline_cost} "
                             f"bytes an element against {store_cost} stored")


def should_store_recomputed(inlined_ops: int, reader_count: int) -> FusionDecision:
    """Store a buffer whose readers would each recompute a large inlined body.

    ``inlined_ops`` counts the operations of the body once the producers that are not stored
    are inlined, each shared value once (as the renderers emit it). ``should_realize`` judged
    the node's own body, in which a chain of small links all looks cheap; recomputed in R
    readers, the chain costs R times its whole length. The bound is the one for a body alone.
    """
    if reader_count > 1 and inlined_ops > MAX_RECOMPUTED_OPS:
        return FusionDecision.yes(f"{reader_count} readers would each recompute {inlined_ops} inlined ops")
    return FusionDecision.no("cheap to recompute in its readers")


def worth_fusing(shares_memory: bool, kernel: FusedKernel) -> FusionDecision:
    """Fuse only nodes that share a buffer with the kernel: that is what saves traffic."""
    if not shares_memory:
        return FusionDecision.no("no shared buffer: fusing would save no memory traffic")
    return FusionDecision.yes("shares a buffer with the kernel")
