"""mode="reduce-overhead": the CUDA-graph runner's bookkeeping (runtime/cudagraphs.py).

On CPU the runner records CPU tensors with a stand-in recorder that behaves as a CUDA graph
does where it matters here: a replay recomputes from the addresses it recorded (the same input
tensors) and writes its outputs into the same memory. The GPU tests at the end use real CUDA
graphs through torchfuse.compile.
"""
from __future__ import annotations

import collections
import gc
import warnings

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from torch._functorch.aot_autograd import make_boxed_func

from torchfuse.pipeline import _reads_on_host
from torchfuse.frontend.aot import aot_backend, mutated_inputs, saved_outputs_start, static_inputs
from torchfuse.runtime.cudagraphs import ALIASED_OUTPUT_BYTES, MAX_LAYOUTS, CudaGraphRunner, GraphIO


class StandInGraph:
    def __init__(self, run, inputs, outputs) -> None:
        self.run, self.inputs, self.outputs = run, inputs, outputs
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for static, fresh in zip(self.outputs, self.run(list(self.inputs))):
            if isinstance(static, torch.Tensor):
                static.copy_(fresh)


class StandInRecorder:
    """Records by running once; replays rerun on the recorded tensors into the same outputs."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.graphs: list[StandInGraph] = []

    def record(self, run, inputs):
        if self.fail is not None:
            raise self.fail
        outputs = list(run(list(inputs)))
        self.graphs.append(StandInGraph(run, list(inputs), outputs))
        return self.graphs[-1], outputs


def boxed(fn):
    def call(args: list):
        values = list(args)
        args.clear()
        return list(fn(*values))

    return call


def runner(fn, io: GraphIO | None = None, recorder=None, **kwargs) -> tuple[CudaGraphRunner, collections.Counter]:
    stats: collections.Counter = collections.Counter()
    run = CudaGraphRunner(boxed(fn), io or GraphIO(), stats, recorder or StandInRecorder(), device_type="cpu",
                          pool_storages=set(), **kwargs)
    return run, stats


def scale_add(x, w):
    return (x * w, x + w)


def test_warm_up_then_record_then_replay_with_new_input_values():
    run, stats = runner(scale_add, GraphIO(static_inputs=frozenset({1})))  # w is the parameter
    w = torch.randn(5, dtype=torch.float64)
    for step in range(5):
        x = torch.randn(5, dtype=torch.float64)  # a new tensor each call: copied in
        out = run([x, w])
        torch.testing.assert_close(out[0], x * w, rtol=0, atol=0)
        torch.testing.assert_close(out[1], x + w, rtol=0, atol=0)
    assert stats["default path: warm-up (first call of an input shape)"] == 1
    assert stats["recorded"] == 1 and stats["replayed"] == 4
    assert set(run.layouts[()].recording.copied) == {0}


def test_a_static_input_changed_in_place_is_read_at_replay():
    run, _ = runner(scale_add)
    x, w = torch.randn(4), torch.randn(4)
    run([x, w])
    run([x, w])  # recorded: x and w kept their addresses, both static
    recording = run.layouts[()].recording
    assert set(recording.static_ptrs) == {0, 1} and not recording.copied
    w.mul_(3)  # an optimizer step between calls
    x.copy_(torch.randn(4))
    out = run([x, w])
    torch.testing.assert_close(out[0], x * w)


def test_outputs_of_one_call_are_not_overwritten_by_the_next():
    run, _ = runner(scale_add)
    w = torch.randn(6)
    outputs = [run([torch.randn(6), w]) for _ in range(4)]
    values = [o[0].clone() for o in outputs]
    run([torch.randn(6), w])
    for kept, value in zip(outputs, values):
        assert torch.equal(kept[0], value)


def _big_and_small(x):
    return (x * 2, x.sum())


def test_large_outputs_are_handed_over_the_recording_and_guarded_before_a_replay_overwrites_them():
    guarded = []
    run, _ = runner(_big_and_small, GraphIO(static_inputs=frozenset()),  # x is a new batch each call
                    access_guard=lambda storage, message: guarded.append((storage._cdata, message)))
    n = ALIASED_OUTPUT_BYTES // 4  # float32 elements
    run([torch.randn(n)])  # warm-up
    x = torch.randn(n)
    big, small = run([x])  # recorded and replayed
    recording = run.layouts[()].recording
    assert big.data_ptr() == recording.outputs[0].data_ptr()  # no copy of the large output
    assert small.data_ptr() != recording.outputs[1].data_ptr()  # the small one is cloned
    torch.testing.assert_close(big, x * 2, rtol=0, atol=0)
    assert guarded == []
    kept_storage = big.untyped_storage()._cdata
    run([torch.randn(n)])  # this replay overwrites big's memory: its storage is guarded first
    assert [cdata for cdata, _ in guarded] == [kept_storage] and "clone" in guarded[0][1]
    assert recording.outputs[0].untyped_storage()._cdata != kept_storage  # ours stays readable


def test_outputs_over_a_dropped_recording_are_guarded():
    guarded = []
    run, _ = runner(_big_and_small, GraphIO(static_inputs=frozenset()),
                    access_guard=lambda storage, message: guarded.append(storage._cdata))
    n = ALIASED_OUTPUT_BYTES // 4
    run([torch.randn(n)])
    big, _ = run([torch.randn(n)])
    del run
    gc.collect()
    assert guarded == [big.untyped_storage()._cdata]


def test_mutated_copied_input_is_written_back():
    def step(param, grad):
        param.sub_(0.1 * grad)
        return (param.sum(),)

    run, stats = runner(step, GraphIO(mutated_inputs=frozenset({0})))
    reference = torch.randn(8, dtype=torch.float64)
    for _ in range(4):
        param = reference.clone()  # a new address each call: copied in, and back out
        grad = torch.randn(8, dtype=torch.float64)
        out = run([param, grad])
        torch.testing.assert_close(param, reference - 0.1 * grad)
        torch.testing.assert_close(out[0], param.sum())
    assert stats["replayed"] == 3


def test_saved_outputs_alive_at_the_next_call_run_the_default_path():
    def forward(x, w):
        hidden = x * w
        return (hidden.sum(), hidden)  # output 1 is saved for the backward

    run, stats = runner(forward, GraphIO(saved_outputs_from=1))
    w = torch.randn(5)
    run([torch.randn(5), w])
    first = run([torch.randn(5), w])  # recorded: output 1 is an alias of the recording's memory
    kept = first[1].clone()
    second = run([torch.randn(5), w])  # first[1] still alive: must not be overwritten
    assert torch.equal(first[1], kept)
    assert stats["default path: outputs of the previous call are still in use "
                 "(a second forward before the backward of the first)"] == 1
    del first, second
    x = torch.randn(5)
    third = run([x, w])  # nothing alive: a replay again
    torch.testing.assert_close(third[1], x * w)
    assert stats["replayed"] == 2


def test_a_view_of_a_saved_output_counts_as_alive():
    run, stats = runner(lambda x: (x.sum(), x * 2), GraphIO(saved_outputs_from=1))
    run([torch.randn(6)])
    view = run([torch.randn(6)])[1][2:]
    expected = view.clone()
    run([torch.randn(6)])
    assert torch.equal(view, expected)
    assert stats["replayed"] == 1


def test_gradients_dropped_before_the_next_call_are_aliases():
    """A backward graph's outputs are handed out in the recording's memory while the user drops
    them before the next call (``zero_grad()``'s default): no clone, every call after the
    warm-up replayed."""
    run, stats = runner(lambda g, w: (g * w,), GraphIO(gradient_outputs=True))
    w = torch.randn(3)
    storages = set()
    for _ in range(5):
        g = torch.randn(3)
        grad = run([g, w])[0]
        torch.testing.assert_close(grad, g * w)
        storages.add(grad.untyped_storage().data_ptr())
        del grad
    assert stats["replayed"] == 4 and len(storages) == 2, (stats, storages)  # warm-up's, then the recording's


def test_gradients_kept_across_calls_are_never_overwritten():
    """Kept gradients (accumulation, ``zero_grad(set_to_none=False)``) stay as computed: the
    replay that would overwrite them runs the default path, and the graph is recorded again with
    its outputs cloned, then replayed."""
    run, stats = runner(lambda g, w: (g * w,), GraphIO(gradient_outputs=True))
    w = torch.randn(3)
    kept, expected = [], []
    for _ in range(6):
        g = torch.randn(3)
        kept.append(run([g, w])[0])
        expected.append(g * w)
    for grad, want in zip(kept, expected):
        torch.testing.assert_close(grad, want)
    reason = "default path: gradients of the previous call are still in use (kept across steps: recording again with them cloned)"
    assert stats[reason] == 1 and stats["recorded"] == 2 and stats["replayed"] == 4, stats
    assert len({g.untyped_storage().data_ptr() for g in kept}) == 6


def test_a_static_input_that_moves_runs_default_then_is_recorded_again_as_copied():
    run, stats = runner(scale_add)
    x, w = torch.randn(4), torch.randn(4)
    run([x, w])
    run([x, w])  # x recorded as static
    for _ in range(3):
        x = torch.randn(4)  # moved
        torch.testing.assert_close(run([x, w])[0], x * w)
    layout = run.layouts[()]
    assert 0 in layout.recording.copied and 1 in layout.recording.static_ptrs
    assert stats["default path: a static input moved"] == 1
    assert stats["default path: a static input moved (recording again with it copied)"] == 1
    assert stats["recorded"] == 2


def test_a_batch_at_the_warm_ups_address_is_copied_when_aot_names_the_parameters():
    """The caching allocator often gives each step's fresh batch the same address; known
    parameter positions keep that batch from being recorded as static (and then moving)."""
    run, stats = runner(scale_add, GraphIO(static_inputs=frozenset({1})))
    x, w = torch.randn(4), torch.randn(4)
    run([x, w])
    run([x, w])  # x at the warm-up's address, yet not a parameter: copied
    recording = run.layouts[()].recording
    assert set(recording.copied) == {0} and set(recording.static_ptrs) == {1}
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(run([x, w])[0], x * w)
    assert stats["recorded"] == 1 and stats["replayed"] == 4, stats


def test_a_backward_reads_in_place_only_what_a_recording_returned():
    """A backward's inputs at the warm-up's address are not taken as static: the batch its
    forward saved is a clone made every call, which sat at the warm-up's address by chance on
    the H100 and then moved on every replay. A saved tensor in a recording's memory (here, a
    storage the runner was told a recording returned) is read in place."""
    pool: set[int] = set()
    stats: collections.Counter = collections.Counter()
    run = CudaGraphRunner(boxed(lambda g, x, w: (g * x * w,)), GraphIO(gradient_outputs=True), stats,
                          StandInRecorder(), device_type="cpu", pool_storages=pool)
    saved_w = torch.randn(4)
    pool.add(saved_w.untyped_storage().data_ptr())
    g, x = torch.randn(4), torch.randn(4)
    run([g, x, saved_w])
    run([g, x, saved_w])  # g and x at the warm-up's addresses: still copied
    recording = run.layouts[()].recording
    assert set(recording.copied) == {0, 1} and set(recording.static_ptrs) == {2}
    for _ in range(3):
        g, x = torch.randn(4), torch.randn(4)
        torch.testing.assert_close(run([g, x, saved_w])[0], g * x * saved_w)
    assert stats["recorded"] == 1 and stats["replayed"] == 4 and not any("moved" in r for r in stats), stats


def test_one_recording_per_input_shape_and_a_limit():
    run, stats = runner(lambda x: (x + 1,), shape_generic=True)
    for n in range(1, MAX_LAYOUTS + 3):
        for _ in range(3):
            x = torch.randn(n)
            torch.testing.assert_close(run([x])[0], x + 1)
    assert stats["recorded"] == MAX_LAYOUTS
    assert stats["default path: too many input shapes"] == 2 * 3


def test_a_failed_recording_runs_the_default_path_with_the_reason():
    recorder = StandInRecorder(fail=RuntimeError("operation not permitted when stream is capturing"))
    run, stats = runner(scale_add, recorder=recorder)
    w = torch.randn(3)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(run([x, w])[0], x * w)
    assert stats["default path: recording failed (RuntimeError: operation not permitted when stream is capturing)"] == 2


def test_inputs_of_another_device_are_not_recorded():
    stats: collections.Counter = collections.Counter()
    run = CudaGraphRunner(boxed(scale_add), GraphIO(), stats, StandInRecorder(), device_type="cuda")
    for _ in range(3):
        run([torch.randn(2), torch.randn(2)])
    assert stats["default path: an input is a cpu tensor (a replay would not see its new values)"] == 2


def test_mutated_inputs_found_in_aten_graphs_also_through_a_view():
    def direct(p, g):
        return p.sub_(g)

    def through_view(p, g):
        p.view(-1).add_(g)
        return p * 2

    assert mutated_inputs(make_fx(direct)(torch.randn(4), torch.randn(4))) == frozenset({0})
    assert mutated_inputs(make_fx(through_view)(torch.randn(2, 2), torch.randn(4))) == frozenset({0})
    assert mutated_inputs(make_fx(lambda p, g: p + g)(torch.randn(4), torch.randn(4))) == frozenset()


def test_forward_graphs_know_where_their_saved_outputs_start():
    seen = {}

    def compile_graph(gm, example_inputs, kind):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        seen[kind] = (saved_outputs_start(kind), len(outputs))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_backend(compile_graph, lambda gm, error=None: gm.forward, strict=True)
    f = torch.compile(lambda x, w: (x * w).sin().sum(), backend=backend)
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    f(x, w).backward()
    start, outputs = seen["forward"]
    assert start == 1 and outputs > 1  # the loss, then what the backward needs
    assert seen["backward"][0] is None


def test_forward_and_inference_graphs_know_their_parameters():
    seen = {}

    def compile_graph(gm, example_inputs, kind):
        seen[kind] = (static_inputs(kind, len(example_inputs)), [tuple(x.shape) for x in example_inputs])
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_backend(compile_graph, lambda gm, error=None: gm.forward, strict=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16))
    compiled = torch.compile(model, backend=backend)
    compiled(torch.randn(5, 8)).sum().backward()
    model.eval()
    with torch.no_grad():
        compiled(torch.randn(5, 8))
    for kind in ("forward", "inference"):
        static, shapes = seen[kind]
        batch = shapes.index((5, 8))
        assert batch not in static and len(static) == len(shapes) - 1, (kind, static, shapes)
    assert seen["backward"][0] is None  # its metadata describes the forward's inputs


def test_reduce_overhead_on_cpu_says_why_no_graphs_and_runs():
    torchfuse.reset()

    def f(x):
        return torch.relu(x) * 2

    compiled = torchfuse.compile(f, mode="reduce-overhead")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reduce-overhead is implemented: no warning
        x = torch.randn(16)
        torch.testing.assert_close(compiled(x), f(x))
    graph = torchfuse.report().graphs[-1]
    assert graph.cudagraphs["not used: the graph does not run on a CUDA device"] == 1
    assert "CUDA graphs: not used" in str(graph)


def test_ops_that_read_gpu_data_on_the_host_are_known_by_their_tags():
    assert _reads_on_host("aten.nonzero.default") and _reads_on_host("aten.masked_select.default")
    assert not _reads_on_host("aten.mm.default") and not _reads_on_host("not an op")


def test_torch_compile_with_the_backend_name_passes_the_mode():
    torchfuse.reset()
    compiled = torch.compile(lambda x: x * 2, backend="torchfuse", mode="reduce-overhead")
    compiled(torch.randn(4))
    assert "not used: the graph does not run on a CUDA device" in torchfuse.report().graphs[-1].cudagraphs


# -- on a GPU: real CUDA graphs --------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _graph_counts() -> collections.Counter:
    total: collections.Counter = collections.Counter()
    for graph in torchfuse.report().graphs:
        total.update(graph.cudagraphs)
    return total


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.norm = torch.nn.BatchNorm1d(128)  # running statistics: mutated buffers
        self.drop = torch.nn.Dropout(0.1)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


def _train(mode: str, steps: int, set_to_none: bool = True, micro_batches: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    model = _Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compiled = torchfuse.compile(model, mode=mode)
    data = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        for _ in range(micro_batches):  # more than one: gradients accumulate in .grad
            x = torch.randn(32, 64, device="cuda", generator=data)
            y = torch.randint(0, 10, (32,), device="cuda", generator=data)
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            losses.append(loss.detach())
        optimizer.step()
    return torch.stack(losses), model


@cuda
@pytest.mark.gpu
def test_training_loop_with_dropout_batchnorm_and_optimizer_matches_default_mode():
    torchfuse.reset()
    default_losses, default_model = _train("default", 6)
    torchfuse.reset()
    graph_losses, graph_model = _train("reduce-overhead", 6)
    counts = _graph_counts()
    assert counts["replayed"] >= 6, counts  # forward and backward replayed from the third step
    assert torch.equal(graph_losses, default_losses)  # same kernels, same RNG: bitwise
    for a, b in zip(graph_model.state_dict().values(), default_model.state_dict().values()):
        assert torch.equal(a, b)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("set_to_none,micro_batches", [(False, 1), (True, 2)])
def test_gradients_kept_across_backwards_keep_the_training_loop_exact(set_to_none, micro_batches):
    """``zero_grad(set_to_none=False)``: ``.grad`` is the warm-up's memory, and each replay's
    gradients are added into it. Gradient accumulation: the first micro-batch's gradients (a
    replay's memory, taken as ``.grad``) are alive at the second backward, which therefore runs
    the default path and records again with cloned outputs. Every loss and weight equals
    default mode's."""
    torchfuse.reset()
    default_losses, default_model = _train("default", 6, set_to_none, micro_batches)
    torchfuse.reset()
    graph_losses, graph_model = _train("reduce-overhead", 6, set_to_none, micro_batches)
    counts = _graph_counts()
    if micro_batches > 1:
        assert any("gradients of the previous call are still in use" in reason for reason in counts), counts
    else:
        assert not any("moved" in reason for reason in counts), counts
    assert torch.equal(graph_losses, default_losses)
    for a, b in zip(graph_model.state_dict().values(), default_model.state_dict().values()):
        assert torch.equal(a, b)


