"""Readable text for bodies, nodes and graphs: what users and developers debug with."""
from __future__ import annotations

import sympy

from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, Where
from torchfuse.ir.graph import Extern, ExternArg, Graph, Pointwise, Reduction, ScatterAdd

_DTYPE_SHORT = {
    "torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float64": "f64",
    "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
    "torch.uint8": "u8", "torch.bool": "b1",
}


def dtype_name(dtype) -> str:
    return _DTYPE_SHORT.get(str(dtype), str(dtype).replace("torch.", ""))


def format_expr(expr: Expr) -> str:
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, IndexValue):
        return f"index({expr.index})"
    if isinstance(expr, Load):
        index = ", ".join(format_expr(e) if isinstance(e, Expr) else str(e) for e in expr.index)
        return f"{expr.buffer}[{index}]"
    if isinstance(expr, Op):
        return f"{expr.name}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, Where):
        return f"where({format_expr(expr.cond)}, {format_expr(expr.if_true)}, {format_expr(expr.if_false)})"
    if isinstance(expr, Cast):
        return f"{dtype_name(expr.dtype)}({format_expr(expr.value)})"
    return repr(expr)


def _shape(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def format_node(node) -> str:
    if isinstance(node, Pointwise):
        return f"{node.name}: {dtype_name(node.dtype)}{_shape(node.shape)} = {format_expr(node.body)}  # {node.origin}"
    if isinstance(node, Reduction):
        return (f"{node.name}: {dtype_name(node.dtype)}{_shape(node.shape)} = {node.reduce_op} over "
                f"r{_shape(node.reduction_ranges)} of {format_expr(node.body)}  # {node.origin}")
    if isinstance(node, ScatterAdd):
        index = ", ".join(format_expr(e) if isinstance(e, Expr) else str(e) for e in node.index)
        where = f" where {format_expr(node.mask)}" if node.mask is not None else ""
        return (f"{node.name}: {dtype_name(node.dtype)}{_shape(node.shape)} = {node.base}, then [{index}] += "
                f"{format_expr(node.body)} over {_shape(node.source_shape)}{where}  # {node.origin}")
    if isinstance(node, Extern):
        outs = ", ".join(f"{b.name}: {dtype_name(b.dtype)}{_shape(b.shape)}" for b in node.outputs)
        return f"{outs} = extern {node.target}({_format_args(node.args)})"
    return repr(node)


def _format_args(args) -> str:
    parts = []
    for arg in args:
        if isinstance(arg, ExternArg):
            parts.append(arg.buffer)
        elif isinstance(arg, (list, tuple)):
            parts.append("[" + _format_args(arg) + "]")
        else:
            parts.append(str(arg))
    return ", ".join(parts)


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}("]
    lines += [f"    {b.name}: {dtype_name(b.dtype)}{_shape(b.shape)}," for b in graph.inputs]
    lines.append("):")
    lines += ["    " + format_node(node) for node in graph.nodes]
    outs = ", ".join(o.buffer if o.buffer else repr(o.constant) for o in graph.outputs)
    lines.append(f"    return ({outs})")
    return "\n".join(lines)
