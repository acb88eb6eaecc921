"""The warm cache: a later process compiles a captured graph without AOTAutograd's tracing.

AOTAutograd traces every graph Dynamo captures (fake tensors, functionalization, decompositions,
the joint forward/backward graph, the min-cut partition), which costs seconds per model in every
process. This cache keeps what that tracing produced, keyed on Dynamo's graph and everything else
the result depends on (``aot_key.py``): the forward and backward ATen graphs as handed to the
pipeline (``aot_snapshot.py``) and the metadata AOTAutograd's runtime wrappers need
(``ViewAndMutationMeta``, the dedupe / synthetic-base wrappers, which forward outputs are saved
for the backward, which inputs to detach). A hit hands the graphs to the pipeline (whose graph
cache then finds the code) and wraps the result in the same runtime wrappers AOTAutograd builds,
with the same calls, so input mutations, outputs that alias inputs, the autograd.Function with
its saved tensors and RNG functionalization behave as after tracing.

How it plugs in: ``aot_module_simplified`` consults ``AOTAutogradCache.try_load`` when the forward
compiler is a ``SerializableAOTDispatchCompiler``, and on a miss it builds the cache entry with
``AOTAutogradCache.generate_guards_expression``, ``make_entry`` and ``save`` once both graphs are
compiled. Those classes are tied to Inductor's output code, so ``install_hooks`` replaces the
name ``AOTAutogradCache`` in the two functorch modules that use it by a subclass that serves the
calls of a torchfuse compile and passes every other call (Inductor's) to torch's own class. The
entry is built from exactly the values torch's own cache keeps, at the moment torch builds it.

Correctness first: anything the key cannot describe, a tensor-subclass graph, guards added while
tracing, an entry that does not pickle or does not load is not cached, and the reason is counted
(``stats``, shown by ``torchfuse.report()``). Where this torch's functorch does not have the
expected shape, the hooks are not installed and every graph is traced as before.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import pickle
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._functorch._aot_autograd.graph_compile as graph_compile
import torch._functorch._aot_autograd.runtime_wrappers as rt
import torch._functorch.aot_autograd as aot_autograd
import torch.fx
from torch._functorch._aot_autograd.logging_utils import track_graph_compiling
from torch._functorch._aot_autograd.schemas import AOTAutogradCacheInfo, AOTConfig
from torch._guards import TracingContext, detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from torchfuse.frontend import aot_key
from torchfuse.frontend.aot_snapshot import GraphSnapshot, Uncacheable, snapshot

FORMAT = "torchfuse-aot-entry-1"
KEY_PREFIX = "torchfuse-aot-"
# torch versions whose AOTAutograd this was written against and tested with (major, minor).
KNOWN_TORCH = ((2, 11), (2, 12), (2, 13))


@dataclass
class WarmCacheStats:
    hits: int = 0
    misses: int = 0  # looked up, not found (traced, then stored when possible)
    stored: int = 0
    hit_seconds: float = 0.0  # rebuilding hits: loading, the pipeline's graph cache, wrappers
    not_cached: Counter = field(default_factory=Counter)  # reason -> graphs traced without the cache
    not_stored: Counter = field(default_factory=Counter)  # reason -> traced graphs whose entry was not kept
    not_loaded: Counter = field(default_factory=Counter)  # reason -> entries found but not used

    def __str__(self) -> str:
        text = f"warm cache: {self.hits} hits ({self.hit_seconds:.2f} s), {self.misses} misses, {self.stored} stored"
        for title, reasons in (("not cached", self.not_cached), ("not stored", self.not_stored),
                               ("not loaded", self.not_loaded)):
            if reasons:
                text += f"; {title}: " + ", ".join(f"{reason} ({n})" for reason, n in reasons.most_common())
        return text


stats = WarmCacheStats()


@dataclass(frozen=True)
class WarmCache:
    """Where entries live and torchfuse's own part of the key (api.py fills both in)."""
    load: Callable[[str], bytes | None]  # an intact entry's bytes, or None
    save: Callable[[str, bytes], None]
    key_text: Callable[[], str]  # torchfuse's source, options, environment, machine


