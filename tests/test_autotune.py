"""Autotuning (mode="max-autotune"): runtime/autotune.py, autotune_configs.py, autotune_cache.py.

Without a GPU the tuner runs through Triton's interpreter: ``timer_for`` is replaced by a fake
timer (each candidate still runs, so side effects happen as in real timing) and the tiny-kernel
threshold is lowered so that small tensors get candidates. Correctness of every candidate is
checked by forcing each in turn (``pick`` replaced) and comparing with float64. The GPU test at
the end runs a model in max-autotune on CUDA against the default mode.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchfuse
from conftest import DEVICE, assert_close
from torchfuse.codegen.triton import split
from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.runtime import autotune, autotune_cache, autotune_configs, kernel_cache, launch, launch_configs
from torchfuse.runtime.autotune_configs import MAX_CANDIDATES, STAGED_CANDIDATES, candidate_configs
from torchfuse.runtime.launch import Launcher
from torchfuse.runtime.launch_configs import Config

triton = pytest.importorskip("triton")
# Masked lanes of the interpreter's tiles divide by zero (their results are never stored).
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
REPO = Path(__file__).resolve().parents[1]


class FakeTimer:
    """Runs each candidate once (its side effects happen, as in a real timer's runs) and answers
    ``speed(config)`` seconds."""

    def __init__(self, speed=lambda config: 1.0) -> None:
        self.speed = speed
        self.timed: list[Config] = []

    def __call__(self, run, config: Config) -> float:
        run()
        self.timed.append(config)
        return self.speed(config)


@pytest.fixture
def tune_on_cpu(monkeypatch, tmp_path):
    """Drive the tuner through Triton's interpreter with a fake timer and a private cache."""
    timer = FakeTimer()
    monkeypatch.setattr(autotune_configs, "TUNE_MIN_ELEMENTS", 256)
    monkeypatch.setattr(autotune, "timer_for", lambda args: timer)
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path / "cache"))
    return timer


def compile_tuned(fn, **options):
    return torchfuse.compile(fn, mode="max-autotune-no-cudagraphs",
                             options={"target": "triton", "strict": True, **options})


def autotune_entries():
    return [entry for graph in torchfuse.report().graphs for entry in graph.autotune]


