"""Embedding backward and the other accumulating scatters, as generated kernels.

``aten.embedding_dense_backward`` (and ``index_put(accumulate=True)``, ``index_add``,
``scatter_add``, which lower to the same ``ScatterAdd`` node) against eager with a float64
reference, on C++ and, on CPU-only machines, on Triton's interpreter too (``TRITON_TOO`` in
conftest): repeated indices, padding rows, int32 and int64 indices of rank 1 to 3, odd feature
sizes, bfloat16 gradients (accumulated in float32), empty index tensors, symbolic sizes, a
training step of ``nn.Embedding``. Deterministic algorithms: the C++ kernel is reproducible bit
for bit (across thread counts too), the Triton target keeps ATen's kernel and says why.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, assert_close, compile_strict, to_float64
from torchfuse.runtime import graph_cache

aten = torch.ops.aten


def embedding_backward(num_weights, padding_idx=-1, scale_grad_by_freq=False):
    def fn(grad, indices):
        return aten.embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)

    return fn


def random_indices(high, shape, dtype=torch.int64):
    return torch.randint(0, high, shape, device=DEVICE, dtype=dtype)


def kernel_kinds() -> list[str]:
    """Each kernel's kind as the report shows it ("scatter" for an accumulating pointwise kernel)."""
    return [k.label for g in torchfuse.report().graphs for k in g.kernels]


def fallbacks() -> list[str]:
    return [op for g in torchfuse.report().graphs for op in g.fallbacks]


def check(fn, *args, dynamic=None):
    """``fn`` compiled against eager, with the float64 run as the reference; nothing falls back
    and the work is done by a generated scatter kernel."""
    compiled = compile_strict(fn, dynamic=dynamic)
    expected = fn(*args)
    reference = fn(*to_float64(args))
    actual = compiled(*args)
    assert_close(actual, expected, reference=reference)
    assert not fallbacks(), f"fell back to ATen: {fallbacks()}"
    assert "scatter" in kernel_kinds()
    return actual, reference


# -- embedding_dense_backward ---------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("index_shape", [(), (37,), (5, 9), (2, 3, 7)])
def test_repeated_indices_accumulate(index_shape, index_dtype):
    dim = 13  # odd: rows are not multiples of a vector
    indices = random_indices(6, index_shape, index_dtype)  # few rows: most repeat
    grad = torch.randn(*index_shape, dim, device=DEVICE)
    check(embedding_backward(11), grad, indices)  # rows 6..10 get nothing: zeros


@pytest.mark.parametrize("padding_idx", [0, 4, -1])
def test_padding_rows_get_no_gradient(padding_idx):
    indices = random_indices(8, (6, 11))
    indices[0, :4] = 4
    indices[1, :3] = 0
    grad = torch.randn(6, 11, 5, device=DEVICE)
    actual, _ = check(embedding_backward(8, padding_idx), grad, indices)
    if padding_idx >= 0:
        assert torch.equal(actual[padding_idx], torch.zeros_like(actual[padding_idx]))
    else:  # -1 means no padding row: row 4 and row 0 do get their gradients
        assert actual[4].abs().sum() > 0 and actual[0].abs().sum() > 0


def test_out_of_range_indices_write_nothing():
    """Eager validates indices in the forward; the kernel must still never write out of bounds."""
    indices = torch.tensor([[0, 9, 2], [-3, 2, 100]], device=DEVICE)
    grad = torch.randn(2, 3, 4, device=DEVICE)
    compiled = compile_strict(embedding_backward(10))
    actual = compiled(grad, indices)
    valid = (indices >= 0) & (indices < 10)
    expected = embedding_backward(10)(grad[valid].double(), indices[valid])
    assert torch.allclose(actual.double(), expected, rtol=1e-6, atol=1e-6)
    ir = torchfuse.report().graphs[-1].ir_text  # the scatter's mask bounds the runtime row
    assert "ge(" in ir and "lt(" in ir and ", 10)" in ir


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_gradients_accumulate_in_float32(dtype):
    """512 gradients into one row: accumulated in the half type, the sum would stop growing at
    256 (bfloat16 has 8 bits); in float32 it is exact, then rounded once. The table has 9 rows
    so that a GPU does not count it crowded (``_crowded_rows``: ATen's kernel would run)."""
    indices = torch.zeros(512, dtype=torch.int64, device=DEVICE)
    indices[::7] = 3
    grad = (1 + torch.rand(512, 6, device=DEVICE) / 64).to(dtype)
    actual, reference = check(embedding_backward(9, padding_idx=-1), grad, indices)
    assert actual.dtype == dtype
    exact = reference.to(dtype).double()  # the float64 sum, rounded once
    assert torch.allclose(actual.double(), exact, rtol=2 ** -7, atol=0), (actual, exact)


