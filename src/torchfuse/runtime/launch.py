"""Launch generated Triton kernels: block sizes from the real sizes, and a direct path to the binary.

Block sizes are ``tl.constexpr``: the kernel source stays the same for every shape, and Triton
compiles one binary per distinct block size it is launched with.

Launch cost matters as much as kernel time on real models (a GPT-2 step launches ~120 kernels
of a few microseconds each). Triton's ``JITFunction.run`` binds arguments, computes a
specialization key, checks globals and builds launch metadata on every call. ``Launcher``
does that once per *specialization* (argument dtypes, 16-byte alignment of pointers, the
integer classes Triton specializes on, block sizes): the first call of a specialization goes
through Triton (compiling if needed) and keeps the ``CompiledKernel``; later calls hand the
arguments straight to the compiled binary: through torch's C++ launcher (``static_launch.py``:
only the parameters the binary takes, no Python layer of Triton's) where torch has it and the
binary qualifies, else through the binary's own C launcher. ``TORCHFUSE_STATIC_LAUNCH=0`` keeps
Triton's launcher for every binary.

The default config of each launch (grid, block sizes, warps, loop stages) is the tile policy
of ``launch_configs.py``.

A specialization compiled ahead (``triton_ahead.py``: predicted from the graph, compiled by the
worker pool) is given to the launcher with ``prepare``; its first call loads that binary and
launches it directly, so Triton compiles nothing on the critical path.

In ``mode="max-autotune"`` a launcher has a ``tuner`` (``autotune.KernelTuner``): the first call of
a specialization asks it for the ``Config`` (timed over candidates now, or read from disk), and
that config's binary serves every later call.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torchfuse.runtime import static_launch
from torchfuse.runtime.launch_configs import FLAT_KINDS, Config, default_config, has_row_loop

# Launches through Triton hold this lock. Triton's interpreter (kernels on CPU tensors) patches
# triton.language for the duration of a launch and restores it afterwards: two threads
# interpreting at once restored each other's patches, and a GPU kernel compiled meanwhile (a
# first launch compiles) saw the patched module and failed ("'ir.value' object has no attribute
# 'data'", found on an H200 when one test interpreted from four threads). Direct launches of a
# compiled binary touch neither, and take no lock.
_launch_lock = threading.RLock()


@dataclass
class LaunchStats:
    direct: int = 0  # launches handed straight to a compiled binary
    through_triton: int = 0  # launches through JITFunction.run (first of a specialization, interpreter)
    ahead: int = 0  # first launches of a specialization served by a binary compiled ahead
    ahead_failed: int = 0  # predicted specializations whose binary could not be loaded (Triton compiled it)
    static: int = 0  # binaries launched directly through torch's C++ launcher (static_launch.py)
    # binaries launched directly through Triton's own launcher instead, by the reason
    # static_launch gave (refused, or an error while preparing it)
    static_refused: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """The report's launch line ("" before any direct launch: CPU runs, Triton's interpreter)."""
        if not (self.direct or self.static or self.static_refused):
            return ""
        text = (f"GPU launches: {self.direct} straight to a compiled binary, {self.through_triton} through "
                f"Triton's JIT; binaries launched through torch's C++ launcher: {self.static}")
        refused = sum(self.static_refused.values())
        if refused:
            reasons = sorted(self.static_refused.items(), key=lambda item: -item[1])
            shown = "; ".join(f"{count} x {reason}" for reason, count in reasons[:3])
            more = f"; {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
            text += f", through Triton's launcher: {refused} ({shown}{more})"
        return text


stats = LaunchStats()


@dataclass(frozen=True)
class PointerArg:
    """A tensor argument as Triton specializes on it, for launches predicted before any tensor
    exists. ``data_ptr`` makes it acceptable to Triton's specializer, like Triton's MockTensor."""

    dtype: torch.dtype
    aligned: bool  # data_ptr() % 16 == 0

    def data_ptr(self) -> int:
        return 0 if self.aligned else 4


class Launcher:
    """One Triton kernel, launched with its compiled binary once a specialization is known.

    Args:
        fn: the ``triton.jit`` function (or the interpreter's, for CPU tensors).
        kind: "pointwise", "scatter" (launched as pointwise, see FLAT_KINDS) or "reduction".
        persistent: a reduction that holds its whole row in one tile.
        outer: a reduction tiled [RBLOCK, XBLOCK], lanes along the rows (codegen/triton/tiling.py).
        tile: a pointwise kernel tiled [YBLOCK, XBLOCK]: its (Z, Y, X) extents
            (codegen/triton/tiles2d.py); it launches like a 1-D one, with (xnumel, 0, args).
        live_tiles: a reduction's tiles live in one step (``TritonKernel.live_tiles``).
        special_step: a looped step computes special functions (``TritonKernel.special_step``).
        chunk_lanes: the default XBLOCK divides it (``TritonKernel.chunk_lanes``; 0: any).
    """

    def __init__(self, fn: Any, kind: str, persistent: bool = False, direct: bool | None = None,
                 current_device: Callable[[], int] | None = None,
                 current_stream: Callable[[int], int] | None = None, outer: bool = False,
                 tile: tuple[int, int, int] | None = None, live_tiles: int = 0,
                 fixed_args: frozenset[int] = frozenset(), special_step: int = 0, chunk_lanes: int = 0) -> None:
        self.fn = fn
        self.looped = has_row_loop(fn)
        self.live_tiles = live_tiles
        self.special_step = special_step
        self.chunk_lanes = chunk_lanes
        self.kind = kind
        self.persistent = persistent
        self.outer = outer
        self.tile = tile
        # (device, xnumel, rnumel, specialization of each argument) -> a direct launch: a binary
        # is loaded per device, and Triton launches on the current device's current stream.
        self.binaries: dict[tuple, Callable[..., None]] = {}
        # ((xnumel, rnumel, specialization of each argument), Config) -> loads, for the current
        # device, the binary compiled ahead for it (None if that failed: Triton then compiles as usual).
        self.ahead: dict[tuple[tuple, Config], Callable[[], Any]] = {}
        # max-autotune: an ``autotune.KernelTuner`` choosing each specialization's config, and
        # its choices by (xnumel, rnumel, specialization of each argument).
        self.tuner: Any = None
        self.chosen: dict[tuple, Config] = {}
        self.direct = _direct_launch_supported(fn) if direct is None else direct
        self.knobs = _runtime_knobs() if self.direct else None
        # Read from Triton's driver at the first launch (building a wrapper needs no GPU); tests
        # pass their own.
        self.current_device, self.current_stream = current_device, current_stream
        # specialization(args) for arguments of the classes seen first, as straight-line code
        # (spec_function); replaced when a call's arguments are of other classes.
        self._spec: Callable[..., tuple] = _no_spec
        # Argument positions whose specialization never changes between calls (the wrapper's
        # own CUDA buffers, literal integers: ``WrapperWriter.fixed_args``): the key takes
        # them from the first call, and direct launches skip their device check.
        self.fixed_args = fixed_args
        self._trusted: frozenset[int] = frozenset()  # fixed CUDA tensors, found at the first call
        # What the wrapper calls (``kernelN.launch(xnumel, rnumel, args...)``): this launcher
        # until its first direct call, then ``fast_launch_function``'s written-out path.
        self.launch: Callable[..., None] = self

    def __call__(self, xnumel: int, rnumel: int, *args: Any) -> None:
        """Launch over ``xnumel`` rows (of ``rnumel`` reduced elements) with the kernel's
        pointer, scalar and size arguments."""
        if xnumel <= 0:
            return
        key = None
        # The hot path: every step of a model runs it once per kernel, so it is kept to plain
        # attribute reads and calls (no generators, no per-argument loops).
        if self.direct and _launch_hooks_off(self.knobs):
            if self.current_device is None:
                self.current_device, self.current_stream = _cuda_device_and_stream()
            device = self.current_device()
            try:
                spec = self._spec(*args)
            except (AttributeError, TypeError):  # first call, or an argument of another class
                self._spec, self._trusted = spec_function(args, self.fixed_args, cuda_only=True)
                # written from the same arguments, so its key is always the one _spec gives
                self.launch = fast_launch_function(self, args)
                spec = self._spec(*args)
            key = (device, xnumel, rnumel, *spec)
            launch = self.binaries.get(key)
            if launch is None:
                launch = self._first_launch(key, args)
            if launch is not None:
                stats.direct += 1
                launch(self.current_stream(device), *args)
                return
        config = self._chosen_config(key, xnumel, rnumel, args)
        launch = self.launch_through_triton(config, xnumel, rnumel, args, binary=key is not None)
        if key is not None and launch is not None:
            self.binaries[key] = launch

    def prepare(self, xnumel: int, rnumel: int, args: tuple, load: Callable[[], Any],
                config: Config | None = None) -> None:
        """Launches over these sizes with arguments of these classes (``PointerArg`` for tensors,
        the predicted value for scalars) use the ``CompiledKernel`` that ``load`` returns, compiled
        for ``config`` (default: this launcher's default config for the sizes)."""
        if self.direct:
            config = config or self.config(xnumel, rnumel)
            self.ahead[(predicted_key(xnumel, rnumel, args), config)] = load

    def _first_launch(self, key: tuple, args: tuple) -> Callable[..., None] | None:
        """The direct launch for a specialization's first call: the tuner's choice (timed now:
        its binary is compiled already) and the binary compiled ahead for that config; None when
        Triton must compile it."""
        spec = key[1:]
        if self.tuner is not None and spec not in self.chosen:
            self.chosen[spec], launch = self.tuner.choose(self, key, key[1], key[2], args)
            if launch is not None:
                self.binaries[key] = launch
                return launch
        launch = self.ahead_launch(key, self.chosen.get(spec) or self.config(key[1], key[2]))
        if launch is not None:
            self.binaries[key] = launch
        return launch

    def _chosen_config(self, key: tuple | None, xnumel: int, rnumel: int, args: tuple) -> Config:
        """The config of a launch through Triton: the tuner's for this specialization, else the default."""
        if self.tuner is None:
            return self.config(xnumel, rnumel)
        spec = key[1:] if key is not None else (xnumel, rnumel, *specialization(args))
        if spec not in self.chosen:
            self.chosen[spec], _ = self.tuner.choose(self, None, xnumel, rnumel, args)
        return self.chosen[spec]

    def ahead_launch(self, key: tuple, config: Config) -> Callable[..., None] | None:
        """The direct launch of the binary compiled ahead for this launch key and config (None
        when there is none, or it could not be loaded: Triton compiles it then)."""
        load = self.ahead.get((key[1:], config))
        if load is None:
            return None
        compiled = load()  # waits for the worker if it is still compiling
        if compiled is None:
            stats.ahead_failed += 1
            return None
        stats.ahead += 1
        return _binary_launch(compiled, config.grid, (*self._numels(key[1], key[2]), *self._constexprs(config)),
                              len(key) - 3, self._trusted)

    def launch_through_triton(self, config: Config, xnumel: int, rnumel: int, args: tuple,
                              binary: bool) -> Callable[..., None] | None:
        """Launch once through ``JITFunction.run`` with ``config`` (compiling if needed); returns
        the direct launch of the binary it used when ``binary`` is asked for and there is one."""
        numels = self._numels(xnumel, rnumel)
        with _launch_lock:
            stats.through_triton += 1
            compiled = self.fn[(config.grid,)](*args, *numels, **config.kernel_constexprs(self.looped),
                                               **config.launch_options())
        if not binary or compiled is None:
            return None
        return _binary_launch(compiled, config.grid, (*numels, *self._constexprs(config)), len(args), self._trusted)

    def _constexprs(self, config: Config) -> tuple[int, ...]:
        return tuple(config.kernel_constexprs(self.looped).values())

    def _numels(self, xnumel: int, rnumel: int) -> tuple[int, ...]:
        return (xnumel,) if self.kind in FLAT_KINDS else (xnumel, rnumel)

    def config(self, xnumel: int, rnumel: int) -> Config:
        """The default config for these sizes."""
        return default_config(self.kind, self.persistent, self.outer, self.tile, xnumel, rnumel, self.live_tiles,
                              self.special_step, self.chunk_lanes)


def _specialization(arg: Any) -> Any:
    """What Triton specializes a kernel on for this argument (a finer key is safe; a coarser
    one would launch a binary compiled for other arguments)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() & 15 == 0
    if isinstance(arg, int) and not isinstance(arg, bool):
        # Triton makes 1 a constant, marks multiples of 16, and picks i32 or i64 by range.
        return arg == 1, arg & 15 == 0, -2**31 <= arg < 2**31
    return type(arg)


def _no_spec(*args: Any) -> tuple:
    raise TypeError("no specialization function yet")


def spec_function(args: tuple, fixed: frozenset[int] = frozenset(),
                  cuda_only: bool = False) -> tuple[Callable[..., tuple], frozenset[int]]:
    """A function giving ``specialization(args)`` for arguments of the same classes as ``args``,
    written out per argument (no loop, no isinstance chain: it runs at every launch), and the
    positions it trusts. An argument of another class raises AttributeError or TypeError, or,
    for a Python scalar, gets ``_specialization`` itself, so the result always equals
    ``specialization``.

    Positions in ``fixed`` hold what the caller promises never changes between calls (the
    wrapper's own buffers: same dtype, 16-byte aligned; literal integers): their part of the
    key is a constant taken from ``args``, which saves reading dtype and address at every
    launch (about 0.15 us a tensor here). A fixed tensor that is not aligned (or, with
    ``cuda_only``, not on a CUDA device) breaks the promise and is read every call like the
    others. The trusted positions returned are the fixed tensors kept constant."""
    parts, constants, trusted = _spec_parts(args, fixed, cuda_only)
    names = ", ".join(f"a{i}" for i in range(len(args)))
    source = f"def launch_spec({names}):\n    return ({', '.join(parts)}{',' if len(parts) == 1 else ''})\n"
    namespace: dict[str, Any] = {"spec": _specialization, **constants}
    exec(compile(source, "<torchfuse launch spec>", "exec"), namespace)
    return namespace["launch_spec"], trusted


def _spec_parts(args: tuple, fixed: frozenset[int], cuda_only: bool) -> tuple[list[str], dict[str, Any], frozenset[int]]:
    """``spec_function``'s expressions, one per argument ``a<i>``, the constants they name
    (``c<i>``) and the trusted positions."""
    parts, constants, trusted = [], {}, set()
    for i, arg in enumerate(args):
        a = f"a{i}"
        if i in fixed and _can_fix(arg, cuda_only):
            constants[f"c{i}"] = _specialization(arg)
            parts.append(f"c{i}")
            if isinstance(arg, torch.Tensor):
                trusted.add(i)
        elif isinstance(arg, torch.Tensor):
            parts.append(f"({a}.dtype, {a}.data_ptr() & 15 == 0)")
        elif type(arg) is int:
            parts.append(f"({a} == 1, {a} & 15 == 0, -2147483648 <= {a} < 2147483648) if type({a}) is int "
                         f"else spec({a})")
        else:
            parts.append(f"spec({a})")
    return parts, constants, frozenset(trusted)


def fast_launch_function(launcher: "Launcher", args: tuple) -> Callable[..., None]:
    """``launcher.launch`` for arguments of these classes (written when ``spec_function`` is, from
    the same arguments): the whole hot path of ``Launcher.__call__``, the key inline and the
    binary called with the arguments as they came (no ``*args`` tuple, no method call, no
    separate key function: 0.5-0.6 us less a launch of 8 tensors here). Anything else (no
    binary yet for the key, an argument of another class, a launch hook set, an empty
    launch) goes to ``Launcher.__call__``, which handles it and writes this again."""
    parts, constants, _ = _spec_parts(args, launcher.fixed_args, cuda_only=True)
    names = ", ".join(f"a{i}" for i in range(len(args)))
    key = ", ".join(["device", "xnumel", "rnumel", *parts])
    source = (
        f"def launch(xnumel, rnumel, {names}):\n"
        f"    if xnumel > 0 and hooks_off(knobs):\n"
        f"        device = current_device()\n"
        f"        try:\n"
        f"            binary = binaries.get(({key}))\n"
        f"        except (AttributeError, TypeError):\n"
        f"            binary = None\n"
        f"        if binary is not None:\n"
        f"            stats.direct += 1\n"
        f"            binary(current_stream(device), {names})\n"
        f"            return\n"
        f"    launcher(xnumel, rnumel, {names})\n")
    namespace: dict[str, Any] = {
        "spec": _specialization, "hooks_off": _launch_hooks_off, "knobs": launcher.knobs, "stats": stats,
        "current_device": launcher.current_device, "current_stream": launcher.current_stream,
        "binaries": launcher.binaries, "launcher": launcher, **constants}
    exec(compile(source, "<torchfuse fast launch>", "exec"), namespace)
    return namespace["launch"]


def _can_fix(arg: Any, cuda_only: bool) -> bool:
    """Whether a promised-fixed argument may really be: an aligned tensor (on a CUDA device when
    ``cuda_only``) or a plain int."""
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr() & 15 == 0 and (arg.is_cuda or not cuda_only)
    return type(arg) is int


def specialization(args: tuple) -> tuple:
    """What Triton specializes a launch on, argument by argument (the launch key without the
    device and sizes)."""
    return tuple(_specialization(a) for a in args)


def predicted_key(xnumel: int, rnumel: int, args: tuple) -> tuple:
    """The launch key (without the device) of a predicted launch: what ``_specialization`` gives
    for tensors of these ``PointerArg`` classes and for these scalars."""
    return (xnumel, rnumel, *[(a.dtype, a.aligned) if isinstance(a, PointerArg) else _specialization(a) for a in args])


def _direct_launch_supported(fn: Any) -> bool:
    """Direct launches need a GPU kernel (not the interpreter's) and Triton's launcher calling
    convention of 3.4 and later: (grid, stream, function, packed metadata, launch metadata,
    enter hook, exit hook, every parameter including constexprs)."""
    try:
        import triton
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    return isinstance(fn, JITFunction) and version >= (3, 4)


def _runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


def _launch_hooks_off(knobs: Any) -> bool:
    """Triton's launch hooks (Proton, for one) want its launch metadata: go through Triton then.
    A hook is None (Triton 3.4-3.6) or a chain of callables, empty when none is set (later).
    Runs at every launch: two plain tests, not a generator over the hooks."""
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    return ((enter is None or not getattr(enter, "calls", True))
            and (exit_ is None or not getattr(exit_, "calls", True)))


def _cuda_device_and_stream() -> tuple[Callable[[], int], Callable[[int], int]]:
    """The current device and its raw current stream, as Triton's launch path reads them
    (``torch.cuda.current_device``, ``torch._C._cuda_getCurrentRawStream``) minus the Python
    layer: ``current_device`` runs ``torch.cuda._lazy_init`` at every call (~10 us a launch in
    a cProfile of EfficientNet on the H200). CUDA is initialized once here instead."""
    torch.cuda._lazy_init()
    return torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream


def _binary_launch(compiled: Any, grid: int, tail: tuple[int, ...], n_args: int,
                   trusted: frozenset[int] = frozenset()) -> Callable[..., None]:
    """Launch ``compiled`` on a stream, without Triton's Python layer: ``tail`` holds the numels
    and block sizes, fixed for this specialization, after the ``n_args`` arguments of a launch.
    Through torch's C++ launcher where it is available and the binary qualifies
    (``static_launch``), else through the binary's own C launcher; a refusal or an error while
    preparing the former is counted, with its reason, in ``stats.static_refused``. ``trusted``:
    argument positions known to hold CUDA tensors (no device check at each launch)."""
    # ``run`` first: reading it loads the binary onto the current device (a CompiledKernel made
    # from a cached binary has no ``function`` before that), with Triton's checks of shared
    # memory and threads against the device.
    run = compiled.run
    static = _static_launch(compiled, grid, tail, n_args, trusted)
    if static is not None:
        return static
    function, metadata = compiled.function, compiled.packed_metadata

    def launch(stream: int, *args: Any) -> None:
        run(grid, 1, 1, stream, function, metadata, None, None, None, *args, *tail)

    launch.compiled = compiled  # the module ``function`` lives in is unloaded with its CompiledKernel
    return launch


def _static_launch(compiled: Any, grid: int, tail: tuple[int, ...], n_args: int,
                   trusted: frozenset[int] = frozenset()) -> Callable[..., None] | None:
    """``static_launch.static_launch``, or None (counted, with why) where it is off or refused."""
    if not static_launch.enabled():
        reason = f"{static_launch.ENV_VARIABLE}=0"
    else:
        try:
            launch = static_launch.static_launch(compiled, grid, tail, n_args, trusted)
        except static_launch.Refused as refused:
            reason = str(refused)
        except Exception as error:  # noqa: BLE001 - Triton's launcher still serves this binary
            reason = f"error preparing it: {type(error).__name__}: {error}"
        else:
            stats.static += 1
            return launch
    stats.static_refused[reason] = stats.static_refused.get(reason, 0) + 1
    return None
