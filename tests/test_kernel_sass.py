"""``scripts/kernel_sass.py``: a saved kernel's instructions per element, from its sm_90 SASS
compiled on the CPU, and the arithmetic and memory bounds on its time that follow."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import kernel_sass  # noqa: E402

N = 1 << 22
HEADER = (f"# reads  BufferAccess(name='x', shape='bf16[{N}]', bytes={2 * N}, size_expr='')\n"
          f"# writes BufferAccess(name='y', shape='bf16[{N}]', bytes={2 * N}, size_expr='')\n")
POINTWISE = HEADER + """import triton
import triton.language as tl


@jit
def tf_poi_00000000000000aa(ptr0, ptr1, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(ptr0 + (xindex), xmask, other=0).to(tl.float32)
    tmp1 = (1.0 / (1.0 + tl.exp(-tmp0)))
    tl.store(ptr1 + (xindex), (tmp1 * tmp0).to(tl.bfloat16), xmask)
"""
LOOPED_ROWS = (f"# reads  BufferAccess(name='x', shape='bf16[64, 65536]', bytes={2 * N}, size_expr='')\n"
               "# writes BufferAccess(name='y', shape='f32[64]', bytes=256, size_expr='')\n"
               "# launch grid 64 [1 x 2048] w8\n") + """import triton
import triton.language as tl


@jit
def tf_red_00000000000000bb(ptr0, ptr1, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, LOOP_STAGES: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for roffset in tl.range(0, rnumel, RBLOCK, num_stages=LOOP_STAGES):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < rnumel
        tmp0 = tl.load(ptr0 + (rindex + xindex * 65536), xmask & rmask, other=0).to(tl.float32)
        acc = acc + tl.where(xmask & rmask, tl.exp(tmp0), 0)
    tl.store(ptr1 + (xindex), tl.sum(acc, 1)[:, None], xmask)
"""


def _analyse(tmp_path: Path, name: str, text: str) -> dict:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    found = kernel_sass.analyse(path, copy_gbps=3000.0)
    assert not isinstance(found, str), found
    return found


def test_a_pointwise_silu_costs_two_mufu_instructions_an_element(tmp_path):
    plain = _analyse(tmp_path, "tf_poi_00000000000000aa", POINTWISE)
    # exp2 and the reciprocal: MUFU; launched as the launcher would (no launch in the header)
    assert plain["mix"].count({"MUFU"}) == pytest.approx(2.0)
    assert plain["launch"]["xblock"] == 1024
    assert plain["mix"].clocks_per_element() >= 2.0 / kernel_sass.QUARTER_RATE
    assert plain["memory_us"] == pytest.approx(4 * N / 3e6)  # 4 bytes an element at 3000 GB/s


def test_a_looped_reduction_is_counted_over_its_loop_not_its_prologue(tmp_path):
    found = _analyse(tmp_path, "tf_red_00000000000000bb", LOOPED_ROWS)
    assert found["launch"] == {"grid": 64, "xblock": 1, "rblock": 2048, "warps": 8}
    # one exp an element: the loop body over its 8 elements a thread; the prologue and the
    # final sum, run once, are left out
    assert found["mix"].count({"MUFU"}) == pytest.approx(1.0)
    cubin, _ = kernel_sass.compile_sm90(tmp_path / "tf_red_00000000000000bb.py")
    sass = kernel_sass.sass_of(cubin)
    everything = len(kernel_sass.SASS_LINE.findall(sass))
    assert kernel_sass.loop_ranges([(int(a, 16), op, rest) for a, op, _, rest in kernel_sass.SASS_LINE.findall(sass)])
    assert found["passes"] == 1
    assert found["mix"].count() < everything / 8 - 4
    assert 0 < found["alu_us"] < found["memory_us"]  # a plain sum of exps stays memory-bound


def _rounding_pool(round_helper: str) -> str:
    """LOOPED_ROWS summing SiLU over a bfloat16-rounded affine map instead of exp: two roundings
    an element, as EfficientNet's squeeze-excite pools (with the helpers a kernel module has)."""
    from torchfuse.codegen.triton.reductions import helpers_for

    step = (f"        tmp1 = {round_helper}(tmp0 * 1.5 + 0.25)\n"
            f"        tmp2 = {round_helper}(tmp1 * (1.0 / (1.0 + tl.exp(-tmp1))))\n"
            "        acc = acc + tl.where(xmask & rmask, tmp2, 0)\n")
    source = LOOPED_ROWS.replace("        acc = acc + tl.where(xmask & rmask, tl.exp(tmp0), 0)\n", step)
    source = source.replace("tf_red_00000000000000bb", "tf_red_00000000000000cc")
    head, _, kernel = source.partition("@jit\n")
    return head + helpers_for(kernel) + "\n\n@jit\n" + kernel


def test_packed_roundings_convert_two_elements_an_instruction(tmp_path):
    """``_round_bf16_pairs`` (kernel.PACKED_ROUNDINGS) rounds with one F2FP for two elements
    where ``_round_bf16`` takes one F2F each: half the quarter-rate conversions of the pool."""
    conversions = {"F2F", "F2FP"}
    (tmp_path / "packed").mkdir()
    plain = _analyse(tmp_path, "tf_red_00000000000000cc", _rounding_pool("_round_bf16"))
    packed = _analyse(tmp_path / "packed", "tf_red_00000000000000cc", _rounding_pool("_round_bf16_pairs"))
    assert plain["mix"].count(conversions) == pytest.approx(2.0)
    assert packed["mix"].count(conversions) == pytest.approx(1.0)
    assert packed["mix"].count({"MUFU"}) == plain["mix"].count({"MUFU"}) == pytest.approx(2.0)
    assert packed["alu_us"] < plain["alu_us"]


def test_a_one_element_rounding_takes_the_plain_helper():
    """``cvt.rn.bf16x2.f32`` takes pairs, and Triton refuses the packed op on a tensor of one
    element (a row's value at XBLOCK 1): the helper then rounds it alone. Compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from torchfuse.codegen.triton.reductions import helpers_for
    from torchfuse.runtime import kernel_cache

    kernel = """@jit
def tf_red_00000000000000dd(ptr0, ptr1, XBLOCK: tl.constexpr):
    x = tl.load(ptr0 + tl.arange(0, XBLOCK)[:, None]).to(tl.float32)
    tl.store(ptr1 + tl.arange(0, XBLOCK)[:, None], _round_bf16_pairs(x * 3.0))
"""
    source = "import triton\nimport triton.language as tl\n" + helpers_for(kernel) + "\n\n" + kernel
    fn = kernel_cache.load_kernel(source, "tf_red_00000000000000dd", interpret=False)
    for xblock, packed in ((1, 0), (2, 1), (64, 1)):
        compiled = triton.compile(ASTSource(fn, {"ptr0": "*fp32", "ptr1": "*fp32", "XBLOCK": "constexpr"},
                                            {"XBLOCK": xblock}), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 1})
        assert compiled.asm["ptx"].count("cvt.rn.bf16x2.f32") == packed, xblock