def test_empty_indices_give_zeros():
    grad = torch.randn(0, 7, device=DEVICE)
    actual, _ = check(embedding_backward(9), grad, torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(actual, torch.zeros(9, 7, device=DEVICE))
    grad = torch.randn(3, 0, 7, device=DEVICE)
    check(embedding_backward(9, 2), grad, torch.zeros(3, 0, dtype=torch.int32, device=DEVICE))


def test_noncontiguous_and_computed_gradients():
    """The gradient's producer (a transpose, a scale) is recomputed inside the scatter kernel."""
    indices = random_indices(7, (9,))
    grad = torch.randn(5, 9, device=DEVICE)
    check(lambda g, i: embedding_backward(7, 1)(g.t() * 3 - 1, i), grad, indices)
    assert kernel_kinds().count("scatter") == 1 and len(kernel_kinds()) == 2  # zeros, then the scatter


def test_scale_grad_by_freq():
    indices = random_indices(6, (4, 10))
    grad = torch.randn(4, 10, 3, device=DEVICE)
    check(embedding_backward(6, padding_idx=2, scale_grad_by_freq=True), grad, indices)
    assert kernel_kinds().count("scatter") == 2  # the counts, then the scaled gradients


def test_large_rows_split_among_threads():
    """Over 32768 elements the C++ kernel splits the feature dim among threads (a parallel region
    with one slice per thread); 131 is not a multiple of the 16-element slices."""
    indices = random_indices(40, (300,))
    check(embedding_backward(40, 5), torch.randn(300, 131, device=DEVICE), indices)


def test_symbolic_sizes():
    fn = embedding_backward(12, 3)
    compiled = compile_strict(fn, dynamic=True)
    for tokens in (17, 29):
        indices = random_indices(12, (tokens,))
        grad = torch.randn(tokens, 6, device=DEVICE)
        assert_close(compiled(grad, indices), fn(grad, indices), reference=fn(grad.double(), indices))
    assert not fallbacks()


def test_ir_and_report_show_the_scatter():
    compiled = compile_strict(lambda g, i: embedding_backward(7, 2)(g, i) * 2)
    compiled(torch.randn(5, 3, device=DEVICE), random_indices(7, (5,)))
    graph = torchfuse.report().graphs[-1]
    assert "] += " in graph.ir_text and "where" in graph.ir_text
    scatter = next(k for k in graph.kernels if k.label == "scatter")
    assert scatter.kind == "pointwise" and scatter.accumulates  # the public kinds (design.md) stay three
    assert scatter.ops[0] == "aten.embedding_dense_backward"
    assert "scatter" in str(torchfuse.report())
    # Its reader (the * 2) runs after it, in a kernel of its own, and the report says why.
    assert any("accumulating scatter" in d.reason for d in graph.decisions), graph.decisions


def test_float32_matches_eager_bit_for_bit_on_cpu(compile_target):
    """Eager's CPU kernel adds each row's gradients in index order, as the C++ kernel does
    (also when it splits the feature dim among threads)."""
    if compile_target != "cpp" or DEVICE != "cpu":
        pytest.skip("the C++ kernel's order")
    indices = random_indices(20, (500,))
    grad = torch.randn(500, 77, device=DEVICE)
    compiled = compile_strict(embedding_backward(20, 3))
    assert torch.equal(compiled(grad, indices), embedding_backward(20, 3)(grad, indices))


# -- nn.Embedding training step -------------------------------------------------------------------
class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(50, 24, padding_idx=0)
        self.positions = torch.nn.Embedding(16, 24)
        self.head = torch.nn.Linear(24, 50)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = F.layer_norm(self.tokens(ids) + self.positions(positions), (24,))
        return F.cross_entropy(self.head(hidden).flatten(0, 1), ids.flatten())


def _step(model, ids):
    model.zero_grad()
    loss = model(ids)
    loss.backward()
    return loss, [p.grad.clone() for p in model.parameters()]


def test_training_step_through_torch_compile():
    """``torch.compile(backend="torchfuse")`` (the default target) gives eager's weight gradients."""
    torch.manual_seed(0)
    model = TinyLM().to(DEVICE)
    ids = random_indices(50, (3, 16))
    ids[:, -4:] = 0  # padding tokens
    loss, grads = _step(torch.compile(model, backend="torchfuse"), ids)
    eager_loss, eager_grads = _step(model, ids)
    reference = TinyLM().to(DEVICE).double()
    reference.load_state_dict(model.state_dict())
    ref_loss, ref_grads = _step(reference, ids)
    assert_close(loss, eager_loss, reference=ref_loss)
    for actual, expected, ref in zip(grads, eager_grads, ref_grads):
        assert_close(actual, expected, reference=ref)
    backward = [g for g in torchfuse.report().graphs if g.kind == "backward"]
    assert backward and not any("embedding" in op for g in backward for op in g.fallbacks)
    assert sum(k.label == "scatter" for g in backward for k in g.kernels) == 2  # tokens and positions


def test_training_step_on_the_test_target():
    torch.manual_seed(1)
    model = TinyLM().to(DEVICE)
    ids = random_indices(50, (2, 9))
    compiled = compile_strict(model)
    loss, grads = _step(compiled, ids)
    eager_loss, eager_grads = _step(model, ids)
    for actual, expected in zip(grads, eager_grads):
        assert_close(actual, expected)
    assert not fallbacks()


# -- the other accumulating scatters --------------------------------------------------------------
def test_index_put_accumulate_with_negative_and_repeated_indices():
    x, values = torch.randn(6, 5, device=DEVICE), torch.randn(7, 5, device=DEVICE)
    rows = torch.tensor([0, -1, 3, 0, 0, 5, -6], device=DEVICE)
    check(lambda x, v, i: x.index_put((i,), v, accumulate=True) * 2, x, values, rows)


def test_index_put_accumulate_on_two_dims_with_broadcast_values():
    x = torch.randn(4, 6, 5, device=DEVICE)
    a, b = torch.tensor([[0], [3]], device=DEVICE), torch.tensor([1, 1, -1], device=DEVICE, dtype=torch.int32)
    # x[a, :, b] += v: the index dims are apart, so the broadcast index shape [2, 3] comes first.
    check(lambda x, a, b, v: aten.index_put(x, [a, None, b], v, True), x, a, b, torch.randn(6, device=DEVICE))


def test_index_put_of_one_column_over_many_rows():
    """``x[:, j] += v`` with a 0-d ``j``: the rows are the outermost loop, split among threads,
    and the column index is read once, before the loops."""
    x, values = torch.randn(40000, 3, device=DEVICE), torch.randn(40000, device=DEVICE)
    check(lambda x, v, j: aten.index_put(x, [None, j], v, True), x, values, torch.tensor(-2, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_index_add(dtype):
    x = (torch.randn(5, 8, device=DEVICE) * 10).to(dtype)
    source = (torch.randn(5, 4, device=DEVICE) * 10).to(dtype)
    index = torch.tensor([7, 1, 7, 2], device=DEVICE)
    check(lambda x, s, i: torch.index_add(x, 1, i, s, alpha=2), x, source, index)


def test_scatter_add():
    x, src = torch.randn(4, 9, device=DEVICE), torch.randn(4, 6, device=DEVICE)
    index = random_indices(9, (4, 5))  # smaller than src along dim 1
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), x, index, src)


# -- deterministic algorithms ---------------------------------------------------------------------
@pytest.fixture
def deterministic():
    previous, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous, warn_only=warn_only)


