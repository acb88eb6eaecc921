"""Split variances on the Triton target: a variance's sum and centered sums split together.

``lowering/rules/reductions.py`` lowers variance as ``m = sum(x) / n`` and the sums of ``x - m``
and ``(x - m)^2``; ``codegen/triton/split.py`` splits the three together: the first stage sums
each chunk and then sums it again around the chunk's own mean (one kernel, the input read from
memory once), the second combines the chunks exactly (Chan et al.). These tests hold it to a
float64 reference on data that breaks careless variance formulas (a large offset, one outlier,
constant rows, NaN and inf), through var/std/var_mean and the norms that use them, and check the
kernel structure. The split policy is shrunk so that small inputs split (Triton's interpreter).
"""
from __future__ import annotations

import copy
import re

import pytest
import torch

import torchfuse
from conftest import DEVICE, assert_close, compile_strict
from opcheck import INF, NAN, check_outputs, dtype_id, fallbacks
from torchfuse.codegen.triton import split

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

SMALL = split.SplitPolicy(min_elements=256, min_programs=64, target_programs=8, min_program_elements=32, outer_lanes=4)


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    monkeypatch.setattr(split, "POLICY", SMALL)


def compile_triton(fn):
    return compile_strict(fn, options={"target": "triton"})


def notes() -> list[str]:
    return [note for graph in torchfuse.report().graphs for note in graph.split_reductions]


def assert_split_together():
    """Some variance was split jointly, and nothing fell back to ATen."""
    assert not fallbacks(), fallbacks()
    assert any("split together" in note for note in notes()), notes()


def randn(shape, seed: int, channels_last: bool = False) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


# (shape, reduced dims, channels-last): columns whose length the chunk divides (outer, interleaved),
# a prime column length (a ragged interleaved split), long prime rows (inner, the last contiguous
# chunk short), batch-norm statistics of a channels-last tensor, and everything at once.
LAYOUTS = {
    "columns": ((1000, 7), 0, False),
    "prime_columns": ((997, 5), 0, False),
    "prime_rows": ((3, 1009), 1, False),
    "channels_last": ((4, 8, 9, 7), (0, 2, 3), True),
    "everything": ((61, 33), None, False),
}


def statistics(dims):
    def build(plain, offset, outlier):
        out = {}
        for name, x in (("plain", plain), ("offset", offset), ("outlier", outlier)):
            out |= {f"{name}_var": x.var(dims), f"{name}_var0": x.var(dims, correction=0),
                    f"{name}_std": x.std(dims), f"{name}_var_mean": torch.var_mean(x, dims, correction=0),
                    f"{name}_std_mean": torch.std_mean(x, dims)}
        if dims is not None:  # the (dim, unbiased, keepdim) overloads
            out |= {"biased_keepdim": offset.var(dims, False, True), "std_biased": outlier.std(dims, unbiased=False)}
        return out
    return build


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_variances_against_float64(layout, dtype):
    """Unit-variance data plain, shifted by 1e4 (a one-pass sum of squares loses every digit), and
    with one 1e4 outlier at the first element (one chunk's mean far from the others)."""
    shape, dims, channels_last = LAYOUTS[layout]
    plain = randn(shape, 1, channels_last)
    offset = randn(shape, 2, channels_last) + 1e4
    outlier = randn(shape, 3, channels_last)
    outlier[(0,) * len(shape)] = 1e4  # the first element, in memory too
    args = [t.to(dtype).to(DEVICE) for t in (plain, offset, outlier)]
    build = statistics(dims)
    names = list(build(*args))
    fn = lambda *a: tuple(build(*a).values())  # noqa: E731
    check_outputs(fn, *args, names=names, compiled=compile_triton(fn))
    assert_split_together()


@pytest.mark.parametrize("layout", ["columns", "prime_columns", "prime_rows", "channels_last"])
def test_constant_input_has_exactly_zero_variance(layout):
    """Equal values, none exact in binary (their sums round): the variance is exactly 0, never
    negative nor NaN, and the mean is the value itself, as eager's."""
    shape, dims, channels_last = LAYOUTS[layout]
    values = torch.tensor([0.1, 3.7, 1e4 + 0.3, -2.2, 1 / 3, 7e-5, 123.456, -0.7, 1e-3])
    reduced = {dims} if isinstance(dims, int) else set(dims)
    dim = next(d for d in range(len(shape)) if d not in reduced)  # the kept dim holds the different constants
    view = [1] * len(shape)
    view[dim] = shape[dim]
    x = values[: shape[dim]].view(view).expand(shape).contiguous()
    x = (x.contiguous(memory_format=torch.channels_last) if channels_last else x).to(DEVICE)
    fn = lambda x: (x.var(dims), x.std(dims, correction=0), *torch.var_mean(x, dims))  # noqa: E731
    *variances, mean = compile_triton(fn)(x)
    for v in variances:  # == 0 exactly: neither NaN nor negative nor 1e-15
        assert torch.equal(v, torch.zeros_like(v)), v
    assert torch.equal(mean, fn(x)[3]), (mean, fn(x)[3])
    assert_split_together()