@cuda
@pytest.mark.gpu
def test_outputs_kept_across_calls_and_new_shapes_with_dynamic():
    torchfuse.reset()
    compiled = torchfuse.compile(lambda x: torch.tanh(x) * 3, mode="reduce-overhead", dynamic=True)
    kept, expected = [], []
    for n in (64, 64, 64, 96, 96, 96, 64):
        x = torch.randn(n, device="cuda")
        kept.append(compiled(x))
        expected.append(torch.tanh(x) * 3)
    for out, ref in zip(kept, expected):
        torch.testing.assert_close(out, ref)
    counts = _graph_counts()
    assert counts["recorded"] == 2 and counts["replayed"] >= 3, counts


@cuda
@pytest.mark.gpu
def test_a_large_output_kept_across_calls_raises_a_clear_error_and_clones_stay_right():
    torchfuse.reset()
    compiled = torchfuse.compile(lambda x: (torch.tanh(x) * 3, x.sum()), mode="reduce-overhead")
    n = ALIASED_OUTPUT_BYTES // 4
    xs = [torch.randn(n, device="cuda") for _ in range(4)]
    results = [compiled(x) for x in xs]  # warm-up, record, replay, replay
    cloned = compiled(xs[0])[0].clone()
    last, _ = results[-1]
    with pytest.raises(RuntimeError, match="clone outputs you keep across calls"):
        last[:10].sum().item()  # overwritten by the call above: a view of it raises too
    for x, (_, total) in zip(xs, results):  # small outputs are copies: all still right
        # A float32 sum of millions of terms: its rounding scales with the terms, not the result
        # (eager's and ours differ by ~2e-6 of the result on the H100).
        torch.testing.assert_close(total.double(), x.double().sum(), rtol=0, atol=1e-6 * x.abs().sum().item())
    torch.testing.assert_close(cloned, torch.tanh(xs[0]) * 3)
    fresh, _ = compiled(xs[1])
    torch.testing.assert_close(fresh, torch.tanh(xs[1]) * 3)  # the newest output reads fine


@cuda
@pytest.mark.gpu
def test_a_sync_inside_the_graph_runs_the_default_path_with_the_reason():
    # An op the graph keeps as an ATen call that reads a value on the host (as nonzero or
    # .item() do): recording it fails, and every call runs the default path, correctly.
    @torch.library.custom_op("torchfuse_test::scale_by_host_sum", mutates_args=())
    def scale_by_host_sum(x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum().item())

    @scale_by_host_sum.register_fake
    def _(x):
        return torch.empty_like(x)

    torchfuse.reset()
    compiled = torchfuse.compile(lambda x: scale_by_host_sum(x.relu()) + 1, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        torch.testing.assert_close(compiled(x), scale_by_host_sum(x.relu()) + 1)
    counts = _graph_counts()
    assert any(reason.startswith("default path: recording failed") for reason in counts), counts
    assert counts["replayed"] == 0, counts