@dataclass(frozen=True)
class Compilers:
    """The pipeline for each kind of graph, as ``aot_backend`` hands them to aot_autograd."""
    inference: Callable[[torch.fx.GraphModule, list[Any]], Callable]
    forward: Callable[[torch.fx.GraphModule, list[Any]], Callable]
    backward: Callable[[torch.fx.GraphModule, list[Any]], Callable]


@dataclass
class AotEntry:
    """What AOTAutograd's runtime wrappers are rebuilt from (torch's own cache keeps the same)."""
    format: str
    torch_version: str
    forward: GraphSnapshot  # the forward graph, or the inference graph
    backward: GraphSnapshot | None  # None: an inference graph
    runtime_metadata: Any  # ViewAndMutationMeta, made runtime-safe by AOTAutograd
    dispatch_wrappers: list  # CompilerWrapper: dedupe, synthetic bases (applied outermost)
    num_fw_outs_saved_for_bw: int | None
    indices_of_inps_to_detach: list[int]
    num_symints_saved_for_bw: int | None
    backward_module: Any = None  # the backward GraphModule's pickle recipe, for compiled autograd


# -- marking what the pipeline compiled ------------------------------------------------------
SNAPSHOT_ATTRIBUTE = "_torchfuse_aot_snapshot"


def recorded(compile_one: Callable[[torch.fx.GraphModule, list[Any]], Callable]) -> Callable:
    """``compile_one`` that also keeps a snapshot of the graph it compiles (taken before the
    pipeline rewrites the graph) on the callable it returns, where ``make_entry`` finds it."""

    def compile_and_record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        try:
            taken: GraphSnapshot | str = snapshot(gm, example_inputs)
        except Uncacheable as reason:
            taken = str(reason)
        except Exception as error:  # noqa: BLE001 - the cache never fails a compile: not stored
            taken = f"the snapshot failed ({_describe_error(error)})"
        call = compile_one(gm, example_inputs)
        setattr(call, SNAPSHOT_ATTRIBUTE, taken)
        # AOTAutograd asks for an entry only when every compiled graph names its cache key.
        call._fx_graph_cache_key = KEY_PREFIX + "graph"
        return call

    return compile_and_record


# -- the torch side: hooks into AOTAutograd's cache ------------------------------------------
_serving = threading.local()  # .request: a _Request while a torchfuse backend runs aot_autograd
_installed: list[str] = []  # "" once installed, else why not


def install_hooks() -> str | None:
    """Put the hooks in place (once); None when they are, else why they cannot be."""
    if not _installed:
        _installed.append(_install())
    return _installed[0] or None


def _install() -> str:
    version = tuple(int(p) for p in torch.__version__.split(".")[:2])
    if version not in KNOWN_TORCH:
        return f"torch {torch.__version__} is not a version this cache was written for"
    original = getattr(graph_compile, "AOTAutogradCache", None)
    if original is None or getattr(aot_autograd, "AOTAutogradCache", None) is not original:
        return "AOTAutograd's cache class is not where expected"
    missing = [m for m in ("try_load", "generate_guards_expression", "make_entry", "save") if not hasattr(original, m)]
    if missing:
        return f"AOTAutograd's cache has no {', '.join(missing)}"
    frozen = AOTConfig.__dataclass_params__.frozen
    returns_pair = str(inspect.signature(original.try_load).return_annotation).startswith("tuple")
    if frozen != returns_pair:
        return "AOTAutograd's try_load hands back its configuration in an unknown way"
    hooked = _hooked_cache(original, AOTAutogradCacheInfo, returns_pair)
    graph_compile.AOTAutogradCache = hooked
    aot_autograd.AOTAutogradCache = hooked
    return ""


@dataclass
class _Job:
    """A miss being traced: carried by AOTAutograd in ``aot_config.cache_info`` until it saves."""
    cache: WarmCache
    guards: tuple[int, int] | None  # the ShapeEnv's guards and assertions when tracing began
    shape_env: Any


