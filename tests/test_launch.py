"""The Triton launch path (runtime/launch.py): block sizes from sizes, and direct launches of a
compiled binary once per specialization. The binding logic runs here against a stand-in for
Triton's JIT function; the GPU test runs the real thing."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from conftest import compile_strict
from torchfuse.runtime import launch, launch_configs
from torchfuse.runtime.launch import Launcher
from torchfuse.runtime.launch_configs import Config, pointwise_config, reduction_config


@dataclass
class FakeCompiled:
    """What Triton's CompiledKernel exposes to a launcher."""

    calls: list = field(default_factory=list)
    function: int = 1234
    packed_metadata: tuple = ("meta",)

    def run(self, *args):
        self.calls.append(args)


class FakeJit:
    """Stands in for ``triton.jit`` output: ``fn[grid](*args, **kw)`` launches and returns the binary."""

    def __init__(self) -> None:
        self.launches: list = []
        self.compiled: list[FakeCompiled] = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            self.compiled.append(FakeCompiled())
            return self.compiled[-1]
        return run


def test_block_sizes_follow_the_sizes():
    assert pointwise_config(5) == Config(1, (16,), 2)
    assert pointwise_config(100_000) == Config(98, (1024,), 4)
    # Short persistent rows: a warp per 256 elements of a row, ~1024 elements a warp.
    assert reduction_config(True, 100_000, 300) == Config(25_000, (4, 512), 2)
    assert reduction_config(True, 200_704, 192) == Config(50_176, (4, 256), 1)
    assert reduction_config(True, 3_612_672, 49) == Config(451_584, (8, 64), 1)
    # 1000 rows at 4 a program would be 250 programs: fewer rows per program fill 132 SMs twice.
    assert reduction_config(True, 1000, 300) == Config(500, (2, 512), 2)
    assert reduction_config(True, 8192, 768) == Config(2048, (4, 1024), 8)  # longer rows: 8 warps
    assert reduction_config(False, 7, 50_000) == Config(7, (1, 1024), 4)
    # Long looped rows, enough of them: a row a program, 2048 of it a step.
    assert reduction_config(False, 8192, 32_000) == Config(8192, (1, 2048), 8)
    # Short rows looped (their length is symbolic) share a program.
    assert reduction_config(False, 100_000, 100) == Config(12_500, (8, 128), 4)
    # Outer tiles put 32-128 rows on the lanes, RBLOCK reduced indices a step: 2048 elements
    # a step when the grid has programs enough to keep memory busy; with the row loop pipelined
    # (LIGHT_OUTER_PIPELINE: 3 stages, 2 warps) half of that a step, three steps in flight.
    assert reduction_config(False, 1 << 20, 784, outer=True) == Config(8192, (128, 8), 2, num_stages=3)
    # Under 2 x MIN_PROGRAMS programs, tiles grow toward IN_FLIGHT_ELEMENTS over the grid.
    assert reduction_config(False, 65_536, 784, outer=True) == Config(512, (128, 16), 2, num_stages=3)
    # A light step's lanes shrink to make three programs an SM: EfficientNet's squeeze-excite
    # pool, 18432 outputs of 3136, takes 576 programs of [32 x 32] (pipelined), not 288 of [64 x 128].
    assert reduction_config(False, 18_432, 3136, outer=True) == Config(576, (32, 32), 2, num_stages=3)
    assert reduction_config(False, 18_432, 3136, outer=True, live_tiles=3) == Config(288, (64, 32), 8)
    # Too few programs even at 32 lanes: longer steps, up to MAX_OUTER_TILE elements.
    assert reduction_config(False, 768, 4096, outer=True) == Config(24, (32, 256), 8)
    # A small looped one (a batch norm's second stage, 72 channels x 896 partials) gets as many
    # programs as 32 lanes allow, and 4 steps a loop (it was one program of 56).
    assert reduction_config(False, 72, 896, outer=True) == Config(3, (32, 256), 8)
    assert reduction_config(True, 2048, 128, outer=True) == Config(64, (32, 128), 8)
    assert reduction_config(True, 256, 64, outer=True) == Config(4, (64, 64), 8)  # small: tiles kept
    # A few reduced elements (grouped-query heads' gradients, 4 a group): longer lanes, 2048 a
    # tile, and no more warps than XBLOCK / 256 (more would reduce across warps).
    assert reduction_config(True, 1 << 20, 4, outer=True) == Config(2048, (512, 4), 2)
    assert reduction_config(True, 65_536, 4, outer=True) == Config(512, (128, 4), 1)  # fills the GPU first


