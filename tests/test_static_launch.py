"""Direct launches through torch's C++ launcher (runtime/static_launch.py, launch._binary_launch).

This machine's torch has no ``torch._C._StaticCudaLauncher`` (a CPU build), so a stand-in that
parses its arguments the way the C++ binding does is put in its place. The binaries are real:
Triton compiles for sm_90 without a GPU, with the specialization Triton itself computes for the
arguments (``triton_ahead.specialize``), and each test checks the parameters we pass against the
``.entry`` of the binary's PTX. Only the launch itself is faked; the GPU test runs it for real.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from conftest import compile_strict
from torchfuse.codegen.triton.kernel import TritonKernel
from torchfuse.runtime import kernel_cache, launch, launch_configs, static_launch, triton_ahead
from torchfuse.runtime.launch import Launcher, PointerArg
from torchfuse.runtime.predict import PredictedLaunch

triton = pytest.importorskip("triton")
H100 = triton_ahead.Target("cuda", 90, 32)
FUNCTION = 0xC0FFEE  # the CUfunction a loaded binary would have
F32 = PointerArg(torch.float32, True)  # a 16-byte aligned float32 tensor, as Triton specializes it


class FakeBinding:
    """``torch._C._StaticCudaLauncher`` as torch 2.11 has it: ``_launch_kernel`` parses
    ``(K i i i i i s O K)`` like PyArg_ParseTuple (same errors, same order), then launches."""

    def __init__(self, n_params: int = 9) -> None:
        self.n_params = n_params
        self.calls: list[tuple] = []

    def _launch_kernel(self, *args):
        if len(args) != self.n_params:
            raise TypeError(f"function takes exactly {self.n_params} arguments ({len(args)} given)")
        kinds = [int, int, int, int, int, int, str, tuple, int, int][: self.n_params]
        for position, (value, kind) in enumerate(zip(args, kinds), start=1):
            if not isinstance(value, kind):
                raise TypeError(f"argument {position} must be {kind.__name__}, not {type(value).__name__}")
        if args[1] * args[2] * args[3] <= 0:
            return None  # an empty grid: nothing to launch
        self.calls.append(args)


class FakeRun:
    """Triton's launcher of a loaded binary (``CompiledKernel.run``)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on the GPU: what the launch reads of a CUDA tensor."""

    @property
    def is_cuda(self) -> bool:
        return True


def cuda_like(*sizes: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*sizes, dtype=dtype).as_subclass(FakeCuda)