@dataclass(frozen=True)
class _Guards:
    """What ``generate_guards_expression`` hands ``make_entry`` for a torchfuse entry."""
    job: _Job
    added: bool  # tracing added shape guards: a hit could not replay them


def _hooked_cache(original: type, cache_info_type: type, returns_pair: bool) -> type:
    make_entry_signature = inspect.signature(original.make_entry)

    @dataclasses.dataclass
    class TorchfuseCacheInfo(cache_info_type):  # type: ignore[misc, valid-type]
        job: Any = None

    class HookedAOTAutogradCache(original):  # type: ignore[misc, valid-type]
        """torch's AOTAutogradCache, serving torchfuse's compiles from the warm cache."""

        @staticmethod
        def try_load(mod: Any, args: Any, aot_config: Any, *rest: Any, **kwargs: Any) -> Any:
            request = getattr(_serving, "request", None)
            if request is None or request.cache is None:
                return original.try_load(mod, args, aot_config, *rest, **kwargs)
            request.consulted = True
            compiled, key, tracing = _try_load(request, mod, list(args), aot_config)
            if compiled is None:
                request.tracing_begins()
            if compiled is None and key is not None:
                info = TorchfuseCacheInfo(key, time.time_ns(), [], job=tracing)
                if returns_pair:
                    aot_config = dataclasses.replace(aot_config, cache_info=info)
                else:
                    aot_config.cache_info = info
            return (compiled, aot_config) if returns_pair else compiled

        @staticmethod
        def generate_guards_expression(cache_info: Any) -> Any:
            job = getattr(cache_info, "job", None)
            if not isinstance(job, _Job):
                return original.generate_guards_expression(cache_info)
            return _Guards(job, added=_guard_marks(job.shape_env) != job.guards)

        @staticmethod
        def make_entry(*args: Any, **kwargs: Any) -> Any:
            bound = make_entry_signature.bind(*args, **kwargs).arguments
            if not isinstance(bound.get("guards_expr"), _Guards):
                return original.make_entry(*args, **kwargs)
            return _make_entry(bound)

        @staticmethod
        def save(key: str, entry: Any, *args: Any, **kwargs: Any) -> None:
            if not isinstance(entry, _Pending):
                return original.save(key, entry, *args, **kwargs)
            _save(key, entry)

    return HookedAOTAutogradCache


# -- lookup and rebuild ----------------------------------------------------------------------
@dataclass
class _Request:
    """One torchfuse backend call: where to look, what compiles a hit's graphs, what to start
    before tracing (the GPU compile workers: a hit compiles nothing, and needs none)."""
    cache: WarmCache | None
    compilers: Compilers
    before_tracing: Callable[[], Any] | None
    refusal: str | None = None  # why this call's graph is not cached, known before aot_autograd runs
    started: bool = False
    consulted: bool = False  # aot_autograd asked the cache (it does not when torch's caches are off)

    def tracing_begins(self) -> None:
        if self.before_tracing is not None and not self.started:
            self.started = True
            self.before_tracing()

    def __enter__(self) -> "_Request":
        self.previous = getattr(_serving, "request", None)
        _serving.request = self
        if self.cache is None:
            self.tracing_begins()
        return self

    def __exit__(self, *exc: Any) -> None:
        _serving.request = self.previous
        if self.cache is not None and not self.consulted and exc[0] is None:
            stats.not_cached[TORCH_CACHES_OFF] += 1


# aot_autograd consults no cache when torch's are off (torch.compiler.config.force_disable_caches,
# TORCHINDUCTOR_AUTOGRAD_CACHE=0 or torch._functorch.config.enable_autograd_cache = False).
TORCH_CACHES_OFF = "AOTAutograd's cache is turned off in torch"


