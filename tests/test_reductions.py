"""Reductions through the Triton backend: every reduction op, dims, dtypes and both paths.

Rows up to 4096 elements run *persistent* (a whole row in registers), longer rows *looped*;
both are covered, as are reductions fused with their epilogue into one kernel.
"""
from __future__ import annotations

import pytest
import torch

import torchfuse
from conftest import DEVICE, compile_strict, generated_kernel_count
from opcheck import (FLOAT_DTYPES, INF, NAN, check_outputs, dtype_id, fallbacks, floats, ints)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

FLOAT_IDS = [dtype_id(d) for d in FLOAT_DTYPES]


def run_named(build, *args, dynamic=None, compiled=None):
    names = list(build(*args))
    fn = lambda *a: tuple(build(*a).values())  # noqa: E731
    compiled = compiled or compile_strict(fn, dynamic=dynamic)
    check_outputs(fn, *args, names=names, compiled=compiled, scale_tol=True)
    assert not fallbacks(), f"ops ran without a lowering: {fallbacks()}"
    return compiled


def float_reductions(x, dim, keepdim):
    """Every float reduction over ``dim`` (an int, a tuple or None)."""
    kw = {"keepdim": keepdim}
    dims = dim if dim is not None else tuple(range(x.dim()))
    out = {
        "sum": x.sum(dims, **kw), "mean": x.mean(dims, **kw), "amax": x.amax(dims, **kw), "amin": x.amin(dims, **kw),
        "var0": x.var(dims, correction=0, **kw), "var1": x.var(dims, correction=1, **kw),
        "var_unbiased": torch.var(x, dims, unbiased=True, **kw), "std": x.std(dims, **kw),
        "std0": torch.std(x, dims, correction=0, **kw), "var_mean": torch.var_mean(x, dims, **kw),
        "std_mean": torch.std_mean(x, dims, correction=0, **kw), "any": x.any(dims, **kw) if isinstance(dim, int) else x.any(),
        "sum_sq": (x * x).sum(dims, **kw), "logsumexp": torch.logsumexp(x, dims, **kw),
        "prod": (x * 0.1 + 1).prod(dims[0] if isinstance(dims, tuple) else dims, keepdim=keepdim),
        "norm": torch.linalg.vector_norm(x, dim=dims, **kw), "norm1": torch.linalg.vector_norm(x, 1, dims, **kw),
        "norm_inf": torch.linalg.vector_norm(x, float("inf"), dims, **kw), "norm3": torch.linalg.vector_norm(x, 3, dims, **kw),
        "norm0": torch.linalg.vector_norm(x.round(), 0, dims, **kw),
    }
    if isinstance(dim, int):
        out.update({
            "max_dim": x.max(dim, **kw), "min_dim": x.min(dim, **kw), "argmax": x.argmax(dim, **kw),
            "argmin": x.argmin(dim, **kw), "all": (x > -3).all(dim, **kw),
        })
    return out