@pytest.fixture(autouse=True)
def binding(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(static_launch.ENV_VARIABLE, raising=False)
    monkeypatch.setattr(launch, "stats", launch.LaunchStats())  # this test's counts only
    fake = FakeBinding()
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", fake, raising=False)
    static_launch.reset_binding()
    yield fake
    static_launch.reset_binding()


# -- kernels -------------------------------------------------------------------------------------
POINTWISE = ("@jit\ndef {name}(in_ptr0, out_ptr0, ks0, xnumel, XBLOCK: tl.constexpr):\n"
             "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
             "    xmask = xindex < xnumel\n"
             "    x = tl.load(in_ptr0 + xindex * ks0, xmask)\n"
             "    tl.store(out_ptr0 + xindex, x * 2.0, xmask)\n")
REDUCTION = ("@jit\ndef {name}(in_ptr0, out_ptr0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):\n"
             "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]\n"
             "    xmask = xindex < xnumel\n"
             "    acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)\n"
             "    for roffset in range(0, rnumel, RBLOCK):\n"
             "        rindex = roffset + tl.arange(0, RBLOCK)[None, :]\n"
             "        acc += tl.load(in_ptr0 + xindex * rnumel + rindex, xmask & (rindex < rnumel), other=0.0)\n"
             "    tl.store(out_ptr0 + xindex, tl.sum(acc, 1)[:, None], xmask)\n")
TILE = ("@jit\ndef {name}(in_ptr0, out_ptr0, xnumel, YBLOCK: tl.constexpr, XBLOCK: tl.constexpr):\n"
        "    yindex = tl.program_id(0) // 2 * YBLOCK + tl.arange(0, YBLOCK)[:, None]\n"
        "    xindex = tl.program_id(0) % 2 * XBLOCK + tl.arange(0, XBLOCK)[None, :]\n"
        "    mask = (yindex < 96) & (xindex < 80)\n"
        "    tl.store(out_ptr0 + yindex * 80 + xindex, tl.load(in_ptr0 + xindex * 96 + yindex, mask), mask)\n")


def _launcher(template: str, kind: str, tag: str, **kwargs) -> tuple[Launcher, TritonKernel]:
    name = f"tf_static_{tag}"
    source = template.format(name=name)
    kernel = TritonKernel("kernel0", source, ["a", "b"], [], 0, 0, kind, kwargs.get("persistent", False),
                          function=name, tile=kwargs.get("tile"))
    fn = kernel_cache.load_kernel(source, name, interpret=False)
    launcher = Launcher(fn, kind, direct=True, current_device=lambda: 0, current_stream=lambda device: 77,
                        tile=kwargs.get("tile"))
    return launcher, kernel


def _prepare(launcher: Launcher, kernel: TritonKernel, xnumel: int, rnumel: int, predicted: tuple) -> tuple:
    """Compile the binary Triton would build for these arguments (for sm_90), loaded as far as a
    machine without a GPU allows; the launcher's first launch of them takes it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = triton_ahead.specialize(launcher.fn, kernel, PredictedLaunch(xnumel, rnumel, predicted), H100)
    compiled = triton.compile(ASTSource(launcher.fn, spec.signature, spec.constexprs, spec.attrs),
                              target=GPUTarget("cuda", 90, 32), options=spec.options)
    compiled._run, compiled.function = FakeRun(), FUNCTION  # what loading it on a GPU sets
    launcher.prepare(xnumel, rnumel, predicted, lambda: compiled)
    return compiled


def _ptx_params(compiled) -> list[str]:
    """The binary's parameters as its PTX declares them: 'ptr', 'b32' or 'b64' (f32: 'f32')."""
    entry = re.search(r"\.entry\s+\w+\s*\((.*?)\)", compiled.asm["ptx"], re.S).group(1)
    params = []
    for line in filter(None, (part.strip() for part in entry.split(","))):
        kind = re.match(r"\.param\s+\.(\w+)", line).group(1)
        widths = {"u32": "b32", "s32": "b32", "u64": "b64", "s64": "b64"}
        params.append("ptr" if ".ptr" in line else widths.get(kind, kind))
    return params


TYPE_WIDTH = {"O": "ptr", "i": "b32", "I": "b32", "l": "b64", "K": "b64", "f": "f32"}


def _launched(binding: FakeBinding, compiled) -> tuple:
    """The one launch made, checked against the binary: its type string matches the PTX entry."""
    assert len(binding.calls) == 1, binding.calls
    call = binding.calls[0]
    function, _, grid_y, grid_z, num_warps, shared, types, args, stream = call
    assert (function, grid_y, grid_z, stream) == (FUNCTION, 1, 1, 77)
    assert (num_warps, shared) == (compiled.metadata.num_warps, compiled.metadata.shared)
    assert [TYPE_WIDTH[t] for t in types] == _ptx_params(compiled)
    assert len(args) == len(types)
    return call


# -- the arguments, the grid, the tail -----------------------------------------------------------
@pytest.mark.parametrize("stride, code", [(3, "i"), (1, None), (2**40, "l")])
def test_a_pointwise_binary_gets_exactly_its_parameters(binding, stride, code):
    """A scalar equal to 1 is a constant of the binary (not passed); one beyond int32 is an i64."""
    launcher, kernel = _launcher(POINTWISE, "pointwise", f"poi{code}")
    x, out = cuda_like(4096), cuda_like(1000)
    compiled = _prepare(launcher, kernel, 1000, 0, (F32, F32, stride))
    before = launch.stats.static
    launcher(1000, 0, x, out, stride)
    call = _launched(binding, compiled)
    config = launch_configs.pointwise_config(1000)
    assert call[1] == config.grid and launch.stats.static == before + 1
    scalar = () if code is None else (stride,)
    assert call[6] == "OO" + (code or "") + "i" + "OO"  # pointers, the stride, xnumel, two scratch pointers
    assert call[7] == (x.data_ptr(), out.data_ptr(), *scalar, 1000, None, None)
    launcher(1000, 0, x, out, stride)  # later launches: the same binary, the same way
    assert len(binding.calls) == 2 and binding.calls[1] == call
    assert compiled._run.calls == []  # Triton's launcher never ran


def test_a_size_of_one_is_not_passed(binding):
    launcher, kernel = _launcher(POINTWISE, "pointwise", "one")
    x, out = cuda_like(16), cuda_like(1)
    compiled = _prepare(launcher, kernel, 1, 0, (F32, F32, 5))
    launcher(1, 0, x, out, 5)
    call = _launched(binding, compiled)
    assert call[6] == "OOi" + "OO" and call[7] == (x.data_ptr(), out.data_ptr(), 5, None, None)


def test_a_looped_reduction_passes_both_sizes(binding):
    launcher, kernel = _launcher(REDUCTION, "reduction", "red")
    x, out = cuda_like(7 * 50_000), cuda_like(7)
    compiled = _prepare(launcher, kernel, 7, 50_000, (F32, F32))
    launcher(7, 50_000, x, out)
    call = _launched(binding, compiled)
    assert call[1] == launch_configs.reduction_config(False, 7, 50_000).grid
    assert call[6] == "OOii" + "OO" and call[7] == (x.data_ptr(), out.data_ptr(), 7, 50_000, None, None)


def test_a_2d_tile_launches_like_a_1d_kernel(binding):
    launcher, kernel = _launcher(TILE, "pointwise", "tile", tile=(1, 96, 80))
    x, out = cuda_like(96 * 80), cuda_like(96 * 80)
    compiled = _prepare(launcher, kernel, 96 * 80, 0, (F32, F32))
    launcher(96 * 80, 0, x, out)
    call = _launched(binding, compiled)
    assert call[1] == launch_configs.tile_config(1, 96, 80).grid
    assert call[6] == "OOi" + "OO" and call[7] == (x.data_ptr(), out.data_ptr(), 96 * 80, None, None)


def test_a_misaligned_view_gets_its_own_binary(binding):
    launcher, kernel = _launcher(POINTWISE, "pointwise", "misaligned")
    base, out = cuda_like(4097), cuda_like(1000)
    aligned = _prepare(launcher, kernel, 1000, 0, (F32, F32, 3))
    misaligned = _prepare(launcher, kernel, 1000, 0, (PointerArg(torch.float32, False), F32, 3))
    misaligned.function = FUNCTION + 1
    launcher(1000, 0, base[:4096], out, 3)
    launcher(1000, 0, base[1:], out, 3)
    launcher(1000, 0, base[:4096], out, 3)
    assert [call[0] for call in binding.calls] == [FUNCTION, FUNCTION + 1, FUNCTION] and len(launcher.binaries) == 2
    assert binding.calls[1][7][0] == base[1:].data_ptr() and aligned.src.attrs != misaligned.src.attrs


def test_a_cpu_tensor_is_refused_with_the_argument_named(binding):
    launcher, kernel = _launcher(POINTWISE, "pointwise", "cpu")
    _prepare(launcher, kernel, 1000, 0, (F32, F32, 3))
    with pytest.raises(ValueError, match="argument 1 is a tensor on cpu"):
        launcher(1000, 0, cuda_like(4096), torch.empty(1000), 3)
    assert binding.calls == []


# -- falling back to Triton's launcher -----------------------------------------------------------
def _through_triton(binding: FakeBinding, launcher: Launcher, compiled, reason: str) -> None:
    x, out = cuda_like(4096), cuda_like(1000)
    for _ in range(2):
        launcher(1000, 0, x, out, 3)
    assert binding.calls == [] and len(compiled._run.calls) == 2 and launch.stats.direct == 2
    assert compiled._run.calls[0][9:] == (x, out, 3, 1000, 1024)  # every parameter, constexprs included
    assert launch.stats.static == 0 and list(launch.stats.static_refused.values()) == [1]  # once per binary
    assert reason in next(iter(launch.stats.static_refused)) and reason in launch.stats.summary()


def _pointwise(tag: str):
    launcher, kernel = _launcher(POINTWISE, "pointwise", tag)
    compiled = _prepare(launcher, kernel, 1000, 0, (F32, F32, 3))
    return launcher, compiled


@pytest.mark.parametrize("field, value, reason", [
    ("global_scratch_size", 64, "global scratch"), ("profile_scratch_size", 8, "profile scratch"),
    ("num_ctas", 2, "num_ctas=2"), ("launch_pdl", True, "launch_pdl"),
    ("launch_cooperative_grid", True, "launch_cooperative_grid"), ("instrumentation_mode", "gsan", "instrumentation"),
    ("shared", 230 * 1024, "shared memory")])
def test_features_torch_launcher_lacks_keep_triton_launcher(binding, field, value, reason):
    launcher, compiled = _pointwise(f"refuse_{field}")
    compiled.metadata = compiled.metadata._replace(**{field: value})
    _through_triton(binding, launcher, compiled, reason)


def test_a_16_bit_float_scalar_keeps_triton_launcher(binding):
    launcher, compiled = _pointwise("fp16")
    compiled.src.signature = dict(compiled.src.signature, ks0="fp16")
    _through_triton(binding, launcher, compiled, "of type fp16")


def test_parameters_the_ptx_does_not_declare_keep_triton_launcher(binding):
    """A Triton release that adds a parameter we do not know of (as 3.3 and 3.5 did, scratch
    pointers): the binary's own .entry disagrees with what we would pass, and it is refused."""
    launcher, compiled = _pointwise("ptx_extra")
    ptx = compiled.asm["ptx"]
    entry_end = ptx.index(")", ptx.index(".entry"))
    compiled.asm = dict(compiled.asm, ptx=ptx[:entry_end] + ",\n\t.param .u64 .ptr .global .align 1 extra_param" + ptx[entry_end:])
    _through_triton(binding, launcher, compiled, "the binary declares parameters")


def test_a_binary_without_its_ptx_keeps_triton_launcher(binding):
    launcher, compiled = _pointwise("no_ptx")
    compiled.asm = {name: text for name, text in compiled.asm.items() if name != "ptx"}
    _through_triton(binding, launcher, compiled, "no PTX to check the parameters against")


def test_an_error_while_preparing_keeps_triton_launcher(binding):
    launcher, compiled = _pointwise("broken")

    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("damaged source")

    compiled.src = Broken()
    _through_triton(binding, launcher, compiled, "error preparing it: RuntimeError: damaged source")


def test_another_binding_signature_is_refused_without_launching(binding, monkeypatch):
    other = FakeBinding(n_params=10)  # e.g. a release that adds num_ctas
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", other)
    static_launch.reset_binding()
    launcher, compiled = _pointwise("signature")
    _through_triton(other, launcher, compiled, "unexpected _launch_kernel signature")


def test_a_torch_without_the_binding_keeps_triton_launcher(binding, monkeypatch):
    monkeypatch.delattr(torch._C, "_StaticCudaLauncher")
    static_launch.reset_binding()
    launcher, compiled = _pointwise("absent")
    _through_triton(binding, launcher, compiled, "no torch._C._StaticCudaLauncher")


def test_the_environment_variable_turns_it_off(binding, monkeypatch):
    monkeypatch.setenv(static_launch.ENV_VARIABLE, "0")
    launcher, compiled = _pointwise("env")
    _through_triton(binding, launcher, compiled, "TORCHFUSE_STATIC_LAUNCH=0")


def test_the_probe_launches_nothing(binding):
    assert static_launch.binding() == binding._launch_kernel and binding.calls == []


def test_a_binding_that_launches_an_empty_grid_is_refused(monkeypatch):
    class NoEmptyGridReturn(FakeBinding):
        def _launch_kernel(self, *args):
            if len(args) == 9 and args[1] == 0:
                raise RuntimeError("CUDA driver error: invalid argument")
            return super()._launch_kernel(*args)

    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", NoEmptyGridReturn())
    static_launch.reset_binding()
    with pytest.raises(static_launch.Refused, match="RuntimeError: CUDA driver error"):
        static_launch.binding()
    static_launch.reset_binding()
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")
    with pytest.raises(static_launch.Refused, match="torch 2.7.1"):
        static_launch.binding()


def test_the_report_line_counts_both_launchers():
    stats = launch.LaunchStats(direct=40, through_triton=3, static=5, static_refused={"a reason": 2, "another": 1})
    assert stats.summary() == ("GPU launches: 40 straight to a compiled binary, 3 through Triton's JIT; binaries "
                               "launched through torch's C++ launcher: 5, through Triton's launcher: 3 "
                               "(2 x a reason; 1 x another)")
    assert launch.LaunchStats().summary() == ""


# -- on a GPU --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["pointwise", "looped reduction", "2-D tile", "int64 size", "misaligned view"])
def test_gpu_kernels_launched_through_torch_launcher_match_eager(monkeypatch, case):
    """Real launches through torch._C._StaticCudaLauncher (torch 2.8+ CUDA builds); none of these
    kernels may be refused (a refusal would mean the parameters were not worked out)."""
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", GPU_BINDING)
    static_launch.reset_binding()
    static_launch.binding()  # the GPU's torch must have the binding and pass the probe
    fn, inputs, exact = _gpu_case(case)
    compiled = compile_strict(fn)
    before_static, before_direct = launch.stats.static, launch.stats.direct
    for _ in range(3):
        args = [make() for make in inputs]  # fresh inputs every call
        result, expected = compiled(*args), fn(*args)
        if exact:
            torch.testing.assert_close(result, expected, rtol=0, atol=0)
        else:
            reference = fn(*[a.double() for a in args])
            assert not result.isnan().any()
            torch.testing.assert_close(result.double(), reference, rtol=1e-4, atol=1e-4)
        del args, result, expected
    assert launch.stats.static > before_static and launch.stats.direct > before_direct
    assert launch.stats.static_refused == {}


GPU_BINDING = getattr(torch._C, "_StaticCudaLauncher", None)


def _gpu_case(case: str):
    """(function, input makers, exact): exact where every output is one correctly rounded
    operation (or integer arithmetic), so the kernel must give eager's bits; else compared with
    a float64 run."""
    cuda = "cuda"
    if case == "pointwise":
        return (lambda x, y: torch.sigmoid(x) * y + 1), [lambda: torch.randn(1000, 333, device=cuda),
                                                         lambda: torch.randn(333, device=cuda)], False
    if case == "looped reduction":
        return (lambda x: (x * x).sum(-1)), [lambda: torch.randn(37, 70_001, device=cuda)], False
    if case == "2-D tile":
        return (lambda x: x.permute(0, 2, 1).contiguous() * 2), [lambda: torch.randn(8, 515, 300, device=cuda)], True
    if case == "int64 size":  # 2**31 + 17 elements: xnumel is an i64 parameter
        return (lambda x: x + 3), [lambda: torch.randint(0, 100, (2**31 + 17,), dtype=torch.int8, device=cuda)], True
    assert case == "misaligned view"

    offsets = itertools.cycle([0, 1, 1])

    def shifted():  # aligned, then 4 bytes past an allocation (not 16-byte aligned): its own binary
        offset = next(offsets)
        return torch.randn(300 * 500 + 1, device=cuda)[offset:offset + 300 * 500].view(300, 500)

    return (lambda x, y: (x - y) * 0.5), [shifted, lambda: torch.randn(300, 500, device=cuda)], True
