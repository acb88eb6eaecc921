"""Launch a compiled Triton binary through torch's C++ launcher, ``torch._C._StaticCudaLauncher``.

A direct launch (``launch.Launcher``) used to call the ``CompiledKernel``'s own launcher: Triton's
Python ``CudaLauncher.__call__`` (two scratch allocations, hooks, its arguments rebuilt), then
its C launcher, which parses every parameter, the constexprs included, and asks the driver
about every pointer. torch's CUDA builds (2.8 and later) ship a C++ launcher for Triton cubins,
the one Inductor uses: ``_launch_kernel(function, grid_x, grid_y, grid_z, num_warps, shared,
arg_types, args, stream)`` takes only the binary's real parameters, one type character each.

What this module adds to Triton's binary, once per binary (``static_launch``):

- which of the launch's arguments (the kernel's tensors and scalars, then the launcher's fixed
  tail: sizes and block sizes) the binary takes: Triton's signature minus its constexprs (block
  sizes, and ints equal to 1 and ``None``, which Triton specializes away), then one null pointer
  per scratch buffer the kernel declares (Triton 3.3+: global, then profile scratch);
- their type characters (pointers are passed as ``data_ptr()`` ints, ints as i32 or i64 as
  Triton compiled them);
- a launch function written out for them (like ``launch.spec_function``), with the grid, the
  warps, the shared memory and the kept tail fixed.

The binary is the one Triton loaded (``compiled.function``, after ``compiled.run`` loaded it):
Triton's loader has checked shared memory and threads against the device and raised the
dynamic shared memory limit for kernels above 48 KB, and there is one copy of the module. So
``_load_kernel`` (whose arguments changed between torch releases) is never called.

Anything this launcher does not do the way Triton's does is refused, and that binary keeps
Triton's launcher (``Refused``, counted with its reason in ``launch.stats``): a torch without the
binding or with another ``_launch_kernel`` signature (probed once, without launching anything),
ROCm, ``TORCHFUSE_STATIC_LAUNCH=0``, scratch memory the kernel needs allocated, clusters
(``num_ctas`` > 1), cooperative or programmatic dependent launches, Triton's instrumentation
(e.g. GSan adds parameters), tensor descriptors, tuples, fp16/bf16 scalars (Inductor's table
passes them as fp32 where Triton packs 16 bits), and any signature that does not line up with
the launch's arguments.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

ENV_VARIABLE = "TORCHFUSE_STATIC_LAUNCH"

# Triton's scalar types -> the binding's type characters (torch/csrc/inductor/static_cuda_launcher.cpp:
# each value goes into an 8-byte slot as that C type). Pointers ("*fp32", ...) are "O".
TYPE_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
              "u32": "I", "u64": "K", "fp32": "f", "fp64": "d"}
# Scratch buffers a kernel may declare, as (metadata size field, its name in a refusal): Triton
# appends one pointer parameter per field its metadata has, in this order.
SCRATCH_FIELDS = (("global_scratch_size", "global"), ("profile_scratch_size", "profile"))
# Above this Triton's launcher adds a launch attribute (oversized shared memory) this one lacks.
MAX_PLAIN_SHARED = 228 * 1024


class Refused(Exception):
    """This binary (or this process) does not qualify; the message says why, for the report."""


def enabled() -> bool:
    """False when ``TORCHFUSE_STATIC_LAUNCH=0`` asks for Triton's launcher everywhere."""
    return os.environ.get(ENV_VARIABLE, "1") != "0"


# -- the binding ---------------------------------------------------------------------------------
_binding: tuple[Callable[..., Any] | None, str] | None = None


def binding() -> Callable[..., Any]:
    """``torch._C._StaticCudaLauncher._launch_kernel``, its signature probed once; raises
    ``Refused`` when it is absent or not the one this module was written for."""
    global _binding
    if _binding is None:
        _binding = _probe(getattr(torch._C, "_StaticCudaLauncher", None))
    launch_kernel, why_not = _binding
    if launch_kernel is None:
        raise Refused(why_not)
    return launch_kernel