def test_deterministic_results_are_reproducible(deterministic, compile_target):
    """Two runs give the same bits. C++ keeps its generated kernel (it adds in a fixed order, for
    any thread count); the Triton target keeps ATen's deterministic kernel and says why."""
    indices = random_indices(30, (400,))
    grad = torch.randn(400, 97, device=DEVICE)
    compiled = compile_strict(embedding_backward(30, 7))
    first, second = compiled(grad, indices), compiled(grad, indices)
    assert torch.equal(first, second)
    assert_close(first, embedding_backward(30, 7)(grad, indices),
                 reference=embedding_backward(30, 7)(grad.double(), indices))
    graph = torchfuse.report().graphs[-1]
    if compile_target == "cpp":
        assert "scatter" in kernel_kinds() and not graph.fallbacks
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(compiled(grad, indices), first)
        finally:
            torch.set_num_threads(threads)
    else:
        assert "aten.embedding_dense_backward" in graph.fallbacks
        assert "deterministic algorithms" in graph.fallback_reasons["aten.embedding_dense_backward"]
        assert "deterministic algorithms" in str(torchfuse.report())
        assert "scatter" not in kernel_kinds()


def test_turning_deterministic_mode_on_recompiles(deterministic, compile_target):
    """Dynamo guards on the mode: a function compiled with it off compiles again once it is on,
    and the new graph follows it."""
    torch.use_deterministic_algorithms(False)
    compiled = compile_strict(embedding_backward(10, 2))
    grad, indices = torch.randn(5, 3, device=DEVICE), random_indices(10, (5,))
    compiled(grad, indices)
    torch.use_deterministic_algorithms(True)
    compiled(grad, indices)
    first, second = torchfuse.report().graphs[-2:]
    assert "scatter" in [k.label for k in first.kernels]
    on_gpu_target = compile_target == "triton"
    assert ("scatter" in [k.label for k in second.kernels]) != on_gpu_target
    assert ("aten.embedding_dense_backward" in second.fallback_reasons) == on_gpu_target