def serving(cache: WarmCache | None, compilers: Compilers, before_tracing: Callable[[], Any] | None,
            example_inputs: list[Any]) -> _Request:
    """While a torchfuse backend runs aot_autograd on Dynamo's ``example_inputs``: its lookups go
    to ``cache`` (None: no lookup), and ``before_tracing`` runs once unless the cache serves the
    graph."""
    return _Request(cache, compilers, before_tracing, _subclass_input(example_inputs))


def _subclass_input(example_inputs: list[Any]) -> str | None:
    """Tensor subclasses are not cached. This is checked on Dynamo's inputs because aot_autograd
    unwraps some (AsyncCollectiveTensor: it waits for the collective) before the cache sees them,
    and a hit would then skip that wait."""
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and \
                type(value) not in (torch.Tensor, torch.nn.Parameter):
            return f"a tensor-subclass input ({type(value).__name__})"
    return None


def _try_load(request: _Request, mod: Any, args: list[Any],
              aot_config: Any) -> tuple[Callable | None, str | None, _Job | None]:
    """(the rebuilt callable, None, None) on a hit; (None, key, job) on a miss to trace and store;
    (None, None, None) for a graph the cache does not take."""
    cache, compilers = request.cache, request.compilers
    if request.refusal is not None:
        stats.not_cached[request.refusal] += 1
        return None, None, None
    try:
        key = _key(cache, mod, args, aot_config)
    except Uncacheable as reason:
        stats.not_cached[str(reason)] += 1
        return None, None, None
    except Exception as error:  # noqa: BLE001 - the cache never fails a compile: traced uncached
        stats.not_cached[f"the key failed ({_describe_error(error)})"] += 1
        return None, None, None
    fake_mode = detect_fake_mode(args)
    shape_env = getattr(fake_mode, "shape_env", None)
    job = _Job(cache, _guard_marks(shape_env), shape_env)
    payload = cache.load(key)
    if payload is None:
        stats.misses += 1
        return None, key, job
    started = time.perf_counter()
    try:
        entry = _unpickle(payload)
        compiled = _rebuild(entry, compilers, fake_mode or FakeTensorMode(), aot_config)
    except Exception as error:  # noqa: BLE001 - an entry that does not load is traced again and replaced
        stats.not_loaded[_describe_error(error)] += 1
        return None, key, job
    stats.hits += 1
    stats.hit_seconds += time.perf_counter() - started
    return compiled, None, None


def _key(cache: WarmCache, mod: Any, args: list[Any], aot_config: Any) -> str:
    if not isinstance(mod, torch.fx.GraphModule):
        raise Uncacheable(f"the captured graph comes as a {type(mod).__name__}")
    context = TracingContext.try_get()
    if context is not None and getattr(context, "fakify_first_call", False):
        raise Uncacheable("Dynamo asked for the first call to be fakified")
    digest = hashlib.sha256()
    for part in (cache.key_text(), *aot_key.key_parts(mod, args, aot_config)):
        digest.update(part.encode())
        digest.update(b"\0")
    return KEY_PREFIX + digest.hexdigest()


def _unpickle(payload: bytes) -> AotEntry:
    entry = pickle.loads(payload)
    if not isinstance(entry, AotEntry) or entry.format != FORMAT or entry.torch_version != torch.__version__:
        raise ValueError("an entry of another format or torch version")
    return entry


