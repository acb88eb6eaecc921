"""What Dynamo did while code ran: graph breaks, frame compiles, recompiles and their guards,
recompile-limit hits. The only place in torchfuse that reads these from torch's internals.

Sources, each used through a narrow, guarded door so that torch 2.11 to 2.15 all work:
- graph breaks: the ``graph_breaks`` logging artifact (``torch._dynamo.symbolic_convert``), which
  says "Graph break in user code at FILE:LINE", the reason, and the user traceback;
- frame compiles and recompile reasons (the guard that failed): ``torch._dynamo.utils.
  get_compilation_metrics()``, one record per frame compile;
- recompile-limit hits: the warning ``torch._dynamo.convert_frame`` logs ("hit config.recompile_limit").

Parsing is forgiving: a record that does not match is kept with what could be read, never raised.
"""
from __future__ import annotations

import linecache
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch._dynamo import exc as dynamo_exc
from torch._dynamo import utils as dynamo_utils

_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
_CONVERT_FRAME_LOGGER = "torch._dynamo.convert_frame"
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<name>\S+))?\s*$')
_AT_RE = re.compile(r"in user code at (?P<file>.+):(?P<line>\d+)\s*$", re.M)
_SIZE_RE = re.compile(r"tensor '(?P<name>.+?)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)\. "
                      r"expected (?P<old>\d+), actual (?P<new>\d+)")
_GUARD_CODE_RE = re.compile(r"#\s(?P<code>.+?)\s+#\s(?P<file>\S+):(?P<line>\d+) in (?P<name>\S+)")
_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCHFUSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class UserFrame:
    """One frame of user code: where, and the text of the line."""

    filename: str
    lineno: int
    name: str = ""
    line: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


@dataclass(frozen=True)
class GraphBreakEvent:
    reason: str  # short: the kind of break and Dynamo's one-line explanation
    detail: str  # Dynamo's full message
    location: UserFrame | None  # the innermost frame in user code
    frames: tuple[UserFrame, ...] = ()
    compile_id: str | None = None


@dataclass(frozen=True)
class ShapeChange:
    """A guard on a tensor's size or stride failed: ``dim`` of ``tensor`` went ``old`` -> ``new``."""

    tensor: str
    dim: int
    old: int
    new: int
    what: str = "size"

    def __str__(self) -> str:
        which = "dim" if self.what == "size" else "stride of dim"
        return f"{which} {self.dim} of `{self.tensor}`: {self.old} \u2192 {self.new}"


@dataclass(frozen=True)
class FrameCompile:
    """One compile of one Python frame by Dynamo (a first compile or a recompile)."""

    compile_id: str
    function: str  # co_name; "" for a backward compile
    filename: str
    firstlineno: int
    seconds: float
    recompile_reason: str | None = None  # the guard that failed, as Dynamo words it
    fail_type: str | None = None
    fail_reason: str | None = None
    op_count: int | None = None
    is_forward: bool = True

    @property
    def frame_id(self) -> str:
        return frame_of(self.compile_id)


@dataclass(frozen=True)
class RecompileLimitHit:
    function: str
    filename: str
    lineno: int
    limit_name: str
    limit: int
    last_reason: str