def test_the_graph_cache_key_depends_on_deterministic_mode(deterministic):
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchfuse.options import Options

    gm = make_fx(embedding_backward(5))(torch.randn(3, 2), torch.tensor([0, 1, 4]))
    on = graph_cache.graph_key(gm, "backward", "triton", Options(target="triton"))
    torch.use_deterministic_algorithms(False)
    off = graph_cache.graph_key(gm, "backward", "triton", Options(target="triton"))
    assert on != off


# -- on a GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_bert_sized_embedding_backward_in_bfloat16_on_gpu():
    """BERT-base's word embeddings: 8 x 512 tokens over 30522 rows of 768, bfloat16 gradients,
    padding row 0; float32 atomic adds then one rounding, against a float64 reference."""
    torch.manual_seed(0)
    indices = torch.randint(0, 30522, (8, 512), device="cuda")
    indices[:, 400:] = 0
    indices[:, :8] = 101  # a [CLS]-like token in every sequence: a row with many additions
    grad = torch.randn(8, 512, 768, device="cuda", dtype=torch.bfloat16)
    fn = embedding_backward(30522, 0)
    compiled = torchfuse.compile(fn, options={"strict": True})
    actual = compiled(grad, indices)
    reference = fn(grad.double(), indices)
    assert_close(actual, fn(grad, indices), reference=reference)
    # Within a bfloat16 rounding of the exact sum (eager's CUDA kernel also sums in float32).
    assert torch.allclose(actual.double(), reference.to(torch.bfloat16).double(), rtol=2 ** -7, atol=1e-6)
    assert "scatter" in kernel_kinds() and not fallbacks()