def _rebuild(entry: AotEntry, compilers: Compilers, fake_mode: FakeTensorMode, aot_config: Any) -> Callable:
    """What AOTAutograd would return, from the entry: the pipeline compiles the stored graphs and
    the result is wrapped as ``GenericAOTAutogradResult.wrap_post_compile`` wraps a hit of torch's
    own cache (torch/_functorch/_aot_autograd/aot_autograd_result.py)."""
    metadata = entry.runtime_metadata
    training = entry.backward is not None
    context = TracingContext.try_get()
    if context is not None:
        context.fw_metadata = metadata  # as AOTAutograd sets it before compiling the forward
    gm, inputs = entry.forward.rebuild(fake_mode)
    # Under the grad and autocast modes AOTAutograd compiles each graph in (graph_compile.py).
    with contextlib.ExitStack() as modes:
        if training:
            modes.enter_context(torch.no_grad())
        if training or torch._C._is_any_autocast_enabled():
            modes.enter_context(torch._C._DisableAutocast())
        modes.enter_context(track_graph_compiling(aot_config, "forward" if training else "inference"))
        if training:
            # As AOTAutograd collects them: the forward may then lay out its saved tensors as
            # when traced (padded matmul results, scheduler/reader_layout.py), which the stored
            # backward's inputs already assume. What it reports is not needed again.
            modes.enter_context(TracingContext.report_output_strides())
        compiled_fw = (compilers.forward if training else compilers.inference)(gm, inputs)
    compiled_bw = None
    if training:
        gm, inputs = entry.backward.rebuild(fake_mode)
        with torch.no_grad(), track_graph_compiling(aot_config, "backward"), torch._C._DisableAutocast():
            compiled_bw = compilers.backward(gm, inputs)
        # As aot_autograd's backend wraps the backward compiler's result: Dynamo must not trace it.
        compiled_bw = torch._dynamo.disable(compiled_bw, reason="do not trace generated backwards pass")

    compiled_fw = rt.AOTDispatchSubclassWrapper(
        trace_joint=training, fw_only=None, maybe_subclass_meta=None,
        num_fw_outs_saved_for_bw=entry.num_fw_outs_saved_for_bw,
    ).post_compile(compiled_fw, aot_config, runtime_metadata=metadata)
    compiled_fw = rt.FunctionalizedRngRuntimeWrapper(return_new_outs=not training).post_compile(
        compiled_fw, aot_config, runtime_metadata=metadata)
    compiled_fw._boxed_call = True
    disable_amp = torch._C._is_any_autocast_enabled()
    if training:
        compiled = _autograd_function(entry, compiled_fw, compiled_bw, disable_amp, aot_config)
    else:
        compiled = rt.RuntimeWrapper(indices_of_inps_to_detach=entry.indices_of_inps_to_detach, trace_joint=False,
                                     disable_amp=disable_amp).post_compile(compiled_fw, aot_config,
                                                                           runtime_metadata=metadata)
    wrapped = rt.post_compile(entry.dispatch_wrappers, compiled, aot_config, runtime_metadata=metadata)
    return wrapped[0] if isinstance(wrapped, tuple) else wrapped


def _autograd_function(entry: AotEntry, compiled_fw: Callable, compiled_bw: Callable, disable_amp: bool,
                       aot_config: Any) -> Callable:
    """AOTDispatchAutograd.post_compile: the autograd.Function running both graphs (its arguments
    became one spec object in torch 2.12)."""
    lazy = None
    if entry.backward_module is not None:
        lazy = rt.CachedAutogradLazyBackwardCompileInfo(entry.backward_module.deserialize)
    common = dict(compiled_fw_func=compiled_fw, compiled_bw_func=compiled_bw, maybe_subclass_meta=None,
                  backward_state_indices=[], disable_amp=disable_amp,
                  indices_of_inps_to_detach=entry.indices_of_inps_to_detach, lazy_backward_info=lazy,
                  aot_config=aot_config, fw_metadata=entry.runtime_metadata, try_save_cache_entry=None)
    if hasattr(rt, "AOTDispatchAutogradCompileSpec"):
        spec = rt.AOTDispatchAutogradCompileSpec(num_symints_saved_for_bw=entry.num_symints_saved_for_bw,
                                                 bw_compiler=None, **common)
        return rt.AOTDispatchAutograd.post_compile(spec)
    return rt.AOTDispatchAutograd.post_compile(
        common["compiled_fw_func"], common["compiled_bw_func"], None, entry.num_symints_saved_for_bw, [],
        disable_amp, entry.indices_of_inps_to_detach, lazy, aot_config, fw_metadata=entry.runtime_metadata,
        try_save_cache_entry=None)