# (dim, keepdim) cases over a (5, 6, 7) input: last, non-last, middle, several, all.
DIM_CASES = [(-1, False), (0, True), (1, False), ((0, 2), False), ((1, 2), True), (None, False)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("dim, keepdim", DIM_CASES, ids=str)
def test_float_reductions(dim, keepdim, dtype):
    x = floats((5, 6, 7), dtype, -3, 3, specials=[])
    run_named(lambda x: float_reductions(x, dim, keepdim), x)


def test_reductions_to_a_scalar():
    x = floats((4, 9), torch.float32, specials=[])
    run_named(lambda x: {"sum": x.sum(), "mean": x.mean(), "max": x.max(), "min": x.min(), "var": x.var(),
                         "std": x.std(), "argmax": x.argmax(), "argmin": x.argmin(), "prod": (x * 0.1 + 1).prod(),
                         "any": (x > 1).any(), "all": (x > -5).all(), "argmax_keep": x.argmax(keepdim=True),
                         "sum_plus": x.sum() + x}, x)


def test_one_dimensional_and_single_element():
    v = floats((11,), torch.float32, specials=[])
    s = floats((1, 1), torch.float32, specials=[], seed=1)
    z = torch.tensor(2.5, device=DEVICE)
    run_named(lambda v, s, z: {"v_sum": v.sum(0), "v_max": v.max(0), "v_argmin": v.argmin(), "s_sum": s.sum(1),
                               "s_var1": s.var(1), "s_var0": s.var(0, correction=0), "s_max": s.max(1),
                               "s_argmax_all": s.argmax(), "s_sum_dims": s.sum((0, 1)), "s_var_keep": s.var(1, keepdim=True),
                               "z_sum": z.sum(), "z_max": z.amax(), "z_argmax": z.argmax(), "z_mean": z.mean(0)},
              v, s, z)


# -- NaN, inf and ties -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_nan_inf_and_ties(dtype):
    x = torch.tensor([
        [1.0, 3.0, 3.0, -2.0, 3.0],      # ties: first index wins
        [NAN, 1.0, NAN, 5.0, -1.0],      # NaN wins max and min, first NaN's index
        [INF, 2.0, INF, -INF, -INF],     # infinities, tied
        [-1.0, -1.0, -1.0, -1.0, -1.0],  # all equal
        [0.0, -0.0, 0.0, -0.0, 0.0],     # signed zeros compare equal
        [1.0, 2.0, 3.0, 4.0, NAN],       # NaN last
    ], dtype=dtype, device=DEVICE)

    def build(x):
        return {"amax": x.amax(1), "amin": x.amin(1), "max_dim": x.max(1), "min_dim": x.min(1),
                "argmax": x.argmax(1), "argmin": x.argmin(1), "argmax_col": x.argmax(0), "argmin_col": x.argmin(0),
                "sum": x.sum(1), "mean": x.mean(1), "any": x.any(1), "all": x.all(1), "max_all": x.max(),
                "argmax_all": x.argmax(), "argmin_all_keep": x.argmin(keepdim=True), "var": x.var(1), "prod": x.prod(1)}

    run_named(build, x)


def test_ties_in_int_argmax_and_max_dim():
    x = torch.tensor([[3, 1, 3, 3], [0, 0, 0, 0], [-5, 7, 7, -5], [2, -9, -9, 2]], dtype=torch.int64, device=DEVICE)
    run_named(lambda x: {"argmax": x.argmax(1), "argmin": x.argmin(1), "max_dim": x.max(1), "min_dim": x.min(0),
                         "argmax_all": x.argmax(), "argmin_keep": x.argmin(0, keepdim=True)}, x)


# -- integer and bool inputs --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64], ids=dtype_id)
def test_integer_and_bool_reductions(dtype):
    x = ints((5, 6, 7), dtype, low=-9, high=10)

    def build(x):
        out = {"sum": x.sum(-1), "sum_dims": x.sum((0, 2)), "sum_all": x.sum(), "prod": x.prod(1),
               "amax": x.amax(0), "amin": x.amin((1, 2)), "any": x.any(1), "all": x.all(-1),
               "sum_float": x.sum(1, dtype=torch.float32), "mean_double": x.mean(-1, dtype=torch.float64),
               "sum_int32": x.sum(2, dtype=torch.int32), "count_nonzero": torch.count_nonzero(x, 1)}
        if dtype != torch.bool:  # eager has no max/argmax for bool
            out.update({"max_dim": x.max(1), "min_dim": x.min(-1, keepdim=True), "argmax": x.argmax(0),
                        "argmin": x.argmin(-1), "argmax_all": x.argmax()})
        return out

    run_named(build, x)


def test_sum_of_bool_is_int64_and_large_int_sums():
    b = ints((3, 300), torch.bool)
    big = torch.full((2, 5), 2**40, dtype=torch.int64, device=DEVICE)
    i32 = torch.full((2, 70000), 2**20, dtype=torch.int32, device=DEVICE)  # sum overflows int32 but not int64
    run_named(lambda b, big, i32: {"bool_sum": b.sum(1), "bool_sum_all": b.sum(), "big": big.sum(1),
                                   "i32_sum": i32.sum(1), "bool_mean": b.float().mean(1)}, b, big, i32)


# -- half precision accumulates in float32 --------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_half_sum_accumulates_in_float32(dtype):
    # 3000 ones: a half accumulator would stop growing at 2048 (f16) or 256 (bf16).
    x = torch.ones(2, 3000, dtype=dtype, device=DEVICE)
    y = floats((4, 3000), dtype, 0, 1, specials=[])
    run_named(lambda x, y: {"ones_sum": x.sum(1), "ones_mean": x.mean(1), "sum": y.sum(1), "mean": y.mean(-1),
                            "var": y.var(1), "sum_to_f32": y.sum(1, dtype=torch.float32)}, x, y)


# -- empty dims ------------------------------------------------------------------------------------
def test_zero_size_reductions():
    x = torch.empty(4, 0, device=DEVICE)
    e = torch.empty(0, 5, device=DEVICE)
    i = torch.empty(3, 0, dtype=torch.int64, device=DEVICE)

    def build(x, e, i):
        return {"sum_empty": x.sum(1), "prod_empty": x.prod(1), "mean_empty": x.mean(1), "any_empty": x.any(1),
                "all_empty": x.all(1), "sum_all_empty": x.sum(), "int_sum_empty": i.sum(1), "int_prod_empty": i.prod(1),
                "rows_empty": e.sum(1), "rows_empty_max": e.amax(1), "rows_empty_argmax": e.argmax(1),
                "logsumexp_empty": torch.logsumexp(x, 1)}

    run_named(build, x, e, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
def test_variance_of_equal_values_is_exactly_zero(dtype):
    # Found by the GPU fuzz: reciprocal(var(x, 0, keepdim=True) * x) over repeated rows. Eager's
    # variance of equal values is exactly 0 (so the program gives +-inf); sum(x) / n is an ulp
    # off there, and 1e-15 instead of 0 turned inf into 1e15.
    row = torch.randn(7, dtype=dtype)
    x = row.expand(5, 7).contiguous().to(DEVICE)
    columns = torch.randn(3, 1, dtype=dtype).expand(3, 9).contiguous().to(DEVICE)

    def fn(x, columns):
        return (torch.reciprocal(x.var(0, keepdim=True) * x), x.var(0), torch.var_mean(x, 0)[1],
                columns.var(1), torch.var_mean(x, (0, 1)))

    actual, expected = compile_strict(fn)(x, columns), fn(x, columns)
    assert torch.equal(actual[0], expected[0]) and torch.isinf(actual[0]).all()
    for got, want in zip(actual[1:4], expected[1:4]):
        assert torch.equal(got, want), (got, want)
    assert actual[4][0] > 0 and torch.allclose(actual[4][1], expected[4][1])


# -- persistent vs looped -------------------------------------------------------------------------
def test_longest_persistent_row():
    """4096 is the largest row reduced in registers (a few ops: the interpreter is slow here)."""
    x = floats((2, 4096), torch.float32, specials=[])
    x[1, 4095] = 10.0
    run_named(lambda x: {"sum": x.sum(1), "amax": x.amax(1), "argmax": x.argmax(1), "var": x.var(1)}, x)


@pytest.mark.parametrize("length", [4097, 9000], ids=lambda n: f"row{n}")
def test_long_rows(length):
    """Rows longer than 4096 loop over RBLOCK chunks (the last one partial)."""
    x = floats((3, length), torch.float32, specials=[])
    x[1, length - 1] = 10.0  # the max in the last (partial) chunk
    x[2, 5] = -10.0
    i = ints((2, length), torch.int32, low=-5, high=6)

    def build(x, i):
        return {"sum": x.sum(1), "mean": x.mean(-1), "amax": x.amax(1), "amin": x.amin(1), "var": x.var(1),
                "var_mean": torch.var_mean(x, 1, correction=0), "argmax": x.argmax(1), "argmin": x.argmin(1),
                "max_dim": x.max(1), "any": (x > 3.9).any(1), "all": (x > -3.9).all(1), "prod": torch.where(x > 0, 1.0, -1.0).prod(1),
                "int_sum": i.sum(1), "int_argmax": i.argmax(1), "softmax": torch.softmax(x, -1),
                "normalized": x - x.mean(-1, keepdim=True)}

    run_named(build, x, i)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=dtype_id)
def test_long_rows_other_dtypes(dtype):
    x = floats((2, 5000), dtype, -2, 2, specials=[NAN] if dtype == torch.float64 else [])
    run_named(lambda x: {"sum": x.sum(1), "mean": x.mean(1), "amax": x.amax(1), "argmax": x.argmax(1),
                         "var": x.var(1), "min_dim": x.min(1)}, x)


def test_long_reduction_over_non_last_dim_and_all_dims():
    x = floats((4500, 3), torch.float32, specials=[])
    run_named(lambda x: {"col_sum": x.sum(0), "col_max": x.max(0), "col_argmin": x.argmin(0), "all_sum": x.sum(),
                         "all_mean": x.mean(), "all_argmax": x.argmax()}, x)


# -- inputs that are views or computed ----------------------------------------------------------
def test_reductions_of_views_and_producers():
    x = floats((6, 9), torch.float32, specials=[])

    def build(x):
        return {"transposed": x.t().sum(-1), "transposed_max": x.t().max(1), "sliced": x[::2, 1:].mean(1),
                "expanded": x[:1].expand(4, 9).sum(0), "reshaped": x.reshape(3, 18).var(1),
                "producer": torch.exp(x * 0.5).sum(1), "two_inputs": (x * x.t().t()).sum(0),
                "cast_producer": x.to(torch.float16).sum(1), "select": x[:, 3].sum(), "unsqueezed": x.unsqueeze(1).sum(2)}

    run_named(build, x)


def test_non_contiguous_input_reductions():
    base = floats((9, 14), torch.float32, specials=[])
    x = base.t()[2:, ::2]  # (12, 5), strides (1, 28), offset 2 * 14
    run_named(lambda x: {"sum0": x.sum(0), "sum1": x.sum(1), "argmax0": x.argmax(0), "var1": x.var(1),
                         "max_all": x.amax()}, x)


# -- fusion with epilogues -------------------------------------------------------------------------
@pytest.mark.parametrize("length", [37, 5000], ids=["persistent", "looped"])
def test_reduction_with_epilogue_is_one_kernel(length):
    x = floats((4, length), torch.float32, specials=[])
    fn = lambda x: x - x.mean(-1, keepdim=True)  # noqa: E731
    check_outputs(fn, x, compiled=compile_strict(fn), scale_tol=True)
    assert generated_kernel_count() == 1, torchfuse.report()


@pytest.mark.parametrize("length", [37, 5000], ids=["persistent", "looped"])
def test_normalization_patterns_are_one_kernel(length):
    x = floats((4, length), torch.float32, specials=[])

    def fn(x):
        centered = x - x.mean(-1, keepdim=True)
        return centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-5), x.amax(-1) + x.sum(-1)

    check_outputs(fn, x, compiled=compile_strict(fn), scale_tol=True)
    assert generated_kernel_count() == 1, torchfuse.report()