def test_nan_and_inf_propagate_as_in_eager():
    """A NaN, an inf, and +inf with -inf, in different chunks of different columns: NaN where eager
    has it (inf - inf included), the other columns untouched."""
    x = randn((1000, 6), 4)
    x[5, 1] = NAN
    x[700, 2] = INF
    x[9, 3], x[900, 3] = -INF, INF
    x[0, 4] = -INF
    x = x.float().to(DEVICE)
    fn = lambda x: (x.var(0), x.std(0), *torch.var_mean(x, 0, correction=0))  # noqa: E731
    check_outputs(fn, x, compiled=compile_triton(fn))
    assert_split_together()


def test_zero_size_and_single_element_as_eager():
    """Nothing to split over an empty tensor or a dim of one (NaN or 0 as eager gives them)."""
    empty, rows = torch.empty(0, 5, device=DEVICE), randn((600, 1), 5).float().to(DEVICE)
    fn = lambda e, r: (e.var(0), torch.var_mean(e, 0), r.var(1), r.var(0), torch.var_mean(r, 1))  # noqa: E731
    check_outputs(fn, empty, rows, compiled=compile_triton(fn))
    assert any("split together" in note for note in notes())  # r.var(0): 600 elements into 1


def training_step(model, x):
    """Output, input and parameter gradients of one step, and the running statistics after it."""
    x = x.detach().clone().requires_grad_()
    out = model(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float32, device=out.device).view(out.shape)
    (out.float() * weights).sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return [out, *grads, *[b.clone() for b in model.buffers() if b.is_floating_point()]]


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_batch_norm_training_forward_and_backward(channels_last, autocast):
    """Batch norm in training: its statistics split together; the output, every gradient and the
    running mean and (unbiased) variance match a float64 model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(6), torch.nn.Hardswish()).to(DEVICE)
    model[0].weight.data.uniform_(0.5, 1.5)
    model[0].bias.data.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(model).double()
    eager = copy.deepcopy(model)
    x = (randn((4, 6, 9, 11), 6, channels_last) * 3 + 50).float().to(DEVICE)
    compiled = compile_triton(model)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        got = training_step(compiled, x)
        expected = training_step(eager, x)
    want = training_step(reference, x.double())
    for a, e, r in zip(got, expected, want):
        assert_close(a, e, dtype=torch.bfloat16 if autocast else None, reference=r)
    assert_split_together()


def test_layer_and_group_norm_forward_and_backward():
    """Layer norm over few long rows (inner chunks) and group norm over few groups."""
    torch.manual_seed(1)
    model = torch.nn.ModuleDict({"ln": torch.nn.LayerNorm(1009), "gn": torch.nn.GroupNorm(2, 6)}).to(DEVICE)
    reference = copy.deepcopy(model).double()
    rows = (randn((3, 1009), 7) + 100).float().to(DEVICE)
    images = (randn((2, 6, 9, 17), 8) * 2 - 30).float().to(DEVICE)

    def step(model, rows, images):
        rows, images = rows.detach().clone().requires_grad_(), images.detach().clone().requires_grad_()
        a, b = model["ln"](rows), model["gn"](images)
        (a * a.detach().sin()).sum().backward(retain_graph=True)
        (b * b.detach().cos()).sum().backward()
        return [a, b, rows.grad, images.grad] + [p.grad for p in model.parameters()]

    compiled = torch.nn.ModuleDict({k: compile_triton(m) for k, m in copy.deepcopy(model).items()})
    got = step(compiled, rows, images)
    expected = step(model, rows, images)
    want = step(reference, rows.double(), images.double())
    for a, e, r in zip(got, expected, want):
        assert_close(a, e, reference=r)
    assert_split_together()


def test_batch_norm_statistics_read_the_input_once():
    """Channels-last batch-norm statistics are two reduction kernels: the first sums every chunk
    and sums it again around the chunk's mean (two loops over the same chunk, one kernel reading
    x), the second combines them with the epilogue. Split one by one they were four (the centered
    sums' first stage read x again, after the global mean)."""
    model = torch.nn.BatchNorm2d(16).to(DEVICE)
    x = randn((8, 16, 15, 15), 9, channels_last=True).float().to(DEVICE)
    with torch.no_grad():
        got = compile_triton(model)(x)
    assert_close(got, model(x))
    (graph,) = torchfuse.report().graphs
    reductions = [k for k in graph.kernels if k.kind == "reduction"]
    x_name = max((r for k in reductions for r in k.reads), key=lambda r: r.bytes).name  # the largest read
    readers = [k for k in reductions if any(r.name == x_name for r in k.reads)]
    assert len(reductions) == 2, [k.name for k in reductions]
    loops = re.findall(r"for (roffset|rstep) in (?:tl\.)?range\(", readers[0].source)
    assert len(readers) == 1 and loops == ["roffset", "rstep"], readers[0].source  # the second backwards
    assert len(graph.split_reductions) == 1 and "split together" in graph.split_reductions[0], graph.split_reductions