# -- storing ---------------------------------------------------------------------------------
@dataclass
class _Pending:
    """``make_entry``'s result for a torchfuse compile: the entry, or why there is none."""
    job: _Job
    entry: AotEntry | None
    reason: str | None


def _make_entry(fields_: dict[str, Any]) -> _Pending:
    guards: _Guards = fields_["guards_expr"]
    try:
        pending = _Pending(guards.job, _entry(fields_, guards), None)
    except Uncacheable as reason:
        pending = _Pending(guards.job, None, str(reason))
    except Exception as error:  # noqa: BLE001 - the cache never fails a compile: not stored
        pending = _Pending(guards.job, None, f"the entry failed ({_describe_error(error)})")
    for compiled in (fields_.get("compiled_fw_func"), fields_.get("compiled_bw_func")):
        if hasattr(compiled, SNAPSHOT_ATTRIBUTE):  # the entry has it now: the compiled graph need not
            delattr(compiled, SNAPSHOT_ATTRIBUTE)
    return pending


def _entry(fields_: dict[str, Any], guards: _Guards) -> AotEntry:
    if guards.added:
        raise Uncacheable("tracing added shape guards")
    if fields_.get("maybe_subclass_meta") is not None:
        raise Uncacheable("tensor subclasses")
    if fields_.get("backward_state_indices"):
        raise Uncacheable("a BackwardState input (compiled autograd hooks)")
    metadata = fields_["runtime_metadata"]
    if getattr(metadata, "tokens", None):
        raise Uncacheable("effect tokens (side-effecting ops)")  # torch's hit path skips their wrapper
    if getattr(metadata, "num_graphsafe_rng_states", 0):
        raise Uncacheable("graph-safe RNG states")
    forward = _snapshot_of(fields_["compiled_fw_func"])
    backward = _snapshot_of(fields_["compiled_bw_func"]) if fields_.get("compiled_bw_func") is not None else None
    recipe = fields_.get("serialized_bw_module")
    return AotEntry(FORMAT, torch.__version__, forward, backward, fields_["runtime_metadata"],
                    list(fields_["dispatch_wrappers"]), fields_.get("num_fw_outs_saved_for_bw"),
                    list(fields_.get("indices_of_inps_to_detach") or []), fields_.get("num_symints_saved_for_bw"),
                    _ModuleRecipe(recipe.fn, recipe.args) if recipe is not None else None)


def _snapshot_of(compiled: Any) -> GraphSnapshot:
    taken = getattr(compiled, SNAPSHOT_ATTRIBUTE, None)
    if isinstance(taken, GraphSnapshot):
        return taken
    raise Uncacheable(taken if isinstance(taken, str) else "a graph torchfuse did not compile")


@dataclass(frozen=True)
class _ModuleRecipe:
    """A GraphModule as ``GraphModule.__reduce__`` gives it (torch's own holder of it lives in a
    module that imports Inductor)."""
    fn: Callable
    args: tuple

    def deserialize(self) -> torch.fx.GraphModule:
        return self.fn(*self.args)


def _save(key: str, pending: _Pending) -> None:
    if pending.entry is None:
        stats.not_stored[pending.reason or "unknown"] += 1
        return
    try:
        with _disable_current_modes():
            payload = pickle.dumps(pending.entry, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - e.g. a wrapper holding something pickle cannot write
        stats.not_stored[f"does not pickle ({type(error).__name__})"] += 1
        return
    pending.entry = None  # the compiled function keeps this object: drop the graphs
    try:
        pending.job.cache.save(key, payload)
    except OSError as error:  # a full or read-only disk: the compile goes on
        stats.not_stored[f"could not write ({_describe_error(error)})"] += 1
        return
    stats.stored += 1


def _describe_error(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"[:160]


def _guard_marks(shape_env: Any) -> tuple[int, int] | None:
    if shape_env is None:
        return None
    asserts = sum(len(v) for v in getattr(shape_env, "deferred_runtime_asserts", {}).values())
    return len(shape_env.guards), asserts
