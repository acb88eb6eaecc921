"""Disk caches are safe: corrupted entries are detected and rebuilt, writers race safely."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import torchfuse
from torchfuse.runtime import cpp_build, kernel_cache

SOURCE = 'extern "C" int torchfuse_cache_probe_{n}(void) {{ return {n}; }}\n'


def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    cpp_build.clear_memory_cache()


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".damaged")
    tmp.write_bytes(data)
    tmp.replace(path)


@pytest.mark.skipif(not cpp_build.compiler_available(), reason="no C++ compiler")
@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing_digest"])
def test_corrupted_cpp_library_is_rebuilt_not_loaded(monkeypatch, tmp_path, damage):
    _fresh(monkeypatch, tmp_path)
    source = SOURCE.format(n=7)
    cpp_build.build(source)
    (library,) = list((tmp_path / "cpp").rglob("*.so"))
    # Damage it as a crash or another process would: a new file in its place (this process
    # still has the old one mapped, which an in-place write would corrupt under it).
    if damage == "truncate":
        _replace(library, library.read_bytes()[:100])
    elif damage == "garbage":
        _replace(library, b"\x7fELF" + b"\x00" * 64)
    else:
        library.with_suffix(".sha256").unlink()
    cpp_build.clear_memory_cache()
    calls, corrupt = cpp_build.stats.compiler_calls, cpp_build.stats.corrupt_entries
    lib = cpp_build.build(source)
    assert cpp_build.stats.corrupt_entries == corrupt + 1
    assert cpp_build.stats.compiler_calls > calls  # rebuilt
    assert lib.handle.torchfuse_cache_probe_7() == 7


@pytest.mark.skipif(not cpp_build.compiler_available(), reason="no C++ compiler")
def test_two_processes_building_the_same_library_both_succeed(tmp_path):
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "from torchfuse.runtime import cpp_build\n"
        "lib = cpp_build.build(%r)\n"
        "assert lib.handle.torchfuse_cache_probe_11() == 11\n"
    ) % (str(Path(__file__).parents[1] / "src"), SOURCE.format(n=11))
    env = {"TORCHFUSE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err


def test_triton_kernel_file_is_rewritten_when_corrupted(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    kernel_cache.clear_memory_cache()
    source = "@jit\ndef probe_kernel(ptr, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
    kernel_cache.load_kernel(source, "probe_kernel", interpret=True)
    (path,) = list((tmp_path / "triton").glob("*.py"))
    path.write_text("garbage that does not parse (")
    kernel_cache.clear_memory_cache()
    kernel_cache.load_kernel(source, "probe_kernel", interpret=True)
    assert path.read_text() == kernel_cache.module_source(source)


def test_compiling_from_several_threads_is_safe():
    from conftest import compile_strict

    fn = compile_strict(lambda x: torch.softmax(x * 2, -1))
    inputs = [torch.randn(5, 9) for _ in range(4)]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(inputs[i])
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, x in enumerate(inputs):
        torch.testing.assert_close(results[i], torch.softmax(x * 2, -1))


def test_a_large_graph_builds_as_several_libraries_at_once(monkeypatch, tmp_path):
    """With enough workers a graph's kernels go into several libraries compiled in parallel
    (cpp_build.load_graph_kernels); results do not change, and a second build finds them all."""

    monkeypatch.setenv("TORCHFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "4")
    monkeypatch.setattr(cpp_build, "MIN_KERNELS_PER_LIBRARY", 1)
    monkeypatch.setattr(cpp_build, "MIN_WORKERS_TO_SPLIT", 2)

    def fn(x, y):
        a = torch.sigmoid(x) * y
        b = a.sum(-1, keepdim=True) + x
        c = torch.tanh(b).amax(0) + y
        return a, b, (c * 2).softmax(-1)

    x, y = torch.randn(16, 32), torch.randn(32)
    builds = cpp_build.stats.compiler_calls + cpp_build.stats.disk_hits
    torchfuse.reset()
    cpp_build.clear_memory_cache()
    got = torchfuse.compile(fn, options={"target": "cpp", "strict": True})(x, y)
    kernels = len(torchfuse.report().graphs[-1].generated_kernels)
    assert kernels >= 3 and cpp_build.stats.compiler_calls + cpp_build.stats.disk_hits - builds >= 2
    for g, e in zip(got, fn(x, y)):
        torch.testing.assert_close(g, e)
    parts = cpp_build.library_parts([(str(i), type("K", (), {"source": "x" * (i + 1)})()) for i in range(10)], 3)
    assert [name for part in parts for name, _ in part] == [str(i) for i in range(10)] and len(parts) == 3
