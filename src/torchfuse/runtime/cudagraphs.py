"""CUDA graphs for ``mode="reduce-overhead"``: record a compiled graph's launches once per input
layout, then replay them with one call instead of one host-side launch per kernel.

A replay reads and writes fixed addresses, so the runner keeps these promises:

- **Inputs.** An input already at a stable address (a parameter, a buffer, a tensor saved by a
  recorded forward graph) is read where it is: at record time it is static when aot_autograd
  says it is a parameter or buffer (``GraphIO.static_inputs``) or when it lives in memory a
  recording of ours returned. A backward graph's inputs are its forward's saved tensors and
  its incoming gradients: static only in a recording's memory (a saved input that the
  forward cloned is new on every call, wherever the caching allocator happened to put it).
  Where aot_autograd does not say for a forward (graphs from the warm cache), an input the
  warm-up call saw at the same address counts as static too. Every other input is copied
  into a buffer the runner owns before each replay: a fresh batch that the caching allocator
  happened to put at the warm-up's address is not mistaken for a parameter. A static input
  that has moved runs that call on the default path; one that keeps moving is recorded again
  as a copied input.
- **Mutated inputs** (an in-place optimizer step, BatchNorm's running statistics): static ones are
  written in place by the replay; copied ones are copied back after it.
- **Outputs** live in the recording's memory and the next replay overwrites them. Outputs a user
  sees are cloned when small (under ``ALIASED_OUTPUT_BYTES``: a loss kept in a list for later
  costs nothing to copy). Large ones (a language model's logits) are handed out over the
  recording's memory, each on a storage of its own; right before the next replay overwrites
  that memory, those storages are made to raise, on any read or write through them or their
  views, an error that says to clone outputs kept across calls (``STALE_OUTPUT``): never
  silently stale data, and no copy in the common loop that drops each output before the
  next call. Outputs a forward graph saves for its backward are handed out as aliases,
  and a replay that would overwrite ones still alive (a second forward before the first's
  backward) runs on the default path instead: never silently stale data. A backward graph's
  outputs (gradients, which end up in ``.grad``) are aliases too while the user drops them
  before the next backward (``zero_grad()``'s default, ``set_to_none=True``); cloning them cost
  a copy and two ATen calls a parameter every step. When a replay finds the previous call's
  gradients still alive (accumulation, ``zero_grad(set_to_none=False)``: ``.grad`` *is* that
  memory), the call runs the default path, the recording is left to them, and the graph is
  recorded again with its outputs cloned from then on.
- **RNG.** ATen's CUDA random ops (dropout) read their seed and offset from the generator, which
  the graph registers, so every replay draws new numbers, the same as the default path would.

Each recording has its own memory pool: a replay then writes only memory of its own recording,
which a shared pool would not guarantee when graphs run in a different order than recorded.
Where graphs cannot be used, the call runs the default path and the reason is counted in
``stats`` (the report's ``cudagraphs``).
"""
from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

MAX_LAYOUTS = 8  # recorded input layouts (shapes) per graph; others run the default path
MAX_RECORDINGS = 3  # recordings of one layout (static inputs that moved); then give up on it
MOVES_BEFORE_RERECORD = 2  # calls with a moved static input before that input becomes copied
# User outputs this large are handed out over the recording's memory (guarded), smaller ones
# cloned: below it a copy costs less than the launch it needs, and keeping small outputs across
# calls (losses in a list) stays legal.
ALIASED_OUTPUT_BYTES = 16 * 2**20
STALE_OUTPUT = ("this tensor is an output of a CUDA graph replay (torchfuse mode='reduce-overhead') that a "
                "later call of the compiled function has overwritten; clone outputs you keep across calls "
                "(out = compiled(x).clone()), or compile with mode='default'")

Boxed = Callable[[list], Any]  # a compiled graph: takes its argument list (and clears it)


class Replayable(Protocol):
    def replay(self) -> None: ...


class Recorder(Protocol):
    """Records the launches of ``run(inputs)`` into something replayable; returns it and the
    outputs. Must not keep ``inputs``: a reference would keep a forward's saved tensors alive."""

    def record(self, run: Boxed, inputs: list) -> tuple[Replayable, Sequence[Any]]: ...


def forbid_access(storage: torch.UntypedStorage, message: str) -> None:
    """Make every later read or write of ``storage`` (through any tensor or view) raise
    ``message``: ATen's guard for CUDA storages (the one Inductor's CUDA graphs use)."""
    torch._C._set_storage_data_ptr_access_error_msg(storage._cdata, message)


