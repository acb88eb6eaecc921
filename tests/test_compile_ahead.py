"""Compiling GPU kernels ahead (runtime/triton_ahead.py, compile_pool.py, compile_worker.py, predict.py).

Triton compiles for a CUDA target without a GPU, so on CPU the worker pool really compiles (for
sm_90) and the binary cache really fills; only launching needs the GPU test at the end."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from conftest import compile_strict
from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.runtime import binary_cache, compile_pool, kernel_cache, launch, launch_configs, triton_ahead
from torchfuse.runtime.launch import Launcher, PointerArg, predicted_key
from torchfuse.runtime.predict import PredictedLaunch, Unpredicted, predict_launches

triton = pytest.importorskip("triton")
H100 = triton_ahead.Target("cuda", 90, 32)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "2")


def _kernel(scale: float, name: str = "kernel0") -> tuple[TritonKernel, object]:
    function = f"tf_poi_test{str(scale).replace('.', '_')}"
    source = (f"@jit\ndef {function}(ptr0, ptr1, xnumel, XBLOCK: tl.constexpr):\n"
              "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
              "    xmask = xindex < xnumel\n"
              "    x = tl.load(ptr0 + xindex, xmask).to(tl.float32)\n"
              f"    tl.store(ptr1 + xindex, tl.sigmoid(x) * {scale}, xmask)\n")
    kernel = TritonKernel(name, source, ["a", "b"], [], 4096, 0, "pointwise", False, function=function)
    return kernel, kernel_cache.load_kernel(source, function, interpret=False)


LAUNCH = PredictedLaunch(4096, 0, (PointerArg(torch.float16, True), PointerArg(torch.float32, True)))


def _compile(kernel, fn, launch_=LAUNCH):
    ready = triton_ahead.compile_ahead({kernel.name: kernel}, {kernel.name: fn}, {kernel.name: launch_}, target=H100)
    _, (loader,) = ready[kernel.name]
    if loader.future is not None:
        assert compile_pool.wait(loader.future)["ok"], loader.future.result()
    return loader


def _load(loader):
    entry = binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
    assert entry is not None
    return triton_ahead.load_compiled(loader.fn, loader.spec, entry)


def test_workers_are_light_processes():
    """A worker imports Triton, never torch or torchfuse's compiler (3.4 s against 0.25 s)."""
    replies = compile_pool.get_pool().ping()
    assert replies and all(r["ok"] and not r["torch_loaded"] for r in replies)
    assert len({r["pid"] for r in replies}) == len(replies) and os.getpid() not in {r["pid"] for r in replies}


def test_a_kernel_compiles_in_a_worker_and_loads_from_the_cache():
    kernel, fn = _kernel(2.0)
    before = triton_ahead.stats.compiled
    loader = _compile(kernel, fn)
    assert triton_ahead.stats.compiled == before + 1
    compiled = _load(loader)
    assert compiled.metadata.target.arch == 90 and compiled.kernel[:4] == b"\x7fELF"  # a cubin
    assert compiled.metadata.num_warps == launch_configs.pointwise_config(4096).num_warps
    # Compiled again (another graph, another process): found on disk, no worker involved.
    from_disk = triton_ahead.stats.from_disk
    again = _compile(kernel, fn)
    assert again.key == loader.key and again.future is None and triton_ahead.stats.from_disk == from_disk + 1


def test_identical_jobs_compile_once():
    kernel, fn = _kernel(3.0)
    other, _ = _kernel(3.0, name="kernel7")  # the same source in another graph or layer
    pool = compile_pool.get_pool()
    shared = compile_pool.stats.shared
    ready = triton_ahead.compile_ahead({kernel.name: kernel, other.name: other}, {kernel.name: fn, other.name: fn},
                                       {kernel.name: LAUNCH, other.name: LAUNCH}, target=H100)
    futures = {loader.future for _, (loader,) in ready.values()}
    assert len(futures) == 1 and compile_pool.stats.shared == shared + 1
    job = {"kind": "triton", "key": ready[kernel.name][1][0].key, "root": str(triton_ahead.binaries_root())}
    assert pool.submit(job) in futures


