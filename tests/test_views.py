"""View ops through the Triton backend: index maps must read the same elements eager does.

Views move no data in torchfuse (they compose index maps), so every test follows the views
with arithmetic (a kernel reads through the map) and also checks view-shaped outputs:
their values and, where eager's layout is fixed by the program, their strides.
"""
from __future__ import annotations

import pytest
import torch

import torchfuse
from conftest import DEVICE, compile_strict
from opcheck import check_outputs, dtype_id, fallbacks, floats, ints

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def run_named(build, *args, check_strides=True, dynamic=None, allow_fallbacks=(), compiled=None, reference=True):
    names = list(build(*args))
    fn = lambda *a: tuple(build(*a).values())  # noqa: E731
    compiled = compiled or compile_strict(fn, dynamic=dynamic)
    out = check_outputs(fn, *args, names=names, check_strides=check_strides, compiled=compiled, reference=reference)
    unexpected = [f for f in fallbacks() if not any(a in f for a in allow_fallbacks)]
    assert not unexpected, f"ops ran without a lowering: {unexpected}"
    return out, compiled


def x_of(shape, dtype=torch.float32, seed=0):
    return floats(shape, dtype, specials=[], seed=seed)


# -- reshapes -------------------------------------------------------------------------------
def test_view_merge_and_split_chain():
    """(6, 35) -> (210,) -> (5, 42) -> (2, 3, 35): each step mixes dims the previous made."""
    x = x_of((6, 35))

    def build(x):
        a = x.view(210)
        b = a.view(5, 42)
        c = b.view(2, 3, 35)
        return {"flat": a * 2, "5x42": b + 1, "2x3x35": c * 3 - a.view(2, 3, 35),
                "back": c.view(6, 35) * x, "mixed": (b * 2).view(6, 35) + a.view(35, 6).t()}

    run_named(build, x)


@pytest.mark.parametrize("src, dst", [
    ((4, 6), (24,)), ((4, 6), (2, 12)), ((4, 6), (8, 3)), ((4, 6), (2, 2, 2, 3)), ((2, 3, 4), (6, 4)),
    ((2, 3, 4), (2, 12)), ((2, 3, 4), (4, 6)), ((2, 3, 4), (3, 2, 4)), ((1, 6, 1), (6,)), ((6,), (1, 2, 1, 3, 1)),
    ((5, 1, 7), (35, 1)), ((2, 3, 4, 5), (6, 20)), ((2, 3, 4, 5), (5, 4, 3, 2)), ((12,), (12, 1)),
    ((0, 5), (5, 0)), ((3, 0, 2), (0, 6)), ((), (1, 1)), ((1,), ()),
], ids=str)
def test_reshape_shapes(src, dst):
    x = x_of(src)
    run_named(lambda x: {"reshape": x.reshape(dst) * 2, "roundtrip": x.reshape(dst).reshape(src) + x,
                         "view_out": x.view(dst)}, x)


def test_reshape_of_non_contiguous_input_copies():
    x = x_of((6, 10))

    def build(x):
        t = x.t()  # (10, 6), strides (1, 10): reshape must copy, view would fail
        return {"flat": t.reshape(-1) * 1, "split": t.reshape(5, 12) + 1, "sliced": x[:, ::2].reshape(30) * 2,
                "contig": t.contiguous(), "flatten": t.flatten() - 1}

    run_named(build, x)


def test_flatten_unflatten_and_view_as():
    x = x_of((2, 3, 4, 5))
    y = x_of((6, 20), seed=1)

    def build(x, y):
        return {"flatten_mid": x.flatten(1, 2) * 2, "unflatten": y.unflatten(1, (4, 5)) + 1,
                "view_as": x.view_as(y) * y,
                "reshape_as": y.reshape_as(x) - x}

    run_named(build, x, y)