@dataclass
class DynamoEvents:
    """Collects Dynamo's events while active (``with DynamoEvents() as events: ...``)."""

    breaks: list[GraphBreakEvent] = field(default_factory=list)
    limit_hits: list[RecompileLimitHit] = field(default_factory=list)
    _known_metrics: set[int] = field(default_factory=set)
    _saved: list[tuple[logging.Logger, int, bool]] = field(default_factory=list)
    _handler: logging.Handler | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> "DynamoEvents":
        _ensure_metrics_capacity()
        self._known_metrics = {id(m) for m in _raw_metrics()}
        self._handler = _Handler(self)
        for name in (_BREAK_LOGGER, _CONVERT_FRAME_LOGGER):
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level, logger.propagate))
            logger.addHandler(self._handler)
        breaks = logging.getLogger(_BREAK_LOGGER)
        if not breaks.isEnabledFor(logging.DEBUG):
            # Not asked for by the user (TORCH_LOGS=graph_breaks): collect without printing.
            breaks.setLevel(logging.DEBUG)
            breaks.propagate = False
        return self

    def __exit__(self, *exc: Any) -> None:
        for logger, level, propagate in self._saved:
            logger.removeHandler(self._handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._saved.clear()

    def compiles(self) -> list[FrameCompile]:
        """Frame compiles since this collector started, in order."""
        return self.compiles_from(0)

    def compile_count(self) -> int:
        """A position in Dynamo's record of compiles (for ``compiles_from``)."""
        return len(_raw_metrics())

    def compiles_from(self, position: int) -> list[FrameCompile]:
        """Frame compiles recorded after ``compile_count()`` returned ``position``."""
        return [_frame_compile(m) for m in _raw_metrics()[position:] if id(m) not in self._known_metrics]

    def _on_record(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record we cannot format is skipped
            return
        with self._lock:
            if record.name == _BREAK_LOGGER:
                event = parse_graph_break(message, current_compile_id())
                if event is not None:
                    self.breaks.append(event)
            elif "recompile_limit" in message or "cache_size_limit" in message:
                hit = parse_limit_warning(message)
                if hit is not None:
                    self.limit_hits.append(hit)


class _Handler(logging.Handler):
    def __init__(self, events: DynamoEvents) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events._on_record(record)


# -- parsing ------------------------------------------------------------------------------------
def parse_graph_break(message: str, compile_id: str | None = None) -> GraphBreakEvent | None:
    """A ``graph_breaks`` log message as an event; None if it is not one."""
    if "Graph break" not in message:
        return None
    reason_text = message.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in message else message
    reason_text = reason_text.split("User code traceback:", 1)[0]
    traceback_text = message.split("User code traceback:", 1)[1] if "User code traceback:" in message else ""
    frames = tuple(parse_frames(traceback_text))
    location = innermost_user_frame(frames)
    if location is None:
        match = _AT_RE.search(message)
        if match:
            filename, lineno = match.group("file"), int(match.group("line"))
            location = UserFrame(filename, lineno, "", _source_line(filename, lineno))
    return GraphBreakEvent(short_reason(reason_text), reason_text.strip(), location, frames, compile_id)


def parse_frames(text: str) -> list[UserFrame]:
    """Frames of a traceback formatted by ``traceback.format_list``."""
    frames: list[UserFrame] = []
    lines = text.splitlines()
    for position, line in enumerate(lines):
        match = _FRAME_RE.match(line)
        if not match:
            continue
        following = lines[position + 1] if position + 1 < len(lines) else ""
        code = following.strip() if not _FRAME_RE.match(following) else ""
        filename, lineno = match.group("file"), int(match.group("line"))
        frames.append(UserFrame(filename, lineno, match.group("name") or "", code or _source_line(filename, lineno)))
    return frames


def innermost_user_frame(frames: tuple[UserFrame, ...] | list[UserFrame]) -> UserFrame | None:
    """The innermost frame outside torch, torchfuse and the standard library; else the innermost."""
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return frame
    return frames[-1] if frames else None


def is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path.startswith(_TORCH_DIR + os.sep) or path.startswith(_TORCHFUSE_DIR + os.sep):
        return False
    if filename.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    return not path.startswith(os.path.dirname(os.__file__) + os.sep)


def short_reason(text: str) -> str:
    """Dynamo's reason without boilerplate: "<kind of break>: <explanation>"."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Encountered graph break when attempting")]
    if not lines:
        return text.strip()[:200]
    head = lines[0]
    for line in lines[1:]:
        if line.startswith("Explanation:"):
            return f"{head}: {line.removeprefix('Explanation:').strip()}"
    return head


def parse_shape_change(reason: str | None) -> ShapeChange | None:
    """``tensor 'x' size mismatch at index 1. expected 512, actual 384`` as a ShapeChange."""
    match = _SIZE_RE.search(reason or "")
    if not match:
        return None
    return ShapeChange(clean_source_name(match.group("name")), int(match.group("dim")),
                       int(match.group("old")), int(match.group("new")), match.group("what"))


def guard_text(reason: str | None) -> str:
    """The failed guard alone: ``0/1: len(hist) == 1  # hist.append(...)`` -> ``len(hist) == 1``."""
    text = (reason or "").strip().splitlines()[0] if reason and reason.strip() else ""
    text = re.sub(r"^\S+/\d+:\s*", "", text)
    return text.split("  #", 1)[0].split(" # ", 1)[0].strip()


def guard_user_frame(reason: str | None, known_files: list[str] = ()) -> UserFrame | None:
    """Where in user code the failed guard came from, when Dynamo says so."""
    if not reason:
        return None
    frames = parse_frames(reason)
    if frames:
        return innermost_user_frame(frames)
    match = _GUARD_CODE_RE.search(reason)
    if not match:
        return None
    filename = match.group("file")
    for known in known_files:  # Dynamo shortens paths: find the full one
        if known.endswith(filename):
            filename = known
            break
    return UserFrame(filename, int(match.group("line")), match.group("name"), match.group("code").strip())


def parse_limit_warning(message: str) -> RecompileLimitHit | None:
    limit = re.search(r"hit config\.(\w+) \((\d+)\)", message)
    function = re.search(r"function: '(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)", message)
    last = re.search(r"last reason: (.*)", message)
    if not limit:
        return None
    return RecompileLimitHit(
        function.group("name") if function else "?", function.group("file") if function else "?",
        int(function.group("line")) if function else 0, limit.group(1), int(limit.group(2)),
        last.group(1).strip() if last else "")


def clean_source_name(name: str) -> str:
    """Dynamo's guard source ``L['x']`` or ``L['self']._modules['fc']`` as user-facing text."""
    name = re.sub(r"^[LG]\['([^']+)'\]", r"\1", name)
    return re.sub(r"\._modules\['([^']+)'\]|\['([^']+)'\]", lambda m: f".{m.group(1) or m.group(2)}", name)


def _source_line(filename: str, lineno: int) -> str:
    return linecache.getline(filename, lineno).strip()


# -- metrics and compile context ------------------------------------------------------------------
def _raw_metrics() -> list[Any]:
    try:
        return list(dynamo_utils.get_compilation_metrics())
    except Exception:  # noqa: BLE001 - no metrics: report without compile times
        return []


# Dynamo's timers (torch._dynamo.utils.compilation_time_metrics): all of a frame's compile, and
# the part inside the backend (AOTAutograd and the backend it calls).
DYNAMO_TIMER = "_compile.compile_inner"
BACKEND_TIMER = "OutputGraph.call_user_compiler"


def dynamo_timer_seconds(name: str) -> float:
    """Seconds Dynamo's timer ``name`` has counted in this process (0 when it has none)."""
    try:
        return float(sum(dynamo_utils.compilation_time_metrics.get(name, ())))
    except Exception:  # noqa: BLE001 - another torch's layout: report without that split
        return 0.0


def _ensure_metrics_capacity(size: int = 100_000) -> None:
    """Dynamo keeps only the last 64 compiles by default; a long script needs them all."""
    try:
        if getattr(dynamo_utils._compilation_metrics, "maxlen", size) < size:
            dynamo_utils.set_compilation_metrics_limit(size)
    except Exception:  # noqa: BLE001
        pass


def _frame_compile(metrics: Any) -> FrameCompile:
    seconds = getattr(metrics, "entire_frame_compile_time_s", None)
    if seconds is None:
        duration = getattr(metrics, "duration_us", None)
        seconds = duration / 1e6 if duration else 0.0
    is_forward = getattr(metrics, "is_forward", True)
    return FrameCompile(
        compile_id=str(getattr(metrics, "compile_id", "") or ""),
        function=getattr(metrics, "co_name", None) or "",
        filename=getattr(metrics, "co_filename", None) or "",
        firstlineno=getattr(metrics, "co_firstlineno", None) or 0,
        seconds=float(seconds or 0.0),
        recompile_reason=getattr(metrics, "recompile_reason", None),
        fail_type=getattr(metrics, "fail_type", None),
        fail_reason=getattr(metrics, "fail_reason", None),
        op_count=getattr(metrics, "graph_op_count", None),
        is_forward=is_forward is not False,
    )


def current_compile_id() -> str | None:
    """The id ("frame/attempt") of the Dynamo compile in progress, if any."""
    try:
        compile_id = torch._guards.CompileContext.current_compile_id()
    except Exception:  # noqa: BLE001
        return None
    return str(compile_id) if compile_id is not None else None


def frame_of(compile_id: str | None) -> str:
    """``"3/1"`` -> ``"3"``: compiles of the same Python frame share it."""
    return (compile_id or "").lstrip("!").split("/")[0]


def root_function(co_name: str) -> str:
    """Dynamo's resume functions belong to the function they resume:
    ``torch_dynamo_resume_in_step_at_12`` -> ``step``."""
    match = re.match(r"torch_dynamo_resume_in_(.+)_at_\d+$", co_name)
    return root_function(match.group(1)) if match else co_name


def recompile_limit() -> tuple[str, int]:
    """The name and value of Dynamo's per-function recompile limit."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return name, value
    return "recompile_limit", 8


def unsupported_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions Dynamo raises for code it cannot capture under ``fullgraph=True``."""
    return tuple(t for t in (getattr(dynamo_exc, "Unsupported", None), getattr(dynamo_exc, "UserError", None),
                             getattr(dynamo_exc, "FailOnRecompileLimitHit", None)) if isinstance(t, type))


def error_user_frames(error: BaseException) -> list[UserFrame]:
    """User frames of a Dynamo error: its ``real_stack`` if it has one, else its message."""
    stack = getattr(error, "real_stack", None)
    frames: list[UserFrame] = []
    if stack:
        for summary in stack:
            frames.append(UserFrame(summary.filename, summary.lineno or 0, summary.name, (summary.line or "").strip()))
    if not frames:
        frames = parse_frames(str(error))
    return frames


def is_compiled(obj: Any) -> bool:
    """True for what ``torch.compile`` returns (an OptimizedModule or a wrapped function)."""
    return hasattr(obj, "_orig_mod") or hasattr(obj, "_torchdynamo_orig_callable")


def original_of(obj: Any) -> Any:
    """The module or function a ``torch.compile`` result wraps (itself if not compiled)."""
    return getattr(obj, "_orig_mod", None) or getattr(obj, "_torchdynamo_orig_callable", None) or obj


def reset_dynamo() -> None:
    torch._dynamo.reset()


# -- what a backend receives ----------------------------------------------------------------------
@dataclass(frozen=True)
class OpSite:
    """One op of a captured Dynamo graph and the user line it came from."""

    op: str  # e.g. "item", "cpu", "<built-in function mul>"
    location: UserFrame | None


@dataclass(frozen=True)
class GraphCapture:
    """What Dynamo handed a backend: the compile id and the ops with their user lines."""

    compile_id: str | None
    ops: tuple[OpSite, ...]


def capture_of(gm: torch.fx.GraphModule) -> GraphCapture:
    """Read a Dynamo graph (before aot_autograd): its ops and where each came from."""
    sites = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        op = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        trace = node.meta.get("stack_trace") or ""
        sites.append(OpSite(str(op), innermost_user_frame(parse_frames(trace))))
    return GraphCapture(current_compile_id(), tuple(sites))


def observing_backend(backend: Any, on_graph: Any) -> Any:
    """Wrap a callable Dynamo backend so ``on_graph(capture_of(gm))`` runs before it compiles.

    String backends ("inductor") are returned as they are: wrapping them would change how Dynamo
    treats them."""
    if not callable(backend) or getattr(backend, "_torchfuse_observed", False):
        return backend

    def observed(gm: torch.fx.GraphModule, example_inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        try:
            on_graph(capture_of(gm))
        except Exception:  # noqa: BLE001 - observing must never break compiling
            pass
        return backend(gm, example_inputs, *args, **kwargs)

    observed._torchfuse_observed = True  # type: ignore[attr-defined]
    return observed