def test_half_reduction_with_epilogue_is_one_kernel():
    x = floats((4, 50), torch.bfloat16, specials=[])
    fn = lambda x: (x / x.sum(-1, keepdim=True), x.mean(-1))  # noqa: E731
    check_outputs(fn, x, compiled=compile_strict(fn), scale_tol=True)
    assert generated_kernel_count() == 1, torchfuse.report()


def test_a_residual_stream_is_stored_once_per_add_not_recomputed_by_every_norm():
    """A transformer stack's norms each read the running sum h = x + y1 + y2 + ..., with a matmul
    between them. Inlined link by link, every norm kernel would re-read every term (and keep
    them all alive): the last of five norms here would read five full-size buffers. Stored
    once per add, each norm kernel reads the previous sum and one new term."""
    x = floats((8, 96), torch.float32, specials=[])
    weights = [floats((96, 96), torch.float32, specials=[], seed=i) / 96 for i in range(1, 5)]

    def rms_norm(h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)

    def fn(x, *weights):
        h = x
        for w in weights:
            h = h + rms_norm(h) @ w
        return rms_norm(h)

    check_outputs(fn, x, *weights, compiled=compile_strict(fn), scale_tol=True)
    full = x.numel() * x.element_size()
    kernels = [k for g in torchfuse.report().graphs for k in g.kernels if k.kind != "extern"]
    full_reads = [sum(1 for access in k.reads if access.bytes == full) for k in kernels]
    assert max(full_reads) <= 2, (full_reads, torchfuse.report())