# -- permutes and transposes ------------------------------------------------------------------
def test_permute_transpose_t():
    x = x_of((2, 3, 4, 5))
    m = x_of((7, 13), seed=1)

    def build(x, m):
        return {"permute": x.permute(3, 1, 0, 2) * 2, "permute_neg": x.permute(-1, -2, -3, -4) + 1,
                "transpose": x.transpose(1, 3) - 1, "transpose_neg": x.transpose(-1, 0) * 3,
                "t": m.t() * m.t(), "T": m.T + 1, "mT": x.mT * 2, "movedim": torch.movedim(x, 0, -1) + 0,
                "swap_back": x.transpose(0, 2).transpose(0, 2) * x, "add_transposed": m + m.t().t(),
                "t_of_1d": x[0, 0, 0].t() * 2, "permute_view": x.permute(0, 2, 1, 3).reshape(2, 12, 5) * 1}

    run_named(build, x, m)


def test_view_outputs_keep_eager_strides():
    """``x.t() * 2`` is laid out like x.t() in eager; ``(x * 2).t()`` is a view of a result."""
    x = x_of((7, 13))

    def build(x):
        return {"t_times_2": x.t() * 2, "times_2_t": (x * 2).t(), "permuted_result": (x + 1).unsqueeze(0).permute(2, 0, 1),
                "slice_of_result": (x * 3)[1:5, ::2], "select_of_result": (x * 4)[:, -2],
                "expand_of_result": (x[0] * 5).expand(3, 13), "diag_like": (x - 1)[2:, 3]}

    run_named(build, x)  # check_strides: each output has eager's strides


def test_outputs_aliasing_inputs_and_each_other():
    x = x_of((6, 8))

    def build(x):
        y = x * 2
        return {"input_t": x.t(), "input_slice": x[1:, ::2], "input_flat": x.view(48), "input_row": x[-1],
                "result": y, "result_t": y.t(), "result_row": y[2], "result_cols": y[:, 1::3], "result_flat": y.view(6, 2, 4)}

    outs, _ = run_named(build, x)
    assert outs[0].data_ptr() == x.data_ptr(), "a view of an input should alias it, as in eager"


def test_transposed_output_feeds_second_compiled_call():
    x = x_of((5, 8))
    compiled = compile_strict(lambda x: (x * 2).t())
    y = compiled(x)
    assert y.stride() == (x * 2).t().stride()
    z = compile_strict(lambda y: y.sin() + 1)(y)  # a non-contiguous input
    torch.testing.assert_close(z, (x * 2).t().sin() + 1)


# -- expand, squeeze, unsqueeze -------------------------------------------------------------------
def test_expand_squeeze_unsqueeze():
    x = x_of((1, 5, 1, 3))
    v = x_of((4,), seed=1)

    def build(x, v):
        return {"expand": x.expand(2, 5, 4, 3) * 2, "expand_neg1": x.expand(-1, -1, 6, -1) + 1,
                "expand_new_dims": v.expand(3, 2, 4) * v, "expand_as": v.expand_as(x[0, :, 0, :1].expand(5, 4)) + 0,
                "broadcast_to": torch.broadcast_to(v, (2, 4)) * 3,
                "squeeze_all": x.squeeze() * 2, "squeeze_dim": x.squeeze(2) + 1, "squeeze_noop": x.squeeze(1) - 1,
                "squeeze_dims": x.squeeze((0, 2)) * 4, "squeeze_neg": x.squeeze(-2) + 2,
                "unsqueeze0": v.unsqueeze(0) * 2, "unsqueeze_last": v.unsqueeze(-1) + v.unsqueeze(0),
                "none_index": v[None, :, None] * 3, "expand_out": x.expand(2, 5, 4, 3)}

    run_named(build, x, v, check_strides=False)


# -- slicing and selecting -------------------------------------------------------------------------
def test_slices_with_steps_and_negative_bounds():
    x = x_of((11, 13))

    def build(x):
        return {"step2": x[::2] * 2, "step3_cols": x[:, 1::3] + 1, "neg_start": x[-4:] * 3,
                "neg_start_stop": x[-7:-2, -5:-1] - 1, "neg_stop_step": x[1:-1:4, ::5] * 2,
                "clamped_end": x[:, 5:100] + 0, "clamped_start": x[-100:3] * 1, "empty": x[5:2] * 2,
                "step_gt_size": x[::20, ::50] + 1, "narrow": x.narrow(1, 2, 6) * 2, "narrow_neg": x.narrow(0, -3, 2) + 1,
                "chained": x[1:][::2][:, 3:][:, ::2] * 4, "slice_out": x[2:9:3, 1::4]}

    run_named(build, x)