def test_a_new_cache_directory_gets_its_own_binary(tmp_path, monkeypatch):
    """The cache directory changed within the process (a test, a user's setting): the same
    kernel compiled again is written into the new directory, not answered by the old job."""
    kernel, fn = _kernel(3.5)
    first = _compile(kernel, fn)
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert binary_cache.lookup(triton_ahead.binaries_root(), first.key) is None
    second = _compile(kernel, fn)
    assert second.key == first.key and second.future is not first.future
    assert _load(second).kernel[:4] == b"\x7fELF"  # a cubin, in the new directory


def test_a_corrupt_binary_is_rebuilt_not_loaded():
    kernel, fn = _kernel(4.0)
    loader = _compile(kernel, fn)
    entry = binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
    cubin = next(path for name, path in entry.files.items() if name.endswith(".cubin"))
    cubin.write_bytes(cubin.read_bytes()[:-64])  # truncated
    assert binary_cache.lookup(triton_ahead.binaries_root(), loader.key) is None  # detected, deleted
    compile_pool.shutdown_pool()  # a later process: no memory of the first compile
    rebuilt = _compile(kernel, fn)
    assert rebuilt.future is not None  # compiled again by a worker
    assert _load(rebuilt).kernel == _load(loader).kernel  # the same binary as the first time


def test_the_key_follows_the_target_and_the_specialization():
    kernel, fn = _kernel(5.0)
    spec = triton_ahead.specialize(fn, kernel, LAUNCH, H100)
    source = kernel_cache.module_source(kernel.source)
    key = triton_ahead.binary_key(source, kernel.function, spec, H100)
    assert key == triton_ahead.binary_key(source, kernel.function, spec, H100)
    assert key != triton_ahead.binary_key(source, kernel.function, spec, triton_ahead.Target("cuda", 80, 32))
    misaligned = PredictedLaunch(4096, 0, (PointerArg(torch.float16, False), PointerArg(torch.float32, True)))
    assert key != triton_ahead.binary_key(source, kernel.function, triton_ahead.specialize(fn, kernel, misaligned, H100),
                                          H100)
    other_size = PredictedLaunch(4095, 0, LAUNCH.args)  # xnumel loses its divisibility by 16
    assert key != triton_ahead.binary_key(source, kernel.function, triton_ahead.specialize(fn, kernel, other_size, H100),
                                          H100)


@pytest.mark.parametrize("offset,numel", [(0, 4096), (1, 4096), (8, 4095), (0, 1)])
def test_a_prediction_specializes_like_the_real_tensors(offset, numel):
    """Triton's specializer sees a PointerArg as it sees the tensor it stands for, and the
    launcher's key for the real arguments is the predicted one."""
    kernel, fn = _kernel(6.0)
    x = torch.zeros(numel + 64, dtype=torch.float16)[offset:offset + numel]
    out = torch.zeros(numel)
    predicted = PredictedLaunch(numel, 0, (PointerArg(torch.float16, offset * 2 % 16 == 0), PointerArg(torch.float32, True)))
    spec = triton_ahead.specialize(fn, kernel, predicted, H100)
    real = PredictedLaunch(numel, 0, (x, out))  # Triton's binder reads data_ptr() and dtype alike
    assert triton_ahead.specialize(fn, kernel, real, H100) == spec
    assert predicted_key(numel, 0, predicted.args) == (numel, 0, *[launch._specialization(a) for a in (x, out)])


def test_a_failed_compile_leaves_the_kernel_to_triton():
    kernel, fn = _kernel(7.0)
    broken = TritonKernel("kernel0", kernel.source.replace("tl.sigmoid", "tl.no_such_function"), ["a", "b"], [], 4096, 0,
                          "pointwise", False, function=kernel.function)
    broken_fn = kernel_cache.load_kernel(broken.source, broken.function, interpret=False)
    ready = triton_ahead.compile_ahead({"kernel0": broken}, {"kernel0": broken_fn}, {"kernel0": LAUNCH}, target=H100)
    _, (loader,) = ready["kernel0"]
    failed = triton_ahead.stats.failed
    loader.target_now = lambda: H100
    assert loader() is None and triton_ahead.stats.failed == failed + 1
    assert "no_such_function" in triton_ahead.stats.errors[-1]