def reset_binding() -> None:
    """Forget the probe (tests that swap the binding)."""
    global _binding
    _binding = None


def _probe(launcher: Any) -> tuple[Callable[..., Any] | None, str]:
    """Check ``_launch_kernel`` parses ``(K i i i i i s O K)`` (function, grid x/y/z, warps, shared
    bytes, type string, argument tuple, stream; torch 2.8 to 2.13; early builds read the stream
    as ``l``, the same for a raw stream), with two calls that launch nothing: ten arguments,
    which it must refuse by count (it takes exactly nine), then nine of those types over an
    empty grid, which it must parse and return from before touching the driver (the sources
    read, mid-2025 to 2026, return early on an empty grid; a binding that did not would fail on
    the null function, and be refused)."""
    if launcher is None:
        return None, "this torch has no torch._C._StaticCudaLauncher (a CPU build, or older than 2.8)"
    if getattr(torch.version, "hip", None):
        return None, "ROCm: torch's launcher there is not Triton's for AMD binaries"
    if _torch_version() < (2, 8):
        return None, f"torch {torch.__version__}: its launcher predates the empty-grid return the probe needs"
    launch_kernel = getattr(launcher, "_launch_kernel", None)
    if not callable(launch_kernel):
        return None, "torch._C._StaticCudaLauncher has no _launch_kernel"
    try:
        launch_kernel(*(0,) * 10)
    except TypeError as error:
        if "exactly 9 arguments" not in str(error):
            return None, f"unexpected _launch_kernel signature ({error})"
    except Exception as error:  # noqa: BLE001 - anything else is a binding we do not know
        return None, f"unexpected _launch_kernel signature ({type(error).__name__}: {error})"
    else:
        return None, "unexpected _launch_kernel signature (it accepted 10 arguments)"
    try:
        returned = launch_kernel(0, 0, 1, 1, 1, 0, "", (), 0)  # grid 0 x 1 x 1: nothing to launch
    except Exception as error:  # noqa: BLE001
        return None, f"unexpected _launch_kernel signature ({type(error).__name__}: {error})"
    if returned is not None:
        return None, f"unexpected _launch_kernel result ({returned!r})"
    return launch_kernel, ""


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# -- which parameters the binary takes -----------------------------------------------------------
@dataclass(frozen=True)
class BinaryParams:
    """The binary's parameters, in order, as positions in the launch's ``(*args, *tail)``."""

    positions: tuple[int, ...]
    types: str  # one type character per position, then "O" per scratch pointer
    pointers: frozenset[int]  # the positions passed as pointers
    scratch: int  # null pointers appended (scratch buffers the kernel declares, none needed)


def binary_params(compiled: Any, n_args: int, tail: tuple[int, ...]) -> BinaryParams:
    """What the binary takes, from Triton's signature and constants (``compiled.src``) and its
    metadata; raises ``Refused`` for anything unexpected."""
    metadata = compiled.metadata
    _check_launch_features(metadata)
    src = compiled.src
    names = list(src.fn.arg_names)
    signature = src.signature
    if len(names) != n_args + len(tail) or len(signature) != len(names) or set(signature) != set(names):
        raise Refused(f"the binary's signature ({len(signature)} parameters) does not match the launch "
                      f"({n_args} arguments and {len(tail)} fixed)")
    constexpr = {key[0] for key in getattr(src, "constants", {}) if _flat_key(key)}
    positions, types, pointers = [], [], set()
    for position, name in enumerate(names):
        kind = signature[name]
        if not isinstance(kind, str):
            raise Refused(f"parameter {name} is a tuple ({kind!r})")
        if (kind == "constexpr") != (position in constexpr):
            raise Refused(f"parameter {name}: signature {kind!r} and constants disagree")
        if kind == "constexpr":
            _check_constant(src, name, position, n_args, tail)
            continue
        positions.append(position)
        types.append(_type_code(name, kind))
        if kind.startswith("*"):
            pointers.add(position)
        elif position >= n_args:
            _check_fixed(name, kind, tail[position - n_args])
    scratch = sum(1 for field, _ in SCRATCH_FIELDS if hasattr(metadata, field))
    return BinaryParams(tuple(positions), "".join(types) + "O" * scratch, frozenset(pointers), scratch)