def test_heavy_outer_steps_take_small_tiles():
    """An outer reduction step holding many tiles (accumulators and loads along both axes) gets
    a tile of about 8192 elements over all of them: Swin's LayerNorm weight and bias gradients
    (11 live tiles) ran 3x faster at [64 x 8], 4 warps, than at [128 x 64], 8 warps (H100)."""
    assert reduction_config(False, 49_152, 196, outer=True) == Config(768, (64, 16), 2, num_stages=3)  # light: pipelined
    assert reduction_config(False, 49_152, 196, outer=True, live_tiles=11) == Config(768, (64, 8), 4)
    # The lanes give way first, keeping 8 reduced rows a step; a warp per 128 elements; never
    # below 512 elements.
    assert reduction_config(False, 57_624, 256, outer=True, live_tiles=3) == Config(451, (128, 16), 8)
    assert reduction_config(False, 49_152, 196, outer=True, live_tiles=200) == Config(768, (64, 8), 4)
    # The channels-last batch-norm backward's split first stage over 64 channels (5 live tiles).
    assert reduction_config(False, 32_768, 3136, outer=True, live_tiles=5) == Config(512, (64, 16), 8)
    # Persistent (about 4096 elements over the live tiles): T5's bias-gradient sum over a batch
    # of 16, a warp per 512 elements.
    assert reduction_config(True, 1 << 21, 16, outer=True, live_tiles=7) == Config(65_536, (32, 16), 1)
    # One or two live tiles (a column sum) and few reduced rows keep the tiles above.
    for persistent, xnumel, rnumel in ((False, 49_152, 196), (True, 1 << 21, 16), (True, 1 << 20, 4)):
        assert (reduction_config(persistent, xnumel, rnumel, outer=True, live_tiles=2)
                == reduction_config(persistent, xnumel, rnumel, outer=True))
    assert reduction_config(True, 1 << 20, 4, outer=True, live_tiles=9) == Config(2048, (512, 4), 2)


def test_a_specialization_goes_through_triton_once_then_straight_to_its_binary():
    fn = FakeJit()
    launcher = Launcher(fn, "reduction", persistent=True, direct=True, current_device=lambda: 0,
                        current_stream=lambda device: 77)
    x, out = torch.zeros(64), torch.zeros(8)
    before = launch.stats.direct
    launcher(8, 8, x, out, 3)
    assert len(fn.launches) == 1 and fn.launches[0][1] == (x, out, 3, 8, 8)
    assert fn.launches[0][2] == {"XBLOCK": 8, "RBLOCK": 8, "num_warps": 1}
    launcher(8, 8, x, out, 5)  # another int of the same class: the same binary
    assert len(fn.launches) == 1 and launch.stats.direct == before + 1
    assert fn.compiled[0].calls == [(1, 1, 1, 77, 1234, ("meta",), None, None, None, x, out, 5, 8, 8, 8, 8)]


def test_2d_tiles_fill_the_gpu_and_launch_like_1d_kernels():
    # 64 x 64 tiles while the grid fills 132 SMs twice; each side shrinks, not below 32, until it does.
    assert launch_configs.tile_config(1, 4096, 4096) == Config(4096, (64, 64), 8, names=("YBLOCK", "XBLOCK"))
    assert launch_configs.tile_config(32, 3136, 64) == Config(1568, (64, 64), 8, names=("YBLOCK", "XBLOCK"))
    assert launch_configs.tile_config(1, 512, 256) == Config(128, (32, 32), 4, names=("YBLOCK", "XBLOCK"))
    assert launch_configs.tile_config(3, 20, 33) == Config(3, (32, 64), 4, names=("YBLOCK", "XBLOCK"))  # small: kept
    fn = FakeJit()
    launcher = Launcher(fn, "pointwise", direct=True, current_device=lambda: 0, current_stream=lambda device: 7,
                        tile=(2, 96, 80))
    x, out = torch.zeros(2 * 96 * 80), torch.zeros(2 * 96 * 80)
    launcher(2 * 96 * 80, 0, x, out)
    launcher(2 * 96 * 80, 0, x, out)
    assert fn.launches == [((2 * 2 * 2,), (x, out, 15360), {"YBLOCK": 64, "XBLOCK": 64, "num_warps": 8})]
    assert fn.compiled[0].calls == [(8, 1, 1, 7, 1234, ("meta",), None, None, None, x, out, 15360, 64, 64)]