def test_a_worker_that_dies_fails_its_job_and_is_replaced():
    pool = compile_pool.get_pool()
    victim = pool.ping()[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    # One ping per worker (``ping``'s barrier): the victim's feeder learns of the death there.
    # (Jobs sent one by one may all go to the live workers: the H200's 16 cores did that.)
    replies = pool.ping()
    failed = [r for r in replies if not r["ok"]]
    assert len(failed) == 1 and "died" in failed[0]["error"], replies
    assert all(r["ok"] for r in pool.ping())  # every worker answers again
    assert victim not in {r["pid"] for r in pool.ping()}


def test_unpredictable_launches_are_left_to_triton_and_said_so():
    """Symbolic sizes are not predicted (a CPU graph's Triton kernels are rendered the same way)."""
    import torchfuse

    torchfuse.reset()
    fn = compile_strict(lambda x: torch.sigmoid(x) * 2, dynamic=True, options={"target": "triton"})
    fn(torch.randn(33))
    graph = torchfuse.report().graphs[-1]
    assert graph.binaries == {}  # CPU tensors: Triton's interpreter, nothing to compile


def test_the_launcher_uses_a_binary_compiled_ahead_without_triton():
    from test_launch import FakeCompiled, FakeJit

    fn = FakeJit()
    compiled = FakeCompiled()
    loads = []
    launcher = Launcher(fn, "pointwise", direct=True, current_device=lambda: 0, current_stream=lambda device: 9)
    launcher.prepare(LAUNCH.xnumel, 0, LAUNCH.args, lambda: loads.append(1) or compiled)
    x, out = torch.zeros(4096, dtype=torch.float16), torch.zeros(4096)
    ahead = launch.stats.ahead
    launcher(4096, 0, x, out)
    launcher(4096, 0, x, out)
    assert fn.launches == [] and loads == [1] and launch.stats.ahead == ahead + 1  # loaded once
    assert len(compiled.calls) == 2 and compiled.calls[0][:4] == (4, 1, 1, 9)
    launcher(4096, 0, x[1:].view(torch.float16)[:4095], out[:4095])  # another specialization: Triton
    assert len(fn.launches) == 1
    failing = Launcher(fn, "pointwise", direct=True, current_device=lambda: 0, current_stream=lambda device: 9)
    failing.prepare(LAUNCH.xnumel, 0, LAUNCH.args, lambda: None)  # the worker failed
    failing(4096, 0, x, out)
    assert len(fn.launches) == 2  # Triton compiled it at the launch, as before


def test_predictions_follow_the_wrapper():
    """Inputs keep their example's alignment; buffers the wrapper allocates are aligned."""
    from torchfuse.ir.graph import Buffer, Graph
    from torchfuse.scheduler.schedule import Schedule

    graph = Graph(name="g")
    for name, dtype in (("x", torch.float16), ("y", torch.float32), ("buf0", torch.float32)):
        graph.buffers[name] = Buffer(name, (4096,), dtype, torch.device("cuda"), (1,))
    graph.inputs = [graph.buffers["x"], graph.buffers["y"]]
    kernel = TritonKernel("kernel0", "", ["x", "y", "buf0"], [], 4096, 0, "pointwise", False, function="f")
    base = torch.empty(5000, dtype=torch.float16, device="meta")
    examples = [base[3:4099], torch.empty(4096, device="meta")]
    plan = Schedule(items=[], decisions=[])
    predicted = predict_launches(graph, plan, {"kernel0": kernel}, examples)["kernel0"]
    assert predicted == PredictedLaunch(4096, 0, (PointerArg(torch.float16, False), PointerArg(torch.float32, True),
                                                  PointerArg(torch.float32, True)))
    import sympy

    dynamic = TritonKernel("kernel1", "", ["y"], [sympy.Symbol("s0")], sympy.Symbol("s0"), 0, "pointwise", False)
    assert isinstance(predict_launches(graph, plan, {"kernel1": dynamic}, examples)["kernel1"], Unpredicted)


@pytest.mark.gpu
def test_gpu_first_run_launches_binaries_compiled_ahead():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fn = compile_strict(lambda x, y: (torch.sigmoid(x) * y).sum(-1) + torch.tanh(y).sum())
    x, y = torch.randn(300, 500, device="cuda"), torch.randn(500, device="cuda")
    through_triton, ahead = launch.stats.through_triton, launch.stats.ahead
    torch.testing.assert_close(fn(x, y), (torch.sigmoid(x) * y).sum(-1) + torch.tanh(y).sum())
    assert launch.stats.ahead > ahead and launch.stats.through_triton == through_triton


def test_waiting_shows_progress_only_on_a_terminal(monkeypatch):
    import threading
    from concurrent.futures import Future

    from torchfuse.runtime import progress

    def later(value):
        future: Future = Future()
        threading.Timer(0.3, future.set_result, (value,)).start()
        return future

    assert not progress.wanted()  # pytest captures stderr: not a terminal, nothing is drawn
    assert progress.wait(later(1), lambda: "never drawn") == 1
    monkeypatch.setattr(progress, "wanted", lambda: True)
    monkeypatch.setattr(progress, "SHOW_AFTER_SECONDS", 0.05)
    described = []
    assert progress.wait(later(2), lambda: described.append(1) or "torchfuse: compiling") == 2
    assert described  # the line was drawn (and refreshed) while waiting


def test_a_graphs_real_kernels_compile_ahead_for_the_gpu(monkeypatch):
    """The renderer's kernels of a real graph (a pointwise kernel, a persistent and a looped
    reduction), predicted from the graph and compiled for sm_90 by the pool, load as binaries."""
    import dataclasses

    import torchfuse
    from torchfuse import pipeline

    captured = []
    stages = pipeline.STAGES + [("spy", lambda state: captured.append(state))]
    monkeypatch.setattr(pipeline, "STAGES", stages)
    monkeypatch.setenv("TORCHFUSE_GRAPH_CACHE", "0")

    def fn(x, w, long_rows):
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w) * 2
        return torch.sigmoid(y), long_rows.sum(-1)

    # On a GPU machine the graph runs on the GPU: Triton 3.6's interpreter fails on looped
    # reductions with NumPy 2 there (`range(0, rnumel, RBLOCK)` on a 1-element array).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    compiled = torchfuse.compile(fn, options={"target": "triton", "strict": True})
    compiled(*(torch.randn(shape, device=device) for shape in [(64, 256), (256,), (4, 10000)]))
    state = captured[-1]
    kernels = {name: dataclasses.replace(k, device="cuda") for name, k in state.kernels.items()}
    fns = {name: kernel_cache.load_kernel(k.source, k.function, interpret=False) for name, k in kernels.items()}
    predictions = predict_launches(state.graph, state.plan, kernels, state.example_inputs)
    assert len(predictions) >= 2 and not any(isinstance(p, Unpredicted) for p in predictions.values())
    assert {k.persistent for k in kernels.values() if k.kind == "reduction"} == {True, False}
    ready = triton_ahead.compile_ahead(kernels, fns, predictions, target=H100)
    assert set(ready) == set(kernels)
    for name, (launch_, (loader,)) in ready.items():
        if loader.future is not None:
            reply = compile_pool.wait(loader.future)
            assert reply["ok"], reply
        binary = _load(loader)
        config = (launch_configs.pointwise_config(launch_.xnumel) if kernels[name].kind == "pointwise"
                  else launch_configs.reduction_config(kernels[name].persistent, launch_.xnumel, launch_.rnumel,
                                               kernels[name].outer))
        assert binary.metadata.num_warps == config.num_warps and binary.kernel[:4] == b"\x7fELF"


def test_with_no_workers_only_binaries_on_disk_are_used(monkeypatch):
    kernel, fn = _kernel(8.0)
    on_disk = _compile(kernel, fn)  # compiled once, stored
    compile_pool.shutdown_pool()
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "0")
    assert compile_pool.get_pool() is None
    again = triton_ahead.compile_ahead({"kernel0": kernel}, {"kernel0": fn}, {"kernel0": LAUNCH}, target=H100)
    assert again["kernel0"][1][0].key == on_disk.key and again["kernel0"][1][0].future is None
    other, other_fn = _kernel(9.0)
    failed = triton_ahead.stats.failed
    assert triton_ahead.compile_ahead({"kernel0": other}, {"kernel0": other_fn}, {"kernel0": LAUNCH}, target=H100) == {}
    assert triton_ahead.stats.failed == failed  # off is not a failure: Triton compiles at the launch