def _check_launch_features(metadata: Any) -> None:
    """Refuse what Triton's launcher does beyond a plain ``cuLaunchKernel``."""
    for field, name in SCRATCH_FIELDS:
        if getattr(metadata, field, 0):
            raise Refused(f"needs {getattr(metadata, field)} bytes of {name} scratch per program")
    if getattr(metadata, "num_ctas", 1) != 1:
        raise Refused(f"a cluster launch (num_ctas={metadata.num_ctas})")
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(metadata, flag, False):
            raise Refused(f"{flag} is set")
    if getattr(metadata, "instrumentation_mode", ""):
        raise Refused(f"Triton instrumentation {metadata.instrumentation_mode!r} (adds parameters)")
    if getattr(metadata, "tensordesc_meta", None):
        raise Refused("tensor descriptors")
    if metadata.shared > MAX_PLAIN_SHARED:
        raise Refused(f"{metadata.shared} bytes of shared memory (Triton launches it with another attribute)")
    if getattr(metadata, "warp_size", 32) != 32:
        raise Refused(f"warps of {metadata.warp_size} threads (the launcher assumes 32)")


def _flat_key(key: Any) -> bool:
    if isinstance(key, tuple) and len(key) == 1 and isinstance(key[0], int):
        return True
    raise Refused(f"a constant inside a tuple argument ({key!r})")


def _type_code(name: str, kind: str) -> str:
    if kind.startswith("*"):
        return "O"
    if kind not in TYPE_CODES:
        raise Refused(f"parameter {name} of type {kind}")
    return TYPE_CODES[kind]


def _check_constant(src: Any, name: str, position: int, n_args: int, tail: tuple[int, ...]) -> None:
    """A constexpr of the tail (a size of 1, a block size) must hold the value the launch fixes:
    otherwise the tail is not laid out the way the binary was compiled."""
    if position >= n_args:
        value = src.constants[(position,)]
        if value != tail[position - n_args]:
            raise Refused(f"constant {name}={value!r} but the launch fixes {tail[position - n_args]!r}")


def _check_fixed(name: str, kind: str, value: Any) -> None:
    bounds = {"i32": (-2**31, 2**31), "i64": (-2**63, 2**63)}.get(kind)
    if bounds is None or type(value) is not int or not bounds[0] <= value < bounds[1]:
        raise Refused(f"fixed parameter {name}={value!r} of type {kind}")


# -- the parameters, as the binary itself declares them -------------------------------------------
# A type character -> how PTX declares a parameter of that type ("ptr": a pointer, else its width).
PTX_KINDS = {"O": "ptr", "i": "b32", "I": "b32", "l": "b64", "K": "b64", "f": "f32", "d": "f64",
             "b": "b8", "B": "b8", "h": "b16", "H": "b16"}


def ptx_params(ptx: str) -> list[str]:
    """The kernel's parameters as its PTX ``.entry`` declares them: "ptr", or the width ("b32",
    "b64", "f32", ...)."""
    entry = re.search(r"\.entry\s+[\w$]+\s*\((.*?)\)", ptx, re.S)
    if entry is None:
        raise Refused("no .entry in the binary's PTX")
    params = []
    for declaration in filter(None, (part.strip() for part in entry.group(1).split(","))):
        kind = re.match(r"\.param\s+\.(\w+)", declaration)
        if kind is None:
            raise Refused(f"a PTX parameter not understood ({declaration!r})")
        widths = {"u8": "b8", "s8": "b8", "u16": "b16", "s16": "b16", "u32": "b32", "s32": "b32",
                  "u64": "b64", "s64": "b64"}
        params.append("ptr" if ".ptr" in declaration else widths.get(kind.group(1), kind.group(1)))
    return params