@pytest.mark.parametrize("change", ["misaligned pointer", "other dtype", "int 1", "multiple of 16", "other size",
                                    "other device"])
def test_a_new_specialization_compiles_its_own_binary(change):
    fn = FakeJit()
    device = [0]
    launcher = Launcher(fn, "pointwise", direct=True, current_device=lambda: device[0],
                        current_stream=lambda device: 5)
    x = torch.zeros(64)
    launcher(32, 0, x[:32], 3)
    if change == "other device":  # a binary is loaded per device
        device[0] = 1
    args = {"misaligned pointer": (32, 0, x[1:33], 3), "other dtype": (32, 0, x[:32].double(), 3),
            "int 1": (32, 0, x[:32], 1), "multiple of 16": (32, 0, x[:32], 48), "other size": (33, 0, x[:33], 3),
            "other device": (32, 0, x[:32], 3)}[change]
    launcher(*args)
    assert len(fn.launches) == 2, change
    launcher(*args)
    assert len(fn.launches) == 2 and len(fn.compiled[1].calls) == 1


def test_empty_launches_do_nothing_and_the_interpreter_always_goes_through_triton():
    fn = FakeJit()
    Launcher(fn, "pointwise", direct=True, current_device=lambda: 0)(0, 0, torch.zeros(0))
    assert fn.launches == []
    interpreted = Launcher(fn, "pointwise")  # not a triton.jit function: no direct path
    assert not interpreted.direct
    for _ in range(2):
        interpreted(4, 0, torch.zeros(4))
    assert len(fn.launches) == 2


def test_fixed_arguments_enter_the_key_as_constants_unless_they_break_the_promise():
    """``Launcher.fixed_args``: positions the wrapper promises are the same at every call (its own
    aligned buffers, literal integers) are constants of the launch key, taken from the first
    call; a promised tensor that is misaligned, or not on a CUDA device when that is required,
    is read at every call like any other argument."""
    from torchfuse.runtime.launch import spec_function, specialization

    base = torch.empty(64)
    args = (base[:32], base[1:33], base[:8].double(), 48, 3)
    fn, trusted = spec_function(args, frozenset({0, 1, 3}))
    assert fn(*args) == specialization(args)
    assert trusted == {0}  # 1 is misaligned: not fixed; 3 is an int: constant, but no tensor to trust
    moved = (base[8:40].double(), base[2:34], base[:8], 16, 5)
    got, want = fn(*moved), specialization(moved)
    assert got[0] == specialization(args)[0] and got[3] == specialization(args)[3]  # the constants
    assert (got[1], got[2], got[4]) == (want[1], want[2], want[4])  # read at this call
    _, trusted = spec_function(args, frozenset({0}), cuda_only=True)
    assert trusted == frozenset()  # a CPU tensor is never trusted by a GPU launcher