def test_a_product_its_readers_half_load_anyway_is_recomputed_not_stored():
    """A softmax backward: ``p * dp`` feeds the row sum, ``ds = p * dp - p * sum`` (cast for a
    matmul) and a batch sum of ``ds`` (T5's position-bias gradient). Every reader loads ``p``
    anyway, so recomputing the product costs each only ``dp`` (2 bytes an element), where
    storing it costs a float32 write and a float32 read per reader. The count rule alone
    (3 readers x 2 inputs >= 2 + 1 + 3) stored it."""
    p = floats((4, 3, 40, 40), torch.float32, specials=[]).softmax(-1)
    dp = floats((4, 3, 40, 40), torch.bfloat16, specials=[], seed=1)
    keep = torch.rand(1, 1, 40, 1, device=DEVICE) > 0.3

    def fn(p, dp, keep):
        product = p * dp.float()
        ds = product - p * product.sum(-1, keepdim=True)
        return ds.to(torch.bfloat16), torch.where(keep, ds, 0.0).sum(0)

    check_outputs(fn, p, dp, keep, compiled=compile_strict(fn), scale_tol=True)
    full_f32 = p.numel() * 4
    kernels = [k for g in torchfuse.report().graphs for k in g.kernels if k.kind != "extern"]
    written = [(k.name, access.name) for k in kernels for access in k.writes if access.bytes == full_f32]
    assert written == [], (written, torchfuse.report())