def test_select_with_negative_indices():
    x = x_of((4, 5, 6))

    def build(x):
        return {"first": x[0] * 2, "last": x[-1] + 1, "mid_dim": x[:, -2] * 3, "last_dim": x[..., -1] - 1,
                "two": x[-1, 2] * 2, "scalar": x[1, -1, -3] + 1, "select_fn": torch.select(x, 2, -6) * 2,
                "select_then_slice": x[:, 1][1:, ::2] * 3, "select_out": x[2, :, -1]}

    run_named(build, x)


def test_split_chunk_unbind():
    x = x_of((6, 10))

    def build(x):
        a, b, c = x.split(4, dim=1)
        p, q = x.split([2, 4], dim=0)
        r = x.chunk(3, dim=0)
        u = x.unbind(1)
        return {"split_a": a * 2, "split_b": b + 1, "split_c_small": c * c, "sizes_p": p - 1, "sizes_q": q * 2,
                "chunk": r[0] + r[1] * r[2], "chunk_uneven": x.chunk(4, dim=1)[-1] * 3, "unbind_0": u[0] * 2,
                "unbind_last": u[-1] + u[3], "split_out": b, "unbind_out": x.unbind(0)[2],
                "tensor_split": torch.tensor_split(x, 3, dim=1)[1] * 2}

    run_named(build, x)


def test_as_strided_over_contiguous_input():
    x = x_of((6, 8))

    def build(x):
        return {"windows": torch.as_strided(x, (5, 4), (8, 2)) * 2, "offset": torch.as_strided(x, (3, 3), (9, 1), 5) + 1,
                "overlapping": torch.as_strided(x, (4, 5), (3, 1)) * 3, "broadcast_stride0": torch.as_strided(x, (3, 4), (0, 1)) + 2,
                "transposed": torch.as_strided(x, (8, 6), (1, 8)) - x.t()}

    run_named(build, x)


def test_as_strided_over_input_with_storage_offset():
    """as_strided's storage offset is absolute: x = base[7:37] starts at storage element 7."""
    base = x_of((100,))
    x = base[7:37].view(5, 6)

    def build(x):
        return {"default_offset": torch.as_strided(x, (3, 4), (6, 1)) * 2,
                "absolute_offset": torch.as_strided(x, (3, 4), (6, 1), 9) + 1,
                "beyond_numel": torch.as_strided(x, (2, 5), (1, 8), 30) * 3}

    run_named(build, x, reference=False)  # a float64 copy of x would have another storage


def test_view_as_other_dtype_reinterprets_bits():
    x = x_of((4, 6))

    def build(x):
        return {"as_int": x.view(torch.int32) & 0xFF, "as_int_back": (x.view(torch.int32) ^ 1).view(torch.float32) * 1,
                "as_half_pairs": x.view(torch.float16) + 0}

    names = list(build(x))
    fn = lambda x: tuple(build(x).values())  # noqa: E731
    check_outputs(fn, x, names=names, compiled=compile_strict(fn))  # view.dtype may run as an ATen call


def test_diagonal_and_unfold():
    x = x_of((5, 7))

    def build(x):
        return {"diagonal": torch.diagonal(x) * 2, "diagonal_offset": torch.diagonal(x, 2) + 1,
                "diagonal_neg": torch.diagonal(x, -1) * 3, "unfold": x.unfold(1, 3, 2) * 2}

    run_named(build, x, check_strides=False)


# -- non-contiguous inputs ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool], ids=dtype_id)
def test_non_contiguous_inputs(dtype):
    base = floats((9, 14), dtype, specials=[]) if dtype.is_floating_point else ints((9, 14), dtype)
    inputs = {
        "transposed": base.t(), "sliced": base[1:8:2, 3:], "strided_cols": base[:, ::3], "expanded": base[:1].expand(4, 14),
        "offset_row": base[4], "negative_step_free_permute": base.view(3, 3, 14).permute(2, 0, 1),
    }
    for name, x in inputs.items():
        def build(x):
            y = x.to(torch.float32) if dtype == torch.bool else x
            return {f"{name}_arith": y * 2 + 1, f"{name}_cast": x.to(torch.float64), f"{name}_copy": x.clone(),
                    f"{name}_contiguous": x.contiguous(), f"{name}_reshaped": x.reshape(-1)[::2] * 1}

        run_named(build, x, check_strides=False)
        torchfuse.reset()