def check_against_ptx(compiled: Any, types: str) -> None:
    """The parameters worked out from Triton's signature (``binary_params``) must be the ones the
    binary declares, in number, order and width: the check that holds across Triton releases
    (which add parameters: scratch pointers in 3.3 and 3.5). Raises ``Refused`` otherwise, or
    when the binary came without its PTX."""
    ptx = getattr(compiled, "asm", {}).get("ptx")
    if not ptx:
        raise Refused("no PTX to check the parameters against")
    declared = ptx_params(ptx if isinstance(ptx, str) else ptx.decode())
    ours = [PTX_KINDS.get(code, "?") for code in types]
    if ours != declared:
        raise Refused(f"the binary declares parameters {declared}, the launch would pass {ours}")


# -- the launch function -------------------------------------------------------------------------
def static_launch(compiled: Any, grid: int, tail: tuple[int, ...], n_args: int,
                  trusted: frozenset[int] = frozenset()) -> Callable[..., None]:
    """``launch(stream, *args)`` running ``compiled`` (loaded: ``compiled.run`` was read) through
    torch's launcher over ``grid`` programs; ``tail`` is what follows ``args`` in the kernel's
    parameters (sizes, block sizes); the tensors at ``trusted`` positions are known to be on a
    CUDA device (the others are checked at each launch). Raises ``Refused`` when it does not
    qualify."""
    launch_kernel = binding()
    params = binary_params(compiled, n_args, tail)
    check_against_ptx(compiled, params.types)
    function = compiled.function
    if not isinstance(function, int) or function == 0:
        raise Refused(f"no loaded CUfunction ({function!r})")
    return _write_launch(launch_kernel, compiled, params, grid, tail, n_args, trusted)


def _write_launch(launch_kernel: Callable[..., Any], compiled: Any, params: BinaryParams, grid: int,
                  tail: tuple[int, ...], n_args: int, trusted: frozenset[int] = frozenset()) -> Callable[..., None]:
    """The launch as straight-line code: each argument the binary takes, a pointer as its
    ``data_ptr()``, then the fixed tail and the scratch pointers as one precomputed tuple."""
    fixed = tuple(tail[p - n_args] for p in params.positions if p >= n_args) + (None,) * params.scratch
    parts = [(f"a{p}.data_ptr()" if p in trusted else f"(a{p}.data_ptr() if a{p}.is_cuda else off_gpu({p}, a{p}))")
             if p in params.pointers else f"a{p}" for p in params.positions if p < n_args]
    names = "".join(f", a{i}" for i in range(n_args))
    values = "".join(f"{part}, " for part in parts) + "*fixed"
    source = (f"def launch(stream{names}):\n"
              f"    launch_kernel(function, {int(grid)}, 1, 1, num_warps, shared, types, ({values}), stream)\n")
    namespace: dict[str, Any] = {
        "launch_kernel": launch_kernel, "function": compiled.function, "num_warps": int(compiled.metadata.num_warps),
        "shared": int(compiled.metadata.shared), "types": params.types, "fixed": fixed,
        "off_gpu": _off_gpu(compiled.metadata.name),
        # The CompiledKernel owns the module the function lives in (Triton unloads it when the
        # object goes): the launch keeps it alive.
        "compiled": compiled,
    }
    exec(compile(source, f"<torchfuse static launch {compiled.metadata.name}>", "exec"), namespace)
    return namespace["launch"]


def _off_gpu(kernel: str) -> Callable[[int, Any], int]:
    def off_gpu(position: int, tensor: Any) -> int:
        raise ValueError(f"GPU kernel {kernel}: argument {position} is a tensor on {tensor.device}, not on a "
                         "CUDA device; a GPU kernel reads CUDA tensors only")
    return off_gpu