# How outputs that a replay overwrites are guarded: None where this torch build cannot (then
# user outputs are always cloned).
CUDA_ACCESS_GUARD: Callable[[torch.UntypedStorage, str], None] | None = (
    forbid_access if hasattr(torch._C, "_set_storage_data_ptr_access_error_msg")
    and hasattr(torch._C, "_construct_storage_from_data_pointer") else None)


class TorchCudaGraphs:
    """Records with ``torch.cuda.CUDAGraph``, each recording in its own private memory pool.
    ``torch.cuda.graph`` records on a side stream and registers the default generator, so
    random ops advance the generator on every replay."""

    def record(self, run: Boxed, inputs: list) -> tuple[Replayable, Sequence[Any]]:
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        before = generator.clone_state()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs = list(run(list(inputs)))
        except BaseException:
            # A capture that fails (a sync inside) ends without the generator leaving capture
            # mode: the next random op outside would fail ("Offset increment outside graph
            # capture", seen on the H200). Give it back its state from before the capture.
            generator.graphsafe_set_state(before)
            raise
        return graph, outputs


@dataclass
class GraphIO:
    """What the runner must know of the compiled graph's inputs and outputs.

    Args:
        mutated_inputs: positions of inputs the graph writes in place.
        saved_outputs_from: for a forward graph, the position of its first output saved for the
            backward (None: unknown, or not a forward graph; every output is then cloned).
        gradient_outputs: a backward graph: its outputs are gradients, which the user may keep
            across calls (aliases until a replay finds them alive, then clones).
        static_inputs: positions of parameters and buffers (None: unknown, judged by address,
            except in a backward graph: see ``CudaGraphRunner._static_and_copied``).
    """

    mutated_inputs: frozenset[int] = frozenset()
    saved_outputs_from: int | None = None
    gradient_outputs: bool = False
    static_inputs: frozenset[int] | None = None


@dataclass
class _Recording:
    replayable: Replayable
    static_ptrs: dict[int, int]  # input position -> address read by the recording
    copied: dict[int, torch.Tensor]  # input position -> the runner's buffer
    outputs: list[Any]  # the recording's outputs (static tensors and constants)
    handed_out: frozenset[int]  # positions of outputs returned as aliases (not cloned)
    # The storages of aliased outputs, each with its use count when no alias is alive (holding
    # the storage objects makes the check one call a storage: graphs save hundreds of tensors).
    alias_storages: list[tuple[torch.UntypedStorage, int]]
    moves: collections.Counter = field(default_factory=collections.Counter)  # static inputs that moved
    guarded: frozenset[int] = frozenset()  # user outputs handed out over our memory, guarded
    handed_storages: list = field(default_factory=list)  # their storages from the last replay


@dataclass
class _Layout:
    """The state of one input layout: its warm-up addresses, then its recording."""

    warmup_ptrs: dict[int, int] | None = None
    recording: _Recording | None = None
    recordings_made: int = 0
    always_copy: set[int] = field(default_factory=set)
    refused: str | None = None
    clone_outputs: bool = False  # gradients were kept across calls: clone every output