# -- dynamic shapes ---------------------------------------------------------------------------------
def test_dynamic_reduction_sizes():
    def build(x):
        return {"sum": x.sum(1), "mean": x.mean(1), "var": x.var(1), "argmax": x.argmax(1), "max": x.amax(0),
                "normalized": x - x.mean(1, keepdim=True)}

    fn = lambda x: tuple(build(x).values())  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    names = list(build(floats((3, 5), torch.float32)))
    for shape in [(3, 5), (2, 1500)]:  # a short row and one longer than a loop chunk
        check_outputs(fn, floats(shape, torch.float32, specials=[], seed=shape[1]), names=names, compiled=compiled,
                      scale_tol=True)
    assert len(torchfuse.report().graphs) == 1


# -- IR-level: what the scheduler must handle even though our lowering avoids it --------------
@pytest.mark.xfail(strict=True, raises=NameError, reason=(
    "scheduler/codegen (scheduler/placement.py + codegen/triton/kernel.py): a Reduction whose reduced dims all "
    "have size 1 gets no r range, so its kernel is 'pointwise'; a member reading it inside that kernel loads "
    "its buffer from memory, but the buffer is never stored or allocated (NameError in the wrapper). "
    "lowering/rules/reductions.py now lowers such reductions as pointwise nodes, so only hand-built IR hits it"))