# -- the real Triton compiler -------------------------------------------------------------------------
def test_scatter_kernels_compile_for_the_gpu(monkeypatch, tmp_path, compile_target):
    """The interpreter accepts more than Triton's compiler: the scatter kernels (float32 and,
    counting indices, int64 atomic adds, masked, at gathered offsets) compile for sm_90 in the
    worker pool, predicted launches included, without a GPU."""
    if compile_target != "triton":
        pytest.skip("Triton kernels")
    pytest.importorskip("triton")
    import dataclasses

    from torchfuse import pipeline
    from torchfuse.runtime import binary_cache, compile_pool, kernel_cache, triton_ahead
    from torchfuse.runtime.predict import Unpredicted, predict_launches

    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "2")
    captured = []
    monkeypatch.setattr(pipeline, "STAGES", pipeline.STAGES + [("spy", lambda state: captured.append(state))])
    compiled = compile_strict(embedding_backward(30, 2, scale_grad_by_freq=True))
    compiled(torch.randn(40, 24, dtype=torch.bfloat16, device=DEVICE), random_indices(30, (40,), torch.int32))
    state = captured[-1]
    # On a GPU the call above compiled and stored these binaries already (its workers may still
    # be writing): compile ahead into a cache of its own.
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path / "ahead"))
    kernels = {name: dataclasses.replace(k, device="cuda") for name, k in state.kernels.items()}
    assert sum(k.kind == "scatter" for k in kernels.values()) == 2
    fns = {name: kernel_cache.load_kernel(k.source, k.function, interpret=False) for name, k in kernels.items()}
    predictions = predict_launches(state.graph, state.plan, kernels, state.example_inputs)
    assert not any(isinstance(p, Unpredicted) for p in predictions.values())
    ready = triton_ahead.compile_ahead(kernels, fns, predictions, target=triton_ahead.Target("cuda", 90, 32))
    assert set(ready) == set(kernels)
    for name, (_, loaders) in ready.items():
        assert len(loaders) == 1  # the default config: nothing is tuned outside max-autotune
        for loader in loaders:
            if loader.future is not None:
                reply = compile_pool.wait(loader.future)
                assert reply["ok"], (name, reply, kernels[name].source)
            entry = binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
            binary = triton_ahead.load_compiled(loader.fn, loader.spec, entry)
            assert binary.kernel[:4] == b"\x7fELF"  # a cubin
    atomics = [k.source for k in kernels.values() if k.kind == "scatter"]
    assert all("tl.atomic_add(" in source for source in atomics)
    assert any("tl.int64" in source.split("tl.atomic_add(")[1] for source in atomics)  # the counts


# -- crowded rows -------------------------------------------------------------------------------------
@pytest.mark.parametrize("device, index_shape, rows, crowded", [
    ("cuda", (512, 512), 32, True),  # T5's relative position buckets: 8192 indices a row
    ("cuda", (16, 512), 2, True),  # BERT's token types
    ("cuda", (16, 512), 30522, False),  # BERT's words
    ("cpu", (512, 512), 32, False),  # the C++ target and the interpreter add without contention
])
def test_gpu_embedding_backward_with_crowded_rows_stays_aten(device, index_shape, rows, crowded):
    from types import SimpleNamespace

    from torchfuse.lowering.rules.scatter import _crowded_rows

    indices = SimpleNamespace(shape=index_shape, rank=len(index_shape))
    reason = _crowded_rows(torch.device(device), indices, rows)
    assert (reason is not None) == crowded
    if crowded:
        assert "sort-based" in reason and f"{rows} rows" in reason


@pytest.mark.gpu
def test_t5_relative_position_bias_backward_on_gpu_runs_atens_kernel():
    torch.manual_seed(0)
    buckets = torch.randint(0, 32, (512, 512), device="cuda")
    grad = torch.randn(512, 512, 8, device="cuda")
    fn = embedding_backward(32)
    actual = torchfuse.compile(fn, options={"strict": True})(grad, buckets)
    assert_close(actual, fn(grad, buckets), reference=fn(grad.double(), buckets))
    assert "scatter" not in kernel_kinds()
    assert any("embedding_dense_backward" in op for op in fallbacks()), fallbacks()