# -- candidates ---------------------------------------------------------------------------------
SHAPES = [("pointwise", False, False, 100_000, 0), ("pointwise", False, False, 1 << 22, 0),
          ("reduction", True, False, 100_000, 300), ("reduction", True, False, 1000, 4096),
          ("reduction", False, False, 7, 50_000), ("reduction", False, False, 100_000, 100),
          ("reduction", True, True, 2048, 128), ("reduction", True, True, 50_000, 3),
          ("reduction", False, True, 65_536, 784), ("reduction", False, True, 768, 4096)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_candidates_start_with_the_default_and_keep_what_the_index_math_needs(shape):
    kind, persistent, outer, xnumel, rnumel = shape
    candidates = candidate_configs(*shape)
    default = (launch_configs.pointwise_config(xnumel) if kind == "pointwise"
               else launch_configs.reduction_config(persistent, xnumel, rnumel, outer))
    looped = kind == "reduction" and not persistent
    assert candidates[0] == default and 4 <= len(candidates) <= MAX_CANDIDATES + STAGED_CANDIDATES * looped
    assert len(set(candidates)) == len(candidates)
    for config in candidates:
        blocks = config.constexprs
        assert all(b >= 1 and b & (b - 1) == 0 for b in blocks), config  # tl.arange needs powers of two
        assert config.grid == launch_configs.cdiv(xnumel, blocks[0]), config  # the grid covers every row once
        assert config.grid * blocks[0] < 2**31
        if persistent:  # no loop over the row: RBLOCK must hold all of it, and stays the default's
            assert blocks[1] >= rnumel and blocks[1] == default.constexprs[1]
        # Only a row loop pipelines (its LOOP_STAGES parameter): nothing else takes stages.
        assert config.num_stages is None or (looped and config.num_stages == autotune_configs.PIPELINED_STAGES)
        if outer:
            assert blocks[0] >= min(32, launch_configs.next_power_of_2(xnumel))
    assert any(c.num_warps != default.num_warps for c in candidates)
    staged = [c for c in candidates if c.num_stages is not None]
    assert len([c for c in candidates if c.num_stages is None]) <= MAX_CANDIDATES
    assert bool(staged) == looped and len(staged) <= STAGED_CANDIDATES
    if looped:  # the default's own tile pipelined is always among them
        assert dataclasses.replace(default, num_stages=autotune_configs.PIPELINED_STAGES) in staged


def test_tiny_kernels_and_unknown_kinds_are_not_tuned():
    assert candidate_configs("pointwise", False, False, 1000, 0) == [launch_configs.pointwise_config(1000)]
    assert candidate_configs("reduction", True, False, 8, 64) == [launch_configs.reduction_config(True, 8, 64)]
    assert candidate_configs("scatter", False, False, 1 << 20, 0) == []


def main_kinds(p, s, l, o, q):
    """A pointwise kernel, inner persistent (softmax: two reductions) and looped (sum, argmax)
    reductions, outer persistent and looped column sums."""
    return torch.sigmoid(p) * 3, torch.softmax(s, -1), l.sum(-1), l.argmax(-1), o.sum(0), q.sum(0) * 2


MAIN_SHAPES = [(40, 48), (24, 100), (2, 4200), (64, 96), (300, 40)]


def split_kinds(y, z):
    """Split reductions: inner (a full sum, argmax) and outer (a column sum), two stages each."""
    return y.sum(), y.argmax(), z.sum(0)


SPLIT_SHAPES = [(64, 64), (256, 16)]


@pytest.mark.parametrize("fn, shapes", [(main_kinds, MAIN_SHAPES), (split_kinds, SPLIT_SHAPES)], ids=["main", "split"])
def test_every_candidate_computes_what_the_default_does(fn, shapes, tune_on_cpu, monkeypatch):
    """Every launch of a real graph (its defaults checked against float64), replayed with each
    candidate on the same inputs: every output element written, equal to the default's result
    (to rounding: the reduction order changes with the tile). Through Triton's interpreter here;
    on the GPU where there is one (Triton 3.6's interpreter fails on looped reductions there)."""
    monkeypatch.setattr(split, "POLICY", split.SplitPolicy(min_elements=256, min_programs=64, target_programs=8,
                                                           min_program_elements=32, outer_lanes=4))
    monkeypatch.setattr(autotune, "timer_for", lambda args: None)  # tuners keep their defaults
    launches = []
    call = Launcher.__call__

    def record(launcher, xnumel, rnumel, *args):
        launches.append((launcher, xnumel, rnumel, [a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        return call(launcher, xnumel, rnumel, *args)

    monkeypatch.setattr(Launcher, "__call__", record)
    inputs = [torch.randn(shape, device=DEVICE) for shape in shapes]
    assert_close(list(compile_tuned(fn)(*inputs)), list(fn(*inputs)),
                 reference=list(fn(*(x.double() for x in inputs))))
    tuned = 0
    for launcher, xnumel, rnumel, args in launches:
        if launcher.tuner is None:  # a combined launch: never tuned (test_combined_launches_are_not_timed)
            continue
        candidates = candidate_configs(launcher.kind, launcher.persistent, launcher.outer, xnumel, rnumel)
        tuned += len(candidates) > 1
        if DEVICE == "cpu":
            # Triton's interpreter runs a program's block with NumPy: warps and loop stages change
            # nothing it computes, so one candidate per grid and tile checks all of theirs.
            tiles = {}
            for config in candidates:  # the default first, as results[0] below
                tiles.setdefault((config.grid, config.constexprs), config)
            candidates = list(tiles.values())
        effects = launcher.tuner.effects
        results = [_run_with(launcher, config, xnumel, rnumel, args, effects) for config in candidates]
        for config, outputs in zip(candidates[1:], results[1:]):
            for got, want in zip(outputs, results[0]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{config}: {m}")
    assert tuned >= (5 if fn is main_kinds else 2), [(l.kind, x, r) for l, x, r, _ in launches]
    sources = "\n".join(k.source or "" for g in torchfuse.report().graphs for k in g.kernels)
    if fn is main_kinds:  # the kinds this test is about are all there
        assert re.search(r"for roffset in tl\.range\(0, rnumel, RBLOCK, num_stages=LOOP_STAGES\)", sources)
        for kernel in (k for g in torchfuse.report().graphs for k in g.kernels if k.source):
            # The row loop's stages are a launch parameter, which only kernels with a loop take.
            header = re.search(r"^def tf_\w+\(.*$", kernel.source, re.M).group(0)
            assert ("LOOP_STAGES: tl.constexpr" in header) == ("for roffset in" in kernel.source), header
        assert "[RBLOCK, XBLOCK]" in sources and "[XBLOCK, RBLOCK]" in sources
    else:
        assert any(g.split_reductions for g in torchfuse.report().graphs)


def _run_with(launcher, config, xnumel, rnumel, args, effects) -> list[torch.Tensor]:
    """The outputs of one launch with ``config`` on copies of ``args``; outputs it need not read
    start as NaN (or -7 for integers), so an element left unwritten cannot pass."""
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    for i in effects.written - effects.read_back:
        args[i].fill_(float("nan") if args[i].is_floating_point() else -7)
    launcher.launch_through_triton(config, xnumel, rnumel, args, binary=False)
    return [args[i] for i in sorted(effects.written)]


# -- choosing -------------------------------------------------------------------------------------
def test_the_fastest_wins_and_the_default_keeps_near_ties():
    default, other, third = Config(1, (1024,), 4), Config(1, (1024,), 8), Config(1, (2048,), 4)
    assert autotune.pick([(default, 1.0), (other, 0.5), (third, 0.7)]) == other
    assert autotune.pick([(default, 1.0), (other, 0.98)]) == default  # within the margin: noise
    assert autotune.pick([(default, 1.0), (other, 2.0)]) == default


def test_a_model_runs_with_the_fastest_candidates(tune_on_cpu):
    tune_on_cpu.speed = lambda config: 1.0 / config.num_warps  # more warps, faster
    fn = lambda x, w: (x * w).sum(-1)  # noqa: E731
    x, w = torch.randn(64, 128), torch.randn(128)
    assert_close(compile_tuned(fn)(x, w), fn(x, w))
    (entry,) = autotune_entries()
    assert entry.how == "timed" and entry.candidates == len(tune_on_cpu.timed) >= 4
    best = max(tune_on_cpu.timed, key=lambda c: c.num_warps)
    assert entry.config == autotune.describe(best) != entry.default
    assert entry.microseconds < entry.default_microseconds
    text = str(torchfuse.report())
    assert "autotune: 1 launch timed (" in text and f"{entry.kernel} [64 x 128] timed: {entry.config}" in text
    assert "autotune: 1 launch timed, 0 choices from disk" in text  # the process's compile-time split


def test_a_launch_keeps_its_choice_and_is_not_timed_again(tune_on_cpu):
    fn = lambda x: torch.sigmoid(x) * 2  # noqa: E731
    compiled = compile_tuned(fn)
    x = torch.randn(1000)
    compiled(x)
    timed = len(tune_on_cpu.timed)
    assert timed >= 2
    for _ in range(2):
        x = torch.randn(1000)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(tune_on_cpu.timed) == timed and len(autotune_entries()) == 1


def test_in_place_kernels_are_applied_once(tune_on_cpu):
    """Timing runs write a mutated input's scratch copy: the input is incremented once."""
    def fn(x, y):
        x.add_(1)
        return y * 2

    compiled = compile_tuned(fn)
    x, y = torch.randn(1024), torch.randn(512)
    before = x.clone()
    torch.testing.assert_close(compiled(x, y), y * 2)
    assert torch.equal(x, before + 1)
    graph = torchfuse.report().graphs[-1]
    assert "written in place" in graph.wrapper_source
    assert len(tune_on_cpu.timed) >= 4 and all(e.how == "timed" for e in graph.autotune)


def test_what_a_kernel_writes_is_read_from_its_source():
    source = ("@jit\ndef f(ptr0, ptr1, ptr2, ptr3, xnumel, XBLOCK: tl.constexpr):\n"
              "    a = tl.load(ptr0 + xindex, xmask)\n    b = tl.load(ptr1 + xindex, xmask)\n"
              "    tl.store(ptr1 + (xindex), a + b, xmask)\n    tl.store(ptr2 + (xindex), a, xmask)\n"
              "    tl.atomic_add(ptr3 + b.to(tl.int32), a, xmask)\n")
    assert autotune.effects_of(source) == autotune.Effects(frozenset({1, 2, 3}), frozenset({1, 3}))


def test_scratch_arguments_copy_what_timing_must_not_touch():
    effects = autotune.Effects(written=frozenset({1, 2, 3}), read_back=frozenset({3}))
    base = torch.randn(40)
    x, out_fresh, out_alias, accumulated = base[4:20], torch.empty(16), base[4:20], torch.zeros(16)
    args = (x, out_fresh, out_alias, accumulated, 16)
    scratch = autotune.scratch_arguments(args, effects)
    assert scratch[0] is x and scratch[1] is out_fresh  # read only; written but not read back
    assert scratch[2] is not out_alias and torch.equal(scratch[2], out_alias)  # shares x's memory
    assert scratch[3] is not accumulated and torch.equal(scratch[3], accumulated)  # read back
    assert scratch[4] == 16
    odd = torch.randn(41)[1:]  # 4 bytes past an aligned address: Triton specializes on that
    assert (autotune.scratch_copy(odd).data_ptr() % 16 == 0) == (odd.data_ptr() % 16 == 0)
    assert launch.specialization(tuple(scratch)) == launch.specialization(args)


# -- the direct launch path (GPU binaries), with a stand-in for Triton --------------------------
def _tuned_launcher(timer_speed, monkeypatch, tmp_path):
    from test_launch import FakeJit

    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "timer_for", lambda args: FakeTimer(timer_speed))
    source = ("@jit\ndef tf_poi_test(ptr0, ptr1, xnumel, XBLOCK: tl.constexpr):\n"
              "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
              "    tl.store(ptr1 + xindex, tl.load(ptr0 + xindex, xindex < xnumel), xindex < xnumel)\n")
    kernel = TritonKernel("kernel0", source, ["a", "b"], [], 65536, 0, "pointwise", False, function="tf_poi_test")
    fn = FakeJit()
    launcher = Launcher(fn, "pointwise", direct=True, current_device=lambda: 0, current_stream=lambda device: 3)
    choices = []
    launcher.tuner = autotune.KernelTuner("kernel0", kernel, choices.append)
    return launcher, fn, choices


def test_direct_launches_use_the_chosen_binary(monkeypatch, tmp_path):
    fast = Config(32, (2048,), 8)
    launcher, fn, choices = _tuned_launcher(lambda c: 0.5 if c == fast else 1.0, monkeypatch, tmp_path)
    x, out = torch.randn(65536), torch.empty(65536)
    launcher(65536, 0, x, out)
    candidates = candidate_configs("pointwise", False, False, 65536, 0)
    assert fast in candidates and choices[0].config == fast and choices[0].how == "timed"
    assert [launched[2]["XBLOCK"] for launched in fn.launches] == [c.constexprs[0] for c in candidates]
    chosen = fn.compiled[candidates.index(fast)]
    assert len(chosen.calls) == 2 and chosen.calls[-1][0] == 32  # a timing run, then the real launch
    launcher(65536, 0, x, out)
    assert len(fn.launches) == len(candidates) and len(chosen.calls) == 3  # no more tuning or compiling


def test_candidates_compiled_ahead_are_loaded_not_compiled(monkeypatch, tmp_path):
    from test_launch import FakeCompiled

    launcher, fn, choices = _tuned_launcher(lambda c: 1.0 / c.num_warps, monkeypatch, tmp_path)
    candidates = candidate_configs("pointwise", False, False, 65536, 0)
    binaries = {config: FakeCompiled() for config in candidates}
    args = (launch.PointerArg(torch.float32, True), launch.PointerArg(torch.float32, True))
    for config in candidates:
        launcher.prepare(65536, 0, args, lambda config=config: binaries[config], config)
    launcher(65536, 0, torch.randn(65536), torch.empty(65536))
    assert fn.launches == []  # every candidate came from the worker pool
    best = max(candidates, key=lambda c: c.num_warps)
    assert choices[0].config == best and binaries[best].calls[-1][0] == best.grid


# -- the choice cache ----------------------------------------------------------------------------
def _key(**changes) -> autotune_cache.ChoiceKey:
    fields = dict(module_digest="m" * 64, function="tf_poi_x", sizes="4096,0", specialization="((torch.float32, True),)",
                  candidates="[...]", device="NVIDIA H200:9.0:132 SMs", versions="triton 3.6.0, torch 2.11")
    fields.update(changes)
    return autotune_cache.ChoiceKey(**fields)


def test_the_choice_cache_round_trips_and_rejects_corrupt_entries(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    candidates = [Config(4, (1024,), 4), Config(4, (1024,), 8, 1)]
    key = _key()
    assert autotune_cache.lookup(key, candidates) is None
    autotune_cache.store(key, candidates[1], [(candidates[0], 2e-6), (candidates[1], 1e-6)])
    assert autotune_cache.lookup(key, candidates) == candidates[1]
    assert not list(autotune_cache.root().glob("*.tmp"))  # written through a renamed temporary file
    path = autotune_cache.path_of(key)
    for garbage in ("{not json", json.dumps({"format": "autotune-1", "key": {}, "choice": {}}),
                    path.read_text().replace('"num_warps": 8', '"num_warps": "8"'), ""):
        path.write_text(garbage)
        corrupt = autotune_cache.stats.corrupt
        assert autotune_cache.lookup(key, candidates) is None and not path.exists()
        assert autotune_cache.stats.corrupt == corrupt + 1
        autotune_cache.store(key, candidates[1], [])
    other = _key(function="tf_poi_y")  # a file at this key's path written for another key
    autotune_cache.path_of(other).write_text(path.read_text())
    assert autotune_cache.lookup(other, candidates) is None
    assert autotune_cache.lookup(key, candidates[:1]) is None  # no longer a candidate: tuned again


@pytest.mark.parametrize("field", ["module_digest", "function", "sizes", "specialization", "candidates", "device",
                                   "versions"])
def test_the_choice_key_changes_with_everything_the_choice_depends_on(field, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    candidates = [Config(4, (1024,), 4), Config(4, (1024,), 8)]
    autotune_cache.store(_key(), candidates[1], [])
    changed = _key(**{field: getattr(_key(), field) + "'"})
    assert changed.digest() != _key().digest() and autotune_cache.lookup(changed, candidates) is None


def test_a_new_compile_reads_the_choice_from_disk(tune_on_cpu):
    fn = lambda x: torch.tanh(x) * 3  # noqa: E731
    compile_tuned(fn)(torch.randn(2048))
    timed = len(tune_on_cpu.timed)
    torchfuse.reset()  # new launchers; the disk cache stays
    x = torch.randn(2048)
    torch.testing.assert_close(compile_tuned(fn)(x), fn(x))
    assert len(tune_on_cpu.timed) == timed
    assert [e.how for e in autotune_entries()] == ["from disk"]
    assert "1 from disk" in str(torchfuse.report())


SCRIPT = """
    import json, sys, torch, torchfuse
    from torchfuse.runtime import autotune, autotune_configs
    autotune_configs.TUNE_MIN_ELEMENTS = 256
    timed = []
    def timer(run, config):  # more warps, faster: a choice other than the default
        run()
        timed.append(config)
        return 1.0 / config.num_warps
    autotune.timer_for = lambda args: timer
    fn = lambda x, w, y: (x * w + 1, y.sum(0))
    torch.manual_seed(0)
    x, w, y = torch.randn(64, 128), torch.randn(128), torch.randn(64, 128)
    compiled = torchfuse.compile(fn, mode="max-autotune-no-cudagraphs", options={"target": "triton", "strict": True})
    out = compiled(x, w, y)
    for got, want in zip(out, fn(x, w, y)):
        torch.testing.assert_close(got, want)
    entries = [[e.kernel, e.config, e.how] for g in torchfuse.report().graphs for e in g.autotune]
    print(json.dumps({"timed": len(timed), "entries": entries, "autotuned": autotune.stats.timed}))
"""


def test_a_second_process_times_nothing(tmp_path):
    """The first process times the candidates and stores its choices; the second (whole-graph
    cache on as well, as users run it) reads them and times nothing."""
    script = tmp_path / "tuned.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, TORCHFUSE_CACHE_DIR=str(tmp_path / "cache"), TORCHFUSE_GRAPH_CACHE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["timed"] >= 4 and first["autotuned"] == 2 and all(how == "timed" for _, _, how in first["entries"])
    assert second["timed"] == 0 and second["autotuned"] == 0
    assert [how for _, _, how in second["entries"]] == ["from disk", "from disk"]
    assert [config for _, config, _ in second["entries"]] == [config for _, config, _ in first["entries"]]
    assert any("16 warps" in config or "8 warps" in config for _, config, _ in first["entries"])


# -- modes ---------------------------------------------------------------------------------------
def test_cpu_graphs_say_that_c_plus_plus_kernels_are_not_tuned():
    from torchfuse.runtime import cpp_build

    if not cpp_build.compiler_available():
        pytest.skip("needs a C++ compiler")
    cpp_build._warned.discard("torchfuse: autotuning (mode='max-autotune') tunes Triton kernels for GPUs only; "
                              "C++ kernels for CPU tensors run as in the default mode")
    fn = lambda x: torch.relu(x) * 2  # noqa: E731
    compiled = torchfuse.compile(fn, mode="max-autotune")
    x = torch.randn(64)
    with pytest.warns(UserWarning, match="tunes Triton kernels for GPUs only"):
        torch.testing.assert_close(compiled(x), fn(x))
    graph = torchfuse.report().graphs[-1]
    assert graph.target == "cpp" and graph.autotune and all(e.how.startswith("not tuned") for e in graph.autotune)
    assert "not tuned: C++ kernels" in str(graph)


def test_interpreted_kernels_are_not_timed_in_production():
    """Without a GPU timer (CPU tensors through Triton's interpreter) kernels keep their default."""
    fn = lambda x: torch.sigmoid(x) * 2  # noqa: E731
    x = torch.randn(1 << 15)
    torch.testing.assert_close(compile_tuned(fn)(x), fn(x))
    (entry,) = autotune_entries()
    assert entry.how.startswith("default: no timer for CPU tensors") and entry.config == entry.default


def test_compile_ahead_asks_for_the_candidates_or_the_stored_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    from torchfuse.runtime import triton_ahead
    from torchfuse.runtime.predict import PredictedLaunch, Unpredicted

    source = ("@jit\ndef tf_poi_ahead(ptr0, ptr1, xnumel, XBLOCK: tl.constexpr):\n"
              "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
              "    tl.store(ptr1 + xindex, tl.load(ptr0 + xindex, xindex < xnumel) * 2, xindex < xnumel)\n")
    big = TritonKernel("kernel0", source, ["a", "b"], [], 65536, 0, "pointwise", False, function="tf_poi_ahead")
    small = TritonKernel("kernel1", source, ["a", "b"], [], 64, 0, "pointwise", False, function="tf_poi_ahead")
    args = (launch.PointerArg(torch.float32, True), launch.PointerArg(torch.float32, True))
    predictions = {"kernel0": PredictedLaunch(65536, 0, args), "kernel1": PredictedLaunch(64, 0, args),
                   "kernel2": Unpredicted("symbolic sizes")}
    kernels = {"kernel0": big, "kernel1": small, "kernel2": big}
    monkeypatch.setattr(autotune, "device_identity", lambda device_type, index: "NVIDIA H200:9.0:132 SMs")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    wanted = autotune.configs_to_compile(kernels, predictions, triton_ahead.default_config)
    candidates = candidate_configs("pointwise", False, False, 65536, 0)
    assert wanted == {"kernel0": candidates}  # tiny and unpredicted kernels compile their default only
    tuner = autotune.KernelTuner("kernel0", big)
    key = tuner.choice_key(65536, 0, launch.predicted_key(65536, 0, args)[2:], candidates, "NVIDIA H200:9.0:132 SMs")
    autotune_cache.store(key, candidates[2], [])
    assert autotune.configs_to_compile(kernels, predictions, triton_ahead.default_config) == {"kernel0": [candidates[2]]}


def test_compile_ahead_builds_every_candidate_for_the_gpu(monkeypatch, tmp_path):
    """The worker pool compiles each candidate for sm_90 (no GPU needed), with its warps."""
    from torchfuse.runtime import compile_pool, triton_ahead
    from torchfuse.runtime.predict import PredictedLaunch

    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "2")
    source = ("@jit\ndef tf_red_ahead(ptr0, ptr1, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, "
              "LOOP_STAGES: tl.constexpr):\n"
              "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]\n"
              "    xmask = xindex < xnumel\n"
              "    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)\n"
              "    for roffset in tl.range(0, rnumel, RBLOCK, num_stages=LOOP_STAGES):\n"
              "        rindex = roffset + tl.arange(0, RBLOCK)[None, :]\n"
              "        acc = acc + tl.load(ptr0 + xindex * rnumel + rindex, xmask & (rindex < rnumel), other=0.0)\n"
              "    tl.store(ptr1 + xindex, tl.sum(acc, 1)[:, None], xmask)\n")
    kernel = TritonKernel("kernel0", source, ["a", "b"], [], 64, 10000, "reduction", False, function="tf_red_ahead")
    fn = kernel_cache.load_kernel(source, kernel.function, interpret=False)
    args = (launch.PointerArg(torch.float32, True), launch.PointerArg(torch.float32, True))
    prediction = PredictedLaunch(64, 10000, args)
    candidates = candidate_configs("reduction", False, False, 64, 10000)
    assert len({c.num_warps for c in candidates}) > 1
    ready = triton_ahead.compile_ahead({"kernel0": kernel}, {"kernel0": fn}, {"kernel0": prediction},
                                       target=triton_ahead.Target("cuda", 90, 32), configs={"kernel0": candidates})
    _, loaders = ready["kernel0"]
    assert [loader.config for loader in loaders] == candidates and len({loader.key for loader in loaders}) == len(candidates)
    for loader in loaders:
        if loader.future is not None:
            assert compile_pool.wait(loader.future)["ok"]
        entry = triton_ahead.binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
        binary = triton_ahead.load_compiled(loader.fn, loader.spec, entry)
        assert binary.metadata.num_warps == loader.config.num_warps
        # A pipelined row loop copies the loads of later steps asynchronously (cp.async); the
        # plain loop has none.
        assert ("cp.async" in binary.asm["ptx"]) == ((loader.config.num_stages or 1) > 1), loader.config


# -- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_max_autotune_matches_default_mode_and_a_second_compile_times_nothing(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.LayerNorm(4096),
                                torch.nn.Linear(4096, 1024)).cuda()
    x = torch.randn(64, 1024, device="cuda")

    def step(m):
        out = m(x).float().pow(2).mean()
        out.backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    loss, grads = step(torchfuse.compile(model))
    torchfuse.reset()
    model.zero_grad()
    tuned = torchfuse.compile(model, mode="max-autotune")
    timed = autotune.stats.timed
    for _ in range(3):  # warm-up (tunes), record, replay
        model.zero_grad()
        tuned_loss, tuned_grads = step(tuned)
        torch.testing.assert_close(tuned_loss, loss, rtol=1e-4, atol=1e-5)
        for got, want in zip(tuned_grads, grads):
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    assert autotune.stats.timed > timed
    assert any(e.how == "timed" for e in autotune_entries()), torchfuse.report()
    torchfuse.reset()
    timed = autotune.stats.timed
    model.zero_grad()
    again_loss, _ = step(torchfuse.compile(model, mode="max-autotune"))
    torch.testing.assert_close(again_loss, loss, rtol=1e-4, atol=1e-5)
    assert autotune.stats.timed == timed and all(e.how != "timed" for e in autotune_entries())


def test_a_candidate_that_fails_is_skipped_and_the_default_must_not(monkeypatch, tmp_path):
    launcher, fn, choices = _tuned_launcher(lambda c: 1.0 / c.num_warps, monkeypatch, tmp_path)
    original = launcher.launch_through_triton

    def too_many_warps(config, *args, **kwargs):
        if config.num_warps > 4:
            raise RuntimeError("out of resources")
        return original(config, *args, **kwargs)

    monkeypatch.setattr(launcher, "launch_through_triton", too_many_warps)
    failed = autotune.stats.failed_candidates
    launcher(65536, 0, torch.randn(65536), torch.empty(65536))
    assert choices[0].config.num_warps <= 4 and autotune.stats.failed_candidates > failed
    assert "out of resources" in autotune.stats.errors[-1]
    broken, _, _ = _tuned_launcher(lambda c: 1.0, monkeypatch, tmp_path / "again")
    monkeypatch.setattr(broken, "launch_through_triton", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad")))
    with pytest.raises(RuntimeError, match="bad"):  # the default failing is a real error, as without tuning
        broken(65536, 0, torch.randn(65536), torch.empty(65536))


def test_combined_launches_are_not_timed(tune_on_cpu):
    """A combined launch's stores are in its parts' functions, under the parts' own parameter
    names, so what it writes cannot be read from its source: it keeps its default config (never
    timed on live buffers, where a part overwriting the matmul's dead result would apply twice)."""
    def fn(x, w, y):
        m = (torch.sin(x) * 3) @ w
        return (m + 1).cos(), torch.tanh(y)

    x, w, y = torch.randn(32, 32), torch.randn(32, 32), torch.randn(40, 40)
    assert_close(compile_tuned(fn)(x, w, y), fn(x, w, y))
    graph = torchfuse.report().graphs[-1]
    assert graph.combined_launches and "overwrites the dead buffer" in graph.wrapper_source
    assert not any(entry.kernel in graph.combined_launches for entry in graph.autotune)