def test_scheduler_handles_reduction_over_size_one_dims():
    import sympy

    from torchfuse.codegen.triton.kernel import render_kernel
    from torchfuse.ir.expr import Const, Op
    from torchfuse.ir.graph import Buffer, Graph, GraphOutput
    from torchfuse.lowering.context import LoweringContext
    from torchfuse.lowering.values import TensorValue
    from torchfuse.runtime.kernel_cache import load_kernel
    from torchfuse.runtime.wrapper import build_wrapper
    from torchfuse.scheduler.schedule import schedule

    f32, device = torch.float32, torch.device(DEVICE)
    graph = Graph()
    x = Buffer.contiguous("x", (sympy.Integer(3), sympy.Integer(1)), f32, device)
    graph.inputs.append(x)
    graph.buffers["x"] = x
    ctx = LoweringContext(graph)
    xv = TensorValue.of_buffer("x", x.shape, f32, device)
    total = ctx.reduction(x.shape, (1,), False, f32, device, "sum", lambda idx: xv.load(idx))  # sum over r[1]
    out = ctx.pointwise(total.shape, f32, device, lambda idx: Op(f32, "mul", (total.load(idx), Const(f32, 2.0))))
    graph.outputs = [GraphOutput(out.buffer, out.shape, (sympy.Integer(1),))]
    plan = schedule(graph)
    kernels = {k.name: render_kernel(k, graph.buffers) for k in plan.kernels}
    launchers = {name: load_kernel(k.source, k.function, DEVICE == "cpu") for name, k in kernels.items()}
    call, *_ = build_wrapper(graph, plan, kernels, launchers)
    t = torch.randn(3, 1, device=DEVICE)
    (result,) = call([t])
    torch.testing.assert_close(result, t.sum(1) * 2)


def test_kernel_modules_define_only_the_helpers_their_kernels_call(monkeypatch):
    """Every ``@jit`` function a module defines costs its import (and each compile worker's) a
    ``JITFunction``; a module holds the helpers its kernel names, and those they name in turn."""
    import re

    from torchfuse.codegen.triton import reductions
    from torchfuse.runtime import kernel_cache

    plain = kernel_cache.module_source("@jit\ndef k(ptr0):\n    tl.store(ptr0, 1.0)\n")
    assert plain.count("@jit") == 1
    reduced = reductions.helpers_for("red = tl.reduce(acc, 1, _max_nan)\nq = _floordiv_float(a, b)")
    assert re.findall(r"def (\w+)\(", reduced) == ["_floordiv_float", "_max_nan"]
    monkeypatch.setitem(reductions._HELPER_BLOCKS, "_outer", "@jit\ndef _outer(a):\n    return _add(a, a)\n")
    monkeypatch.setattr(reductions, "_HELPER_NAME", re.compile(r"\b(" + "|".join(reductions._HELPER_BLOCKS) + r")\b"))
    assert re.findall(r"def (\w+)\(", reductions.helpers_for("x = _outer(y)")) == ["_add", "_outer"]


def test_arg_reductions_in_a_backwards_loop_break_ties_at_the_first_index():
    """An argmax that reads the row's mean runs in the kernel's second loop, which walks the row
    backwards (``_open_r_loop``): ties still go to the first index, as in eager."""
    def centered_extremes(x):
        c = x - x.mean(-1, keepdim=True)
        return c.argmax(-1), c.argmin(-1)

    x = torch.randint(0, 3, (3, 5000)).float()  # each extreme repeats ~1700 times a row
    compiled = torchfuse.compile(centered_extremes, options={"target": "triton", "strict": True})
    for got, want in zip(compiled(x), centered_extremes(x)):
        assert torch.equal(got, want), (got, want)
    sources = [k.source for g in torchfuse.report().graphs for k in g.kernels if k.source]
    assert any("for rstep" in s and "_argmax_combine" in s for s in sources)
