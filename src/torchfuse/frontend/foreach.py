"""Decompositions of the ``_foreach_*`` ops into one ordinary ATen op per tensor.

Optimizers (AdamW, SGD with momentum, ...) run their step with ``_foreach_*`` ops by default on
a GPU. Left whole they are ATen calls, one per op over every parameter: an AdamW step becomes
some twenty passes over all the optimizer state. Split per tensor, the ordinary ops lower like
any other pointwise op and the scheduler fuses each parameter's update into a few kernels.

``_foreach_X.Overload(lists..., scalars...)`` becomes ``[aten.X(list_0[i], ..., scalars...)
for i]``: list arguments (tensors or scalars) are taken element by element, everything else is
passed to every call. Ops whose element-wise meaning differs from that rule are listed apart.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

aten = torch.ops.aten

# Foreach ops whose per-tensor op is not ``aten.<name>`` with the same arguments.
_SPECIAL: dict[str, Callable[..., torch.Tensor]] = {
    "norm": lambda t, ord=2, dtype=None: aten.linalg_vector_norm(t, ord, dtype=dtype),
    "max": lambda t: aten.amax(t, list(range(t.dim()))),
    "zero": lambda t: aten.zeros_like(t),
    # ``value`` is positional in the foreach schema, keyword-only in the per-tensor one.
    "addcmul": lambda s, t1, t2, value=1: aten.addcmul(s, t1, t2, value=value),
    "addcdiv": lambda s, t1, t2, value=1: aten.addcdiv(s, t1, t2, value=value),
    # maximum/minimum take no scalar; a clamp does the same (and propagates NaN the same way).
    "maximum": lambda t, o: aten.maximum(t, o) if isinstance(o, torch.Tensor) else aten.clamp_min(t, o),
    "minimum": lambda t, o: aten.minimum(t, o) if isinstance(o, torch.Tensor) else aten.clamp_max(t, o),
}
# Left whole: a per-tensor tensor of scalars (addcmul/addcdiv .Tensor: scalars[i] is a 0-dim
# slice, fine but rare), matrix products (stay ATen anyway), copies with broadcasting rules.
_SKIP = {"mm", "powsum", "copy"}
_SKIP_OVERLOADS = {("addcmul", "Tensor"), ("addcdiv", "Tensor")}


def _per_tensor(op: Callable[..., torch.Tensor]) -> Callable[..., list[torch.Tensor]]:
    def decomposition(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        lengths = {len(a) for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple))}
        if len(lengths) != 1:
            raise ValueError(f"foreach op with lists of different lengths {sorted(lengths)}")
        (count,) = lengths

        def pick(value: Any, i: int) -> Any:
            return value[i] if isinstance(value, (list, tuple)) else value

        return [op(*(pick(a, i) for a in args), **{k: pick(v, i) for k, v in kwargs.items()})
                for i in range(count)]

    return decomposition


def foreach_decompositions() -> dict[Any, Callable[..., Any]]:
    """OpOverload -> decomposition for every functional ``_foreach_*`` op torch registers."""
    table: dict[Any, Callable[..., Any]] = {}
    for schema in torch._C._jit_get_all_schemas():
        name, overload = schema.name.removeprefix("aten::"), schema.overload_name
        if not name.startswith("_foreach_") or name.endswith("_") or overload.endswith("out"):
            continue
        base = name.removeprefix("_foreach_")
        if base in _SKIP or (base, overload) in _SKIP_OVERLOADS:
            continue
        op = _SPECIAL.get(base) or getattr(aten, base, None)
        if op is None:
            continue
        table[getattr(getattr(aten, name), overload or "default")] = _per_tensor(op)
    return table
