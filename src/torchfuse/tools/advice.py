"""Concrete fixes for torch.compile pitfalls, chosen from the offending line and Dynamo's reason.

The source line decides first (``.item()`` on the line says more than any torch version's wording
of the reason), Dynamo's reason second. Each pitfall has one stable ``key`` that tests and tools
can rely on, a title, and a fix written for the user.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Advice:
    key: str  # stable id of the pitfall, e.g. "item", "print", "data_dependent_branch"
    title: str
    fix: str

    def __str__(self) -> str:
        return f"{self.title}. Fix: {self.fix}"


ITEM = Advice(
    "item", "`.item()` copies a tensor's value to Python, which the graph cannot hold",
    "move it out of the compiled region: return the tensor (e.g. `loss.detach()`) and call `.item()` "
    "after the compiled call, ideally only every N steps for logging; or compile only the model and the "
    "loss function separately (`model = torchfuse.compile(model)`, `loss_fn = torchfuse.compile(loss_fn)`) "
    "and keep the training step, with its logging, in plain Python")
TOLIST = Advice(
    "tolist", "`.tolist()` copies a tensor to a Python list, which the graph cannot hold",
    "move it out of the compiled region: return the tensor and call `.tolist()` on the result; or "
    "compile only the model and the loss function separately and keep this step in plain Python")
NUMPY = Advice(
    "numpy", "`.cpu().numpy()` / `.numpy()` leaves the graph (and waits for the device)",
    "move it out of the compiled region: return the tensor and convert after the compiled call; or "
    "compile only the model and the loss function separately and keep this conversion in plain Python")
SCALAR = Advice(
    "scalar", "converting a tensor to a Python number (`float(t)`, `int(t)`, `bool(t)`) leaves the graph",
    "keep it a tensor inside the compiled region (use it in tensor ops directly), and convert after "
    "the compiled call; or compile only the model and the loss function separately")
PRINT = Advice(
    "print", "`print` inside the compiled region breaks the graph",
    "print outside the compiled function (return what you want to see and print the result), or only "
    "every N steps outside; if it must stay, add `print` to "
    "`torch._dynamo.config.reorderable_logging_functions` so it runs after the graph")
LOGGING = Advice(
    "logging", "logging inside the compiled region breaks the graph",
    "log outside the compiled function: return the values and log them after the call; or add the "
    "logging function to `torch._dynamo.config.reorderable_logging_functions`")
BRANCH = Advice(
    "data_dependent_branch", "a Python `if`/`while` on a tensor's value cannot be captured",
    "compute both sides and select with `torch.where(cond, a, b)` (or `torch.clamp` / "
    "`torch.nan_to_num` for clean-up branches); or decide before the compiled region and pass the "
    "decision in as a Python bool; `torch.cond(pred, true_fn, false_fn)` keeps real control flow")
SHAPE_BRANCH = Advice(
    "shape_branch", "a Python `if` on a tensor's shape adds a guard: every new side of it recompiles",
    "make the code shape-agnostic: pad to a fixed size with `torch.nn.functional.pad` (or to a few "
    "bucket sizes) so one path serves all, use `torch.where` instead of the branch, or decide before "
    "the compiled region and call one of two compiled functions")
LIST_MUTATION = Advice(
    "list_mutation", "mutating a Python list inside the compiled region (append/extend/pop, item assignment)",
    "return the values from the compiled function and append them outside; for a history, keep a "
    "preallocated tensor and write into it (`buf[i] = v` with a tensor index), or `torch.stack` at the end")
NUMPY_CALL = Advice(
    "numpy_call", "a call into NumPy inside the compiled region",
    "use the torch equivalent (`torch.sort`, `torch.cumsum`, `torch.linalg...`) so the graph keeps it; "
    "or do the NumPy work before or after the compiled call")
UNSUPPORTED_CALL = Advice(
    "unsupported_call", "a call Dynamo cannot trace (an unsupported builtin or library function)",
    "replace it with torch ops, or move it before or after the compiled function; if it must run "
    "eagerly, wrap it with `torch.compiler.disable` so the break is explicit; C/C++ extensions can be "
    "registered with `torch.library.custom_op` to stay in the graph")
BACKWARD = Advice(
    "backward", "`.backward()` inside the compiled function cannot be captured (the forward graph ends there)",
    "compile the model (or the forward and loss) and call `loss.backward()` and `optimizer.step()` outside "
    "the compiled function: torchfuse compiles the backward graph by itself")
AFTER_BREAK = Advice(
    "after_graph_break", "Dynamo recompiled the code after a graph break (its cached state was freed)",
    "fix the graph break above: without it there is no resumed code to recompile")
OTHER = Advice(
    "other", "Dynamo could not capture this code, so it runs eagerly",
    "move this code out of the compiled function, or rewrite it with torch ops; `torchfuse.explain(fn, *args)` "
    "shows each break")

_LIST_MUTATION_RE = re.compile(r"\.(append|extend|insert|pop|remove|clear)\(|^\s*\w+\[[^\]]*\]\s*=[^=]")
_LOGGING_RE = re.compile(r"\b(logging|logger|log|warnings)\.(debug|info|warning|warn|error|exception|critical|log)\(")
_BRANCH_RE = re.compile(r"^\s*(if|elif|while|assert)\b|\bif\b.+\belse\b")
_SHAPE_RE = re.compile(r"\.(shape|size\(|dim\(|numel\()|\blen\(")


def advise_break(reason: str, code: str) -> Advice:
    """The pitfall behind a graph break and its fix.

    Args:
        reason: Dynamo's reason (any torch version's wording).
        code: the offending source line ("" if unknown).
    Returns:
        The matching ``Advice`` (``OTHER`` when nothing matches).
    """
    line = code.strip()
    if ".tolist()" in line:
        return TOLIST
    if ".numpy()" in line:
        return NUMPY
    if ".item()" in line:
        return ITEM
    if re.search(r"\bprint\(", line) or "builtin operator `print`" in reason:
        return PRINT
    if _LOGGING_RE.search(line) or "Logger" in reason:
        return LOGGING
    if _BRANCH_RE.search(line) or "data-dependent branching" in reason.lower() or "generic_jump" in reason:
        return SHAPE_BRANCH if _SHAPE_RE.search(line) and "data-dependent" not in reason.lower() else BRANCH
    if _LIST_MUTATION_RE.search(line):
        return LIST_MUTATION
    if ".backward(" in line or "Tensor.backward" in reason:
        return BACKWARD
    if re.search(r"\b(np|numpy)\.", line) or "numpy" in reason.lower():
        return NUMPY_CALL
    if re.search(r"\b(float|int|bool)\(", line) or "_local_scalar_dense" in reason or "Tensor.item" in reason:
        return ITEM if "Tensor.item" in reason else SCALAR
    if "builtin" in reason.lower() or "skip" in reason.lower() or "unsupported" in reason.lower():
        return UNSUPPORTED_CALL
    return OTHER


def recompile_advice(guard: str, code: str, dynamic: bool) -> Advice:
    """Advice for a recompile, from the failed guard and the user line it came from."""
    if "size mismatch" in guard or "stride mismatch" in guard:
        return variable_shapes_advice(dynamic)
    if "Cache line invalidated" in guard or "___stack" in guard:
        return AFTER_BREAK
    if _LIST_MUTATION_RE.search(code):
        return LIST_MUTATION
    if _BRANCH_RE.search(code) and (".size()" in guard or ".shape" in guard or "size()" in guard):
        return SHAPE_BRANCH
    if ".size()" in guard or ".shape" in guard:
        return variable_shapes_advice(dynamic)
    return Advice(
        "changed_value", "a value the graph was specialized on changed (a Python number, an object, a flag)",
        "keep it constant across calls, pass it as a tensor instead of a Python number, or make it an "
        "argument of a function compiled once per value on purpose")


def variable_shapes_advice(dynamic: bool) -> Advice:
    return Advice(
        "variable_shapes", "a new input shape on a later call recompiles the graph",
        "pad inputs to a few fixed lengths (e.g. multiples of 64, with `torch.nn.functional.pad`) so a "
        "handful of graphs serve every batch; or mark the varying dimension dynamic before the first call "
        "(`torch._dynamo.mark_dynamic(x, dim)`) or compile with `dynamic=True` so one shape-generic graph "
        "serves all; for inference on a few known shapes, `dynamic=False` plus "
        "`torchfuse.warmup(compiled, [inputs...])` compiles each ahead"
        + ("" if not dynamic else "; with dynamic shapes already on, look for guards on specific sizes"))


def recompile_limit_advice(limit_name: str, limit: int) -> Advice:
    return Advice(
        "recompile_limit", f"the function recompiled {limit} times and hit `torch._dynamo.config.{limit_name}`: "
        "it now runs in EAGER mode, without any compiled code",
        "remove the cause of the recompiles shown above (usually a new shape every step: pad to a few "
        "fixed lengths, `torch._dynamo.mark_dynamic`, or `dynamic=True`); raising "
        f"`torch._dynamo.config.{limit_name}` only delays the fall-back")


def advise_graph_op(op: str) -> Advice | None:
    """Ops inside a captured graph that make the device wait for the host."""
    name = op.rsplit(".", 1)[-1] if op.startswith("aten.") else op
    if "_local_scalar_dense" in op or name == "item":
        return Advice(
            "item_in_graph", "`.item()` was captured in the graph (`aten._local_scalar_dense`): the device "
            "waits for the host there, and code that branches on the value makes `fullgraph=True` raise "
            "`torch._dynamo.exc.Unsupported`", ITEM.fix)
    if name in ("tolist",):
        return Advice("tolist_in_graph", "`.tolist()` was captured in the graph: the device waits for the host",
                      TOLIST.fix)
    if name in ("cpu", "numpy"):
        return Advice(
            "host_copy_in_graph", "a `.cpu()` / `.numpy()` copy to the host was captured in the graph: the "
            "device waits for it on every call, and NumPy code around it runs through torch's NumPy emulation",
            NUMPY.fix)
    return None
