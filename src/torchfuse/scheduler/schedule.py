"""The scheduler: from an ``ir.Graph`` to kernels and externs in execution order.

1. Decide which pointwise buffers are stored (realized); the rest are inlined into readers.
2. Walk the stored nodes in graph order and add each to a kernel it may and should join
   (``placement.place`` for legality, ``policy.worth_fusing`` for profit), else start one.
3. Drop stores whose readers all sit in the same kernel, and order kernels topologically.
4. Let kernels write input mutations in place instead of a trailing ``copy_`` (in_place.py).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Union

import torch

from torchfuse.ir.expr import Expr, Load, Op, count_ops, loads, read_buffers, substitute_index, walk
from torchfuse.ir.graph import Extern, Graph, Pointwise, Reduction, ScatterAdd
from torchfuse.ir.symbols import product
from torchfuse.scheduler import placement as placing
from torchfuse.scheduler import policy
from torchfuse.scheduler.bodies import Inliner
from torchfuse.scheduler.decisions import FusionDecision
from torchfuse.scheduler.devices import may_inline_across, travels_as_value
from torchfuse.scheduler.in_place import store_mutations_in_place
from torchfuse.scheduler.kernel import ExternKernel, FusedKernel, KernelMember, ScheduledItem
from torchfuse.scheduler.reader_layout import prefer_reader_layouts

Unit = Union[Pointwise, Reduction, ScatterAdd, Extern]
# Producers a reader's loads are followed through when judging a shared chain in bytes
# (``_loaded_through_inlined``): a backward's residual chains make cones of hundreds.
_LOADED_WALK = 64


@dataclass
class Schedule:
    items: list[ScheduledItem]
    decisions: list[FusionDecision] = field(default_factory=list)
    graph: Graph | None = None
    # buffer -> graph input whose memory it is written into (see in_place.py)
    in_place: dict[str, str] = field(default_factory=dict)
    # output position -> the strides it was given instead of eager's (see reader_layout.py)
    relaid_outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Kernels run by one launch (codegen/triton/combo.py): the combined kernel's name -> its parts'
    # kernel names, consecutive in ``items`` in this order.
    launch_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def kernels(self) -> list[FusedKernel]:
        return [i for i in self.items if isinstance(i, FusedKernel)]


def _static_elements(shape) -> int | None:
    total = product(shape)
    return int(total) if getattr(total, "is_number", True) else None


def _iteration_elements(node) -> int | None:
    """The elements a node's kernel runs over, where static: a reduction's whole source."""
    if isinstance(node, (Reduction, ScatterAdd)):
        return _static_elements(node.source_shape)
    if isinstance(node, Pointwise):
        return _static_elements(node.shape)
    return None


def schedule(graph: Graph, worth_fusing=policy.worth_fusing, should_realize=policy.should_realize,
             movable_outputs_from: int | None = None) -> Schedule:
    """Group the graph's nodes into fused kernels.

    Args:
        graph: the lowered graph; stored buffers may take another layout (reader_layout.py).
        worth_fusing / should_realize: policy functions (see ``policy.py``).
        movable_outputs_from: the first output position whose layout may change too (a
            forward graph's saved tensors), or None.
    Returns:
        A ``Schedule`` whose items run in order, with every fusion decision recorded.
    """
    state = _SchedulerState(graph)
    state.decide_realized(should_realize)
    relaid = prefer_reader_layouts(graph, state.realized, state.inlined_body, movable_outputs_from)
    for node in graph.nodes:
        if isinstance(node, Extern):
            state.add_extern(node)
        elif node.name in state.realized:
            state.add_node(node, worth_fusing)
    state.mark_stores()
    items = state.ordered_items()
    in_place = store_mutations_in_place(items, graph)
    return Schedule(items, state.decisions, graph, in_place, relaid)


class _SchedulerState:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes = {n.name: n for n in graph.nodes if not isinstance(n, Extern)}
        self.realized: set[str] = set()
        self.decisions: list[FusionDecision] = []
        self.items: list[ScheduledItem] = []
        self.kernel_of: dict[str, ScheduledItem] = {}  # buffer -> item that writes it
        self.readers: dict[str, list[ScheduledItem]] = {}  # stored buffer -> items reading it
        self.reads_of: dict[int, set[str]] = {}  # id(item) -> stored buffers it reads
        self.inlined_origins: dict[int, set[str]] = {}
        self.inliners: dict[torch.device, Inliner] = {}  # step 2's, once ``realized`` is final
        self.direct_reads: dict[str, tuple[str, ...]] = {}  # node -> buffers its body loads
        self.positions: dict[str, int] = {}  # node -> its place in the graph (filled on first use)
        self.upstream: dict[str, int] | None = None  # buffer -> reductions it reads (_upstream_reductions)
        self.reduction_bits: dict[str, int] = {}  # reduction -> its bit in those masks

    # -- step 1: realize or inline ------------------------------------------------------
    def decide_realized(self, should_realize) -> None:
        outputs = self.graph.output_names()
        bases = {n.base for n in self.graph.nodes if isinstance(n, ScatterAdd)}
        direct = self._direct_readers()
        effective: dict[str, set[str]] = {}
        for node in reversed(self.graph.nodes):
            if isinstance(node, Extern):
                continue
            readers: set[str] = set()
            for reader in direct.get(node.name, []):
                if reader in self.realized or not isinstance(self.nodes.get(reader), Pointwise):
                    readers.add(reader)
                else:
                    readers |= effective.get(reader, set())
            effective[node.name] = readers
            if isinstance(node, (Reduction, ScatterAdd)):
                self.realized.add(node.name)
                continue
            elements = _static_elements(node.shape)
            reader_elements = max((_iteration_elements(self.nodes[r]) or 0 for r in readers if r in self.nodes),
                                  default=None)
            broadcast = bool(elements and reader_elements and reader_elements > elements)
            ctx = policy.RealizeContext(
                is_output=node.name in outputs,
                read_by_extern=any(r not in self.nodes for r in direct.get(node.name, [])),
                reader_count=len(self._loop_sharing_groups(readers)),
                read_on_other_device=any(r in self.nodes and not may_inline_across(node, self.nodes[r].device)
                                         for r in direct.get(node.name, [])),
                accumulated_into=node.name in bases,
                elements=elements,
                reader_elements=reader_elements,
                # walked only for a table that a larger reader broadcasts (the policy's question)
                chain_ops=self._same_size_chain_ops(node) if broadcast else frozenset(),
            )
            if should_realize(node, ctx):
                self.realized.add(node.name)
        self._store_shared_chains(effective, direct)
        self._store_values_that_cannot_travel(direct)

    def _same_size_chain_ops(self, node: Pointwise) -> frozenset[str]:
        """Operation names in ``node``'s body and in the pointwise producers of its size it
        reads, transitively (a chain computed once per element of ``node`` when inlined)."""
        elements = _static_elements(node.shape)
        if elements is None:
            return frozenset()
        names: set[str] = set()
        pending, seen = [node], {node.name}
        while pending and len(seen) <= _LOADED_WALK:
            current = pending.pop()
            names.update(e.name for e in walk(current.body) if isinstance(e, Op))
            for buffer in self._direct_reads(current.name):
                producer = self.nodes.get(buffer)
                if (buffer not in seen and isinstance(producer, Pointwise)
                        and _static_elements(producer.shape) == elements):
                    seen.add(buffer)
                    pending.append(producer)
        return frozenset(names)

    def _store_values_that_cannot_travel(self, direct: dict[str, list[str]]) -> None:
        """Store each 0-d CPU value a GPU kernel reads that the kernel could not recompute from
        scalar arguments (devices.travels_as_value); storing one can make another fail, so
        repeat until nothing changes."""
        changed = True
        while changed:
            changed = False
            for node in self.graph.nodes:
                if not isinstance(node, Pointwise) or node.name in self.realized:
                    continue
                devices = {self.nodes[r].device for r in direct.get(node.name, []) if r in self.nodes}
                if any(not travels_as_value(node, d, self.inlinable, self.graph.buffers)
                       for d in devices - {node.device}):
                    self.realized.add(node.name)
                    changed = True

    def _store_shared_chains(self, effective_readers: dict[str, set[str]], direct: dict[str, list[str]]) -> None:
        """Store inlined chains that several readers would recompute.

        The first pass judged each body alone, so a residual stream (``h = x + a1``,
        ``h2 = h + m1``...) looked cheap link by link while every later norm recomputed the
        whole chain and kept all its terms alive. In graph order (a node's producers are
        decided before it), each body is judged with its inlined producers in place: by the
        full-size buffers it reads (``policy.should_store_shared``) and by the operations it
        computes (``policy.should_store_recomputed``). The second is asked only where the
        chain fans out (several direct readers): a node read by one inlined node is recomputed
        wherever that reader is, so storing the reader (later, larger) covers it too, while
        storing both operands of one add would store two buffers where one suffices.
        """
        inlined_reads: dict[str, frozenset[str]] = {}
        inliners: dict[torch.device, Inliner] = {}  # valid for this pass: decisions only grow ahead
        for node in self.graph.nodes:
            if not isinstance(node, Pointwise) or node.name in self.realized:
                continue
            reads: set[str] = set()
            for buffer in read_buffers(node.body):
                reads |= inlined_reads.get(buffer, {buffer})
            large = [b for b in reads if not self._smaller_than(b, node)]
            groups = self._loop_sharing_groups(effective_readers.get(node.name, set()))
            reader_count = len(groups)
            decision = policy.should_store_shared(len(large), reader_count)
            if decision:
                extra = [self._bytes_not_read_by(group, node.name, large) for group in groups]
                decision = policy.should_store_shared_bytes(extra, node.dtype.itemsize)
            if not decision and reader_count > 1 and len(set(direct.get(node.name, ()))) > 1:
                inliner = inliners.setdefault(node.device, self._new_inliner(node.device))
                ops = count_ops(inliner.inline(node.body).body)
                decision = policy.should_store_recomputed(ops, reader_count)
            if decision:
                self.realized.add(node.name)
            else:
                inlined_reads[node.name] = frozenset(reads)

    def _bytes_not_read_by(self, readers: tuple[str, ...], skipped: str, buffers: list[str]) -> int:
        """Bytes an element of ``buffers`` that ``readers`` (one loop) do not load already, through
        the producers not stored so far, other than ``skipped`` (the chain being judged)."""
        anyway = set().union(*(self._loaded_through_inlined(reader, skipped) for reader in readers))
        return sum(self._itemsize(b) for b in buffers if b not in anyway)

    def _loop_sharing_groups(self, readers: set[str]) -> list[tuple[str, ...]]:
        """``readers`` as the loops that would recompute an inlined body: reductions over the same
        rows (same device, sizes and reduced axes) that do not read one another share one loop
        of one kernel, where a shared value is computed once. A batch norm's backward sums the
        ReLU gradient and its product with the centered input in one loop: counted as two
        readers, the ReLU gradient was stored (MobileNetV3: 1.6 GB of such kernels a step)."""
        signature_of = {r: self._rows_signature(r) for r in readers}
        counts = collections.Counter(sig for sig in signature_of.values() if sig is not None)
        if all(n < 2 for n in counts.values()):
            return [(reader,) for reader in readers]
        loops: list[list[str]] = []
        results: list[int] = []  # per loop, the bit mask of its members' results
        for reader in sorted(readers, key=self._position):
            signature = signature_of[reader]
            shared = None
            if counts[signature] > 1:
                upstream = self._upstream_reductions(reader)
                shared = next((k for k, loop in enumerate(loops) if signature_of[loop[0]] == signature
                               and not upstream & results[k]), None)
            if shared is not None:
                loops[shared].append(reader)
                results[shared] |= self._result_bit(reader)
            else:
                loops.append([reader])
                results.append(self._result_bit(reader))
        return [tuple(loop) for loop in loops]

    def _result_bit(self, name: str) -> int:
        """``name``'s bit in ``_upstream_reductions``' masks (0 for a node that is no reduction)."""
        self._upstream_reductions(name)
        return 1 << self.reduction_bits[name] if name in self.reduction_bits else 0

    def _rows_signature(self, name: str) -> tuple | None:
        node = self.nodes.get(name)
        if not isinstance(node, Reduction):
            return None
        return node.device, tuple(node.shape), tuple(node.source_shape), tuple(node.reduced_axes)

    def _position(self, name: str) -> int:
        if not self.positions:
            self.positions.update((n.name, i) for i, n in enumerate(self.graph.nodes))
        return self.positions.get(name, -1)

    def _upstream_reductions(self, name: str) -> int:
        """The reductions whose results ``name`` reads, through any nodes and ATen calls, as a
        bit mask over ``reduction_bits``; one pass over the graph, on first use."""
        if self.upstream is None:
            self.upstream, self.reduction_bits = {}, {}
            for node in self.graph.nodes:
                extern = isinstance(node, Extern)
                mask = 0
                for buffer in (node.reads() if extern else self._direct_reads(node.name)):
                    mask |= self.upstream.get(buffer, 0)
                    if buffer in self.reduction_bits:
                        mask |= 1 << self.reduction_bits[buffer]
                for out in ([o.name for o in node.outputs] if extern else [node.name]):
                    self.upstream[out] = mask
                if isinstance(node, Reduction):
                    self.reduction_bits[node.name] = len(self.reduction_bits)
        return self.upstream.get(name, 0)

    def _loaded_through_inlined(self, reader: str, skipped: str) -> set[str]:
        """What ``reader`` loads, through producers inlined so far other than ``skipped``; a
        walk of at most ``_LOADED_WALK`` producers (beyond it, loads count as not made: the
        count rule's verdict, storing, then stands)."""
        if reader not in self.nodes:
            return set()
        found: set[str] = set()
        pending = list(self._direct_reads(reader))
        seen = {skipped}
        while pending and len(seen) <= _LOADED_WALK:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if self.inlinable(name) is None:
                found.add(name)
            else:
                pending.extend(self._direct_reads(name))
        return found

    def _direct_reads(self, name: str) -> tuple[str, ...]:
        """The buffers ``name``'s own body loads (bodies do not change while scheduling)."""
        reads = self.direct_reads.get(name)
        if reads is None:
            reads = self.direct_reads[name] = tuple(read_buffers(self.nodes[name].body))
        return reads

    def _itemsize(self, buffer: str) -> int:
        known = self.nodes.get(buffer) or self.graph.buffers.get(buffer)
        return known.dtype.itemsize if known is not None else 4

    def _smaller_than(self, buffer: str, node: Pointwise) -> bool:
        """Whether ``buffer`` provably has fewer elements than ``node`` (a broadcast weight, a
        row statistic): re-reading it in each reader costs little."""
        known = self.nodes.get(buffer) or self.graph.buffers.get(buffer)
        return known is not None and bool((product(node.shape) - product(known.shape)).is_positive)

    def _direct_readers(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for buffer, readers in self.graph.users().items():
            result[buffer] = [r.name for r in readers]
        return result

    def inlinable(self, name: str) -> Pointwise | None:
        node = self.nodes.get(name)
        if isinstance(node, Pointwise) and name not in self.realized:
            return node
        return None

    def inlined_body(self, node: Pointwise | Reduction) -> Expr:
        """``node``'s body with the producers ``realized`` does not store in place, for the
        layout pass. It shares step 2's Inliners: inlining composes indices per dimension,
        never through strides, so what it memoises holds whatever layouts the pass picks."""
        return self._inline(node.body, node.device, set())

    def _new_inliner(self, device: torch.device) -> Inliner:
        """An Inliner for readers on ``device``, recomputing what ``realized`` does not store
        (producers of another device only as values, ``may_inline_across``)."""

        def producer_for_device(name: str) -> Pointwise | None:
            producer = self.inlinable(name)
            return producer if producer is not None and may_inline_across(producer, device) else None

        return Inliner(producer_for_device)

    def _inline(self, body: Expr, device: torch.device, origins: set[str]) -> Expr:
        """``body`` with its producers inlined for a reader on ``device``; their ATen ops are
        added to ``origins``. One Inliner per device serves all of step 2, so the members of a
        kernel share what they recompute."""
        if device not in self.inliners:
            self.inliners[device] = self._new_inliner(device)
        inlined = self.inliners[device].inline(body)
        origins.update(self.nodes[name].origin for name in inlined.producers)
        return inlined.body

    # -- step 2: group -------------------------------------------------------------------
    def add_extern(self, node: Extern) -> None:
        item = ExternKernel(node)
        self._register(item, set(node.reads()))
        for out in node.outputs:
            self.kernel_of[out.name] = item

    def add_node(self, node: Pointwise | Reduction | ScatterAdd, worth_fusing) -> None:
        origins: set[str] = set()
        if isinstance(node, ScatterAdd):
            self._add_scatter(node, lambda e: self._inline(e, node.device, origins), origins)
            return
        own_body = self._inline(node.body, node.device, origins)
        reads = {load.buffer for load in loads(own_body)}
        for kernel in self._candidates(reads):
            decision = self._try_join(node, own_body, reads, kernel, worth_fusing)
            self.decisions.append(decision.about(node.name, kernel.name))
            if decision:
                self._finish_join(node, kernel, reads, origins)
                return
        kernel = FusedKernel(f"kernel{len(self.kernels())}", placing.non_unit(node.shape))
        result = placing.place(node, kernel)
        member = placing.apply(kernel, node, result)
        member.own_body = own_body
        self._register(kernel, reads)
        self._finish_join(node, kernel, set(), origins)

    def _add_scatter(self, node: ScatterAdd, inline, origins: set[str]) -> None:
        """A scatter is a kernel of its own, over its source points: the producers of its values,
        index and mask are recomputed inside it. It reads its base (zeros, a copy of the input),
        which the kernel before it stores and it then adds into."""
        kernel = FusedKernel(f"kernel{len(self.kernels())}", placing.non_unit(node.source_shape))
        var_map = placing.row_map(node.vars, node.source_shape, kernel.x_ranges)
        index = tuple(inline(e) if isinstance(e, Expr) else e for e in node.index)
        mask = inline(node.mask) if node.mask is not None else None
        member = KernelMember(node, var_map, "scatter", own_body=inline(node.body), own_index=index, own_mask=mask)
        kernel.members.append(member)
        reads = {load.buffer for expr in member.exprs for load in loads(expr)} | {node.base}
        self._register(kernel, reads)
        self._finish_join(node, kernel, set(), origins)

    def kernels(self) -> list[FusedKernel]:
        return [i for i in self.items if isinstance(i, FusedKernel)]

    def _candidates(self, reads: set[str]) -> list[FusedKernel]:
        """Kernels that write what the node reads, then kernels that read the same buffers."""
        found: list[FusedKernel] = []
        for name in reads:
            item = self.kernel_of.get(name)
            if isinstance(item, FusedKernel) and item not in found:
                found.append(item)
        for name in reads:
            for item in self.readers.get(name, []):
                if isinstance(item, FusedKernel) and item not in found:
                    found.append(item)
        return sorted(found, key=lambda k: -self.items.index(k))

    def _try_join(self, node, own_body: Expr, reads: set[str], kernel: FusedKernel, worth_fusing) -> FusionDecision:
        if node.device != kernel.device:
            return FusionDecision.no(f"runs on {node.device}, the kernel on {kernel.device}: a kernel runs on one device")
        result = placing.place(node, kernel, own_body, self.graph.buffers)
        if isinstance(result, FusionDecision):
            return result
        if self._would_cycle(reads, kernel):
            return FusionDecision.no("a buffer it reads is computed after this kernel by another kernel")
        problem = _in_kernel_read_problem(own_body, result.var_map, kernel, result)
        if problem:
            return FusionDecision.no(problem)
        shares = bool(reads & (self.reads_of[id(kernel)] | set(kernel.node_names)))
        decision = worth_fusing(shares, kernel)
        if decision:
            member = placing.apply(kernel, node, result)
            member.own_body = own_body
        return decision

    def _finish_join(self, node, kernel: FusedKernel, reads: set[str], origins: set[str]) -> None:
        self.kernel_of[node.name] = kernel
        self.inlined_origins.setdefault(id(kernel), set()).update(origins)
        self._add_reads(kernel, reads)

    def _register(self, item: ScheduledItem, reads: set[str]) -> None:
        self.items.append(item)
        self.reads_of[id(item)] = set()
        self._add_reads(item, reads)

    def _add_reads(self, item: ScheduledItem, reads: set[str]) -> None:
        own = set(item.node_names) if isinstance(item, FusedKernel) else set()
        for name in reads - own:
            if name not in self.reads_of[id(item)]:
                self.reads_of[id(item)].add(name)
                self.readers.setdefault(name, []).append(item)

    def _would_cycle(self, reads: set[str], kernel: FusedKernel) -> bool:
        """True if something the node reads depends (through other items) on ``kernel``."""
        sources = {self.kernel_of.get(name) for name in reads} - {None, kernel}
        return any(self._depends_on(item, kernel, set()) for item in sources)

    def _depends_on(self, item: ScheduledItem, target: ScheduledItem, seen: set[int]) -> bool:
        if item is target:
            return True
        if id(item) in seen:
            return False
        seen.add(id(item))
        producers = {self.kernel_of.get(name) for name in self.reads_of[id(item)]} - {None, item}
        return any(self._depends_on(p, target, seen) for p in producers)

    # -- step 3: stores and order --------------------------------------------------------
    def mark_stores(self) -> None:
        outputs = self.graph.output_names()
        for kernel in self.kernels():
            for member in kernel.members:
                outside = [r for r in self.readers.get(member.node.name, []) if r is not kernel]
                # A scatter's additions into memory are all it does: always "stored".
                member.stored = member.node.name in outputs or bool(outside) or member.role == "scatter"
            kernel.inlined_origins = sorted(self.inlined_origins.get(id(kernel), set()))

    def ordered_items(self) -> list[ScheduledItem]:
        """Topological order of the items, keeping creation order where free."""
        remaining = list(self.items)
        done: set[int] = set()
        ordered: list[ScheduledItem] = []
        while remaining:
            for item in remaining:
                producers = {self.kernel_of.get(n) for n in self.reads_of[id(item)]} - {None, item}
                if all(id(p) in done for p in producers):
                    ordered.append(item)
                    done.add(id(item))
                    remaining.remove(item)
                    break
            else:
                raise RuntimeError("scheduler produced a dependency cycle (a torchfuse bug)")
        return ordered


def _in_kernel_read_problem(own_body: Expr, var_map: dict, kernel: FusedKernel, placement) -> str | None:
    """Reads of this kernel's reductions must be of the current row; say why not if not."""
    members = {m.node.name: m for m in kernel.members}
    maps = {name: (placement.remapped[name][0] if placement.remapped else m.var_map) for name, m in members.items()}
    body = substitute_index(own_body, var_map)
    pending = [body]
    visited = 0
    while pending and visited < 64:
        expr = pending.pop()
        visited += 1
        for load in loads(expr):
            member = members.get(load.buffer)
            if member is None:
                continue
            if load.is_indirect:  # other lanes' values of a buffer computed here are not visible
                return f"reads {load.buffer} through a gathered index: it must be stored by an earlier kernel"
            if isinstance(member.node, Reduction):
                row = tuple(maps[load.buffer].get(v, v) for v in member.node.vars)
                if tuple(load.index) != row:
                    return f"reads reduction {load.buffer} at {load.index}, not at the current row"
            else:
                pending.append(member.body_at(load.index))
    return None