class CudaGraphRunner:
    """Runs a compiled graph through CUDA graphs where it can, and its default path elsewhere.

    Args:
        run_default: the compiled graph (boxed: takes its argument list and clears it).
        io: which inputs it mutates and which outputs it saves for a backward graph.
        stats: counts ("recorded", "replayed", "default path: <reason>"); the report shows them.
        recorder: records and replays (``TorchCudaGraphs`` on a GPU; tests pass their own).
        shape_generic: the graph takes symbolic sizes: record one layout per distinct shape.
        pool_storages: addresses of storages returned by recordings (shared by the runners of a
            process, so a backward graph reads its forward's saved tensors where they are).
        device_type: the device whose tensors can be recorded ("cuda"; tests record CPU tensors
            with a stand-in recorder).
        access_guard: makes a storage raise a message on access (``forbid_access`` on CUDA;
            None: clone every user output).
    """

    def __init__(self, run_default: Boxed, io: GraphIO, stats: collections.Counter,
                 recorder: Recorder | None = None, shape_generic: bool = False,
                 pool_storages: set[int] | None = None, device_type: str = "cuda",
                 access_guard: Callable[[torch.UntypedStorage, str], None] | None = CUDA_ACCESS_GUARD) -> None:
        self.run_default = run_default
        self.io = io
        self.stats = stats
        self.recorder = recorder or TorchCudaGraphs()
        self.shape_generic = shape_generic
        self.pool_storages = RECORDED_STORAGES if pool_storages is None else pool_storages
        self.device_type = device_type
        self.access_guard = access_guard
        self.layouts: dict[tuple, _Layout] = {}

    def __call__(self, args: list) -> Any:
        layout = self._layout(args)
        if layout is None or layout.refused:
            return self._default(args, "too many input shapes" if layout is None else layout.refused)
        if layout.recording is None:
            if layout.warmup_ptrs is None:  # first call of this layout: run it, note addresses
                layout.warmup_ptrs = _addresses(args)
                return self._default(args, "warm-up (first call of an input shape)")
            return self._record_and_run(layout, args)
        return self._replay(layout, args)

    # -- one call ---------------------------------------------------------------------------
    def _layout(self, args: list) -> _Layout | None:
        key = _layout_key(args) if self.shape_generic else ()
        layout = self.layouts.get(key)
        if layout is None:
            if len(self.layouts) >= MAX_LAYOUTS:
                return None
            layout = self.layouts[key] = _Layout()
        return layout

    def _default(self, args: list, reason: str) -> Any:
        self.stats[f"default path: {reason}"] += 1
        return self.run_default(args)

    def _replay(self, layout: _Layout, args: list) -> Any:
        recording = layout.recording
        moved = [i for i, ptr in recording.static_ptrs.items() if args[i].data_ptr() != ptr]
        if moved:
            recording.moves.update(moved)
            if any(recording.moves[i] >= MOVES_BEFORE_RERECORD for i in moved):
                layout.always_copy.update(i for i in moved if recording.moves[i] >= MOVES_BEFORE_RERECORD)
                layout.recording = None
                if layout.recordings_made >= MAX_RECORDINGS:
                    layout.refused = "inputs kept moving between calls"
                return self._default(args, "a static input moved (recording again with it copied)")
            return self._default(args, "a static input moved")
        if _aliases_alive(recording):
            if self.io.gradient_outputs:
                return self._leave_to_kept_gradients(layout, args)
            return self._default(args, "outputs of the previous call are still in use "
                                       "(a second forward before the backward of the first)")
        recording.moves.clear()  # only moves in consecutive calls lead to a new recording
        for i, buffer in recording.copied.items():
            buffer.copy_(args[i])
        _expire(recording.handed_storages, self.access_guard)  # the replay overwrites them
        recording.replayable.replay()
        self.stats["replayed"] += 1
        return self._finish(recording, args)

    def _leave_to_kept_gradients(self, layout: _Layout, args: list) -> Any:
        """The previous call's gradients are still alive (``.grad`` holds them): this call runs
        the default path, the recording's memory stays theirs, and the next call records again,
        cloning its outputs from then on."""
        layout.recording = None
        layout.clone_outputs = True
        if layout.recordings_made >= MAX_RECORDINGS:
            layout.refused = "gradients kept across calls, after every recording"
        return self._default(args, "gradients of the previous call are still in use "
                                   "(kept across steps: recording again with them cloned)")

    def _finish(self, recording: _Recording, args: list) -> list:
        """Copy mutated inputs back, then hand out the outputs (cloned or aliased)."""
        for i in self.io.mutated_inputs:
            if i in recording.copied:
                args[i].copy_(recording.copied[i])
        args.clear()
        handed, guarded = recording.handed_out, recording.guarded
        # Hundreds of saved tensors a call: aliases are detached inline.
        return [out.detach() if position in handed
                else _over_own_storage(out, recording.handed_storages) if position in guarded
                else _clone(out)
                for position, out in enumerate(recording.outputs)]

    # -- recording --------------------------------------------------------------------------
    def _record_and_run(self, layout: _Layout, args: list) -> Any:
        layout.refused = self._unrecordable(args)
        if layout.refused:
            return self._default(args, layout.refused)
        static_ptrs, copied, inputs = self._static_and_copied(layout, args)
        input_storages = {_storage_key(v) for v in inputs if isinstance(v, torch.Tensor)}
        try:
            replayable, outputs = self.recorder.record(self.run_default, inputs)
        except Exception as error:  # noqa: BLE001 - e.g. a sync (.item(), nonzero) inside the graph
            layout.refused = f"recording failed ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
            return self._default(args, layout.refused)
        del inputs
        layout.recordings_made += 1
        self.stats["recorded"] += 1
        handed_out = frozenset() if layout.clone_outputs else self._aliased_outputs(outputs, copied)
        recording = _Recording(replayable, static_ptrs, copied, list(outputs), handed_out, [],
                               guarded=self._guarded_outputs(outputs, handed_out, input_storages))
        # However the recording goes (recorded again, the runner deleted), outputs still held
        # over its memory must not read it afterwards.
        weakref.finalize(recording, _expire, recording.handed_storages, self.access_guard)
        storages = {_storage_key(outputs[i]): outputs[i].untyped_storage() for i in handed_out}
        recording.alias_storages = [(storage, _storage_use_count(storage)) for storage in storages.values()]
        self.pool_storages.update(_storage_key(o) for o in outputs if isinstance(o, torch.Tensor))
        layout.recording = recording
        for i, buffer in copied.items():  # this call's values (the recording did not run them)
            buffer.copy_(args[i])
        replayable.replay()
        self.stats["replayed"] += 1
        return self._finish(recording, args)

    def _unrecordable(self, args: list) -> str | None:
        """Why these inputs cannot be recorded, or None."""
        for value in args:
            if isinstance(value, torch.Tensor):
                if value.device.type != self.device_type:
                    return f"an input is a {value.device.type} tensor (a replay would not see its new values)"
                if torch._debug_has_internal_overlap(value) == 1:
                    return "an input overlaps itself in memory (an expanded tensor): it cannot be copied in"
            elif not isinstance(value, (int, float, bool, type(None), torch.SymInt)):
                return f"an input is a {type(value).__name__}"
        return None

    def _static_and_copied(self, layout: _Layout, args: list) -> tuple[dict, dict, list]:
        static_ptrs: dict[int, int] = {}
        copied: dict[int, torch.Tensor] = {}
        inputs = list(args)
        for i, value in enumerate(args):
            if not isinstance(value, torch.Tensor):
                continue
            if self.io.static_inputs is not None:
                stable = i in self.io.static_inputs
            elif self.io.gradient_outputs:
                # A backward's stable inputs are a recorded forward's saved tensors, in its
                # recording's memory (below). Its others are new every call: the batch its
                # forward saved (cloned out of the forward's copy-in buffer) once sat at the
                # warm-up's address by chance, then moved on every replay (H100, 2026-12-07).
                stable = False
            else:
                stable = layout.warmup_ptrs.get(i) == value.data_ptr()
            stable = stable or _storage_key(value) in self.pool_storages
            if stable and i not in layout.always_copy:
                static_ptrs[i] = value.data_ptr()
            else:
                copied[i] = inputs[i] = _clone(value)
        return static_ptrs, copied, inputs

    def _guarded_outputs(self, outputs: Sequence[Any], handed_out: frozenset[int],
                         input_storages: set[int]) -> frozenset[int]:
        """Positions of user outputs handed out over the recording's memory: large, and in
        memory the recording allocated (not an input's, which the runner does not own)."""
        if self.access_guard is None:
            return frozenset()
        return frozenset(i for i, out in enumerate(outputs)
                         if i not in handed_out and isinstance(out, torch.Tensor)
                         and out.untyped_storage().nbytes() >= ALIASED_OUTPUT_BYTES
                         and _storage_key(out) not in input_storages)

    def _aliased_outputs(self, outputs: Sequence[Any], copied: dict[int, torch.Tensor]) -> frozenset[int]:
        """Positions of outputs handed out as aliases: tensors a forward graph saves for its
        backward, or a backward graph's gradients, unless they share memory with a buffer of
        ours that the next copy-in overwrites."""
        start = 0 if self.io.gradient_outputs else self.io.saved_outputs_from
        if start is None:
            return frozenset()
        ours = {_storage_key(b) for b in copied.values()}
        return frozenset(i for i in range(start, len(outputs))
                         if isinstance(outputs[i], torch.Tensor) and _storage_key(outputs[i]) not in ours)