def test_the_written_out_launch_goes_straight_to_the_binary_and_defers_the_rest():
    """``Launcher.launch`` (what the wrapper calls) becomes ``fast_launch_function``'s code at the
    first direct call: later calls with the same specialization reach the binary without
    ``Launcher.__call__``; a new specialization, an argument of another class and an empty
    launch still get what ``__call__`` does."""
    fn = FakeJit()
    launcher = Launcher(fn, "pointwise", direct=True, current_device=lambda: 0, current_stream=lambda device: 9)
    assert launcher.launch == launcher
    x = torch.zeros(64)
    launcher.launch(32, 0, x[:32], 3)
    assert launcher.launch != launcher and len(fn.launches) == 1
    calls = launch.Launcher.__call__
    seen = []
    launch.Launcher.__call__ = lambda self, *a: (seen.append(a), calls(self, *a))[1]
    try:
        before = launch.stats.direct
        launcher.launch(32, 0, x[:32], 5)  # same specialization: the binary, not __call__
        # (the first call went through Triton, which launched without the binary's ``run``)
        assert seen == [] and launch.stats.direct == before + 1 and len(fn.compiled[0].calls) == 1
        launcher.launch(32, 0, x[1:33], 5)  # misaligned: a new specialization, through __call__
        assert len(seen) == 1 and len(fn.launches) == 2
        launcher.launch(32, 0, x[1:33], 7)  # its binary is found by the written-out path now
        assert len(seen) == 1 and len(fn.compiled[1].calls) == 1
        launcher.launch(32, 0, 1.5, 7)  # a float where a tensor was: __call__ writes it again
        assert len(seen) == 2 and len(fn.launches) == 3
        launcher.launch(0, 0, x[:0], 7)  # empty: nothing launched
        assert len(seen) == 3 and len(fn.launches) == 3
    finally:
        launch.Launcher.__call__ = calls


@pytest.mark.gpu
def test_gpu_launches_go_straight_to_the_binary_and_match_eager():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fn = lambda x, y: (torch.sigmoid(x) * y).sum(-1)  # noqa: E731
    compiled = compile_strict(fn)
    x, y = torch.randn(300, 500, device="cuda"), torch.randn(500, device="cuda")
    first = compiled(x, y)
    before = launch.stats.direct
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), first, rtol=0, atol=0)
    assert launch.stats.direct >= before + 3
    # A misaligned view gets its own binary, compiled without the alignment assumption.
    big = torch.randn(300 * 500 + 1, device="cuda")
    shifted = big[1:].view(300, 500)
    torch.testing.assert_close(compiled(shifted, y), fn(shifted, y))


def test_the_written_out_specialization_equals_the_generic_one():
    """Launcher keys use spec_function's straight-line code; it must give exactly what
    specialization gives (the key predicted launches are filed under), and raise or defer to
    it when an argument's class changes."""
    from torchfuse.runtime.launch import spec_function, specialization

    base = torch.empty(64, dtype=torch.float32)
    args = (base, base[1:], torch.empty(3, dtype=torch.bfloat16), 1, 16, 17, 2**31, -2**31 - 1, 0.5, True)
    fn, _ = spec_function(args)
    assert fn(*args) == specialization(args)
    for other in [(base[2:], base, base[:3].to(torch.bfloat16), 32, 1, 2**40, 5, 7, 1.5, False),
                  (base, base, base, 3, 3, 3, 3, 3, 0.25, True)]:
        assert fn(*other) == specialization(other)
    swapped = (base, base, base, True, 16, 17, 1, 1, 0.5, 3)  # a bool where an int was, and back
    assert fn(*swapped) == specialization(swapped)
    with pytest.raises((AttributeError, TypeError)):
        fn(1, *args[1:])  # an int where a tensor was


@pytest.mark.gpu
def test_gpu_launchers_trust_the_wrappers_own_buffers(monkeypatch):
    """On a GPU the launchers of a compiled graph key their own buffers by constants and skip
    their device check (``fixed_args``), and the results still match eager; a misaligned input
    (never fixed) still gets its own binary."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torchfuse.runtime import wrapper

    namespaces: list[dict] = []
    original = wrapper.bind_wrapper

    def bind(*args, **kwargs):
        call = original(*args, **kwargs)
        namespaces.append(call.__globals__)
        return call

    monkeypatch.setattr(wrapper, "bind_wrapper", bind)
    fn = lambda x, y: torch.softmax(torch.sigmoid(x) * y, -1).sum(0)  # noqa: E731 - two kernels at least
    compiled = compile_strict(fn)
    x, y = torch.randn(300, 500, device="cuda"), torch.randn(500, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    launchers = [v for ns in namespaces for v in ns.values() if isinstance(v, Launcher)]
    assert any(launcher._trusted for launcher in launchers), [(l.fixed_args, l._trusted) for l in launchers]
    big = torch.randn(300 * 500 + 1, device="cuda")
    shifted = big[1:].view(300, 500)
    torch.testing.assert_close(compiled(shifted, y), fn(shifted, y))