def test_input_with_storage_offset_and_broadcast():
    storage = x_of((100,))
    x = storage[7:7 + 30].view(5, 6)  # storage offset 7
    b = storage[50:56]
    run_named(lambda x, b: {"add": x + b, "rows": x[1:, None, :] * b, "mul_t": x.t() * b[:, None]}, x, b)


# -- views chained with arithmetic ---------------------------------------------------------------
def test_long_view_chain_then_arithmetic():
    x = x_of((4, 6, 5))
    y = x_of((30, 4), seed=1)

    def build(x, y):
        v = x.permute(2, 0, 1)  # (5, 4, 6)
        v = v.reshape(5, 24)[:, 2:20:3]  # (5, 6)
        v = v.unsqueeze(1).expand(5, 2, 6).reshape(10, 6)
        w = y.t().reshape(4, 5, 6)[1:3].flatten(0, 1)  # (10, 6)
        return {"chain": (v * w + 1).t(), "chain_broadcast": v - w[:, :1]}

    run_named(build, x, y)


def test_views_of_intermediates_in_one_kernel():
    x = x_of((8, 12))

    def fn(x):
        y = torch.exp(x * 0.1)
        return (y.view(4, 24).t() * 2).reshape(96)[::3] + y.t().reshape(-1)[:32]

    compiled = compile_strict(fn)
    check_outputs(fn, x, compiled=compiled)
    kernels = sum(len(g.generated_kernels) for g in torchfuse.report().graphs)
    assert kernels == 1, torchfuse.report()


# -- dynamic shapes ---------------------------------------------------------------------------------
def test_dynamic_views_follow_symbolic_sizes():
    def build(x):
        n, m = x.shape
        return {"flat": x.view(n * m) * 2, "split_last": x.reshape(n, m // 2, 2)[:, :, 1] + 1,
                "half_rows": x[: n // 2] * 3, "last_row": x[n - 1] - 1, "t": x.t() * 2, "merge_t": x.t().reshape(-1)[:m] * 1,
                "unsqueeze_expand": x[:, :1].expand(n, 3) + 1, "chunk": x.chunk(2, dim=1)[1] * 2,
                "scale_by_size": x * n + m}

    fn = lambda x: tuple(build(x).values())  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    names = list(build(x_of((5, 8))))
    for shape in [(5, 8), (7, 12), (9, 6)]:  # no derived size may be 0 or 1 (Dynamo would specialize)
        # Strides: see test_dynamic_transposed_output_keeps_eager_strides.
        check_outputs(fn, x_of(shape, seed=shape[0]), names=names, compiled=compiled, check_strides=False)
    graphs = torchfuse.report().graphs
    assert len(graphs) == 1, f"recompiled for a new size: {[g.name for g in graphs]}"
    assert not fallbacks()


def test_dynamic_view_with_size_from_two_symbols():
    def fn(x, y):
        a, b = x.shape
        return (x.view(a * b) + y.reshape(-1)).view(b, a), x.reshape(-1, 2) * 2

    compiled = compile_strict(fn, dynamic=True)
    for a, b in [(3, 4), (5, 6), (2, 10)]:
        x, y = x_of((a, b), seed=a), x_of((b, a), seed=b)
        check_outputs(fn, x, y, compiled=compiled, check_strides=True)
    assert len(torchfuse.report().graphs) == 1


def test_dynamic_transposed_output_keeps_eager_strides():
    compiled = compile_strict(lambda x: x.t() * 2, dynamic=True)
    x = x_of((5, 8))
    assert compiled(x).stride() == (x.t() * 2).stride() == (1, 8)


@pytest.mark.parametrize("permutation", [(2, 0, 1), (1, 0, 2), (0, 2, 1)])
def test_dynamic_permuted_outputs_keep_eager_strides_across_shapes(permutation):
    fn = lambda x: x.permute(*permutation) * 2 + 1  # noqa: E731
    compiled = compile_strict(fn, dynamic=True)
    for shape in [(3, 5, 7), (4, 6, 9)]:
        x = x_of(shape)
        check_outputs(fn, x, compiled=compiled, check_strides=True)