# Storages that recordings returned, across the runners of this process: a backward graph reads
# its forward's saved tensors in place.
RECORDED_STORAGES: set[int] = set()


def _layout_key(args: list) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _addresses(args: list) -> dict[int, int]:
    return {i: a.data_ptr() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _storage_use_count(storage: torch.UntypedStorage) -> int:
    """References to ``storage`` (tensors and views over it, and storage objects like this one)."""
    return torch._C._storage_Use_Count(storage._cdata)


def _aliases_alive(recording: _Recording) -> bool:
    """Is an alias handed out by the previous replay (or a view of it) still alive?"""
    use_count = torch._C._storage_Use_Count
    return any(use_count(storage._cdata) > alone for storage, alone in recording.alias_storages)


def _over_own_storage(out: torch.Tensor, handed: list) -> torch.Tensor:
    """``out``'s memory seen through a storage object of its own (which does not own the
    memory), so that guarding it later leaves ``out`` and later outputs readable."""
    storage = out.untyped_storage()
    own = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), out.device, storage.nbytes())
    handed.append(own)
    return torch.empty(0, dtype=out.dtype, device=out.device).set_(own, out.storage_offset(), out.shape, out.stride())


def _expire(handed: list, access_guard: Callable[[torch.UntypedStorage, str], None] | None) -> None:
    """Guard the storages of outputs handed out over memory about to be overwritten or freed."""
    for storage in handed:
        access_guard(storage, STALE_OUTPUT)
    handed.clear()


def _clone(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device).copy_(value)
