"""The HTML fusion report: self-contained, complete, and drawn by a real browser (headless Chromium)."""
from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib

import numpy as np
import pytest
import torch

import torchfuse
from conftest import compile_strict
from torchfuse.diagnostics.html import FILLS


def block(x, w, b):
    h = torch.nn.functional.layer_norm(x @ w, (16,)) * 2
    return torch.softmax(h + b, -1).relu() * 3


def make_report(tmp_path) -> tuple[str, torchfuse.diagnostics.report.Report]:
    compiled = compile_strict(block)
    compiled(torch.randn(8, 16), torch.randn(16, 16), torch.randn(16))
    report = torchfuse.report()
    path = str(tmp_path / "report.html")
    report.to_html(path)
    return path, report


def test_page_has_drawing_bytes_refusals_and_sources(tmp_path):
    path, report = make_report(tmp_path)
    page = open(path, encoding="utf-8").read()
    (graph,) = report.graphs
    assert page.count("<svg class='kernel-graph'") == 1
    for kernel in graph.kernels:
        assert f"<g id='{graph.name}-{kernel.name}'>" in page  # a box per kernel in the drawing
        for op in kernel.ops:
            assert op.removeprefix("aten.").removesuffix(".default") in page
    mm = next(k for k in graph.kernels if k.kind == "extern")
    assert [a.bytes for a in mm.reads] == [8 * 16 * 4, 16 * 16 * 4]  # x and w, float32
    assert [a.bytes for a in mm.writes] == [8 * 16 * 4]
    assert "eager moves" in page and graph.eager_bytes > graph.bytes_moved
    for decision in graph.decisions:
        assert decision.reason in page
    sources = [k for k in graph.kernels if k.source]
    assert sources and page.count("<details class='source'>") == len(sources)
    for kernel in sources:
        assert html.escape(kernel.source, quote=True) in page
    # Self-contained: no scripts, stylesheets or images from anywhere else.
    assert not re.search(r"<script|<link|<img|src=|@import|url\((?!#)", page)


def test_report_drawing_edges_follow_buffers(tmp_path):
    _, report = make_report(tmp_path)
    from torchfuse.diagnostics.html import draw_graph

    (graph,) = report.graphs
    svg = draw_graph(graph)
    edges = svg.count("class='edge'")
    reads = sum(len(k.reads) for k in graph.kernels)
    assert edges == reads + len(set(graph.output_buffers))  # one per buffer read, one per output


# -- in a real browser --------------------------------------------------------------------------------
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless Chromium is not installed (.ci/run installs Debian's `chromium`; "
                "install it with `apt-get install -y chromium` to run this test)")


def run_chromium(*args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="torchfuse-chromium-")
    try:
        return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--hide-scrollbars", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.slow
def test_browser_parses_the_drawing(tmp_path):
    path, report = make_report(tmp_path)
    run = run_chromium("--dump-dom", f"file://{path}")
    dom = run.stdout
    assert "kernel-graph" in dom, run.stderr[-2000:]
    (graph,) = report.graphs
    boxes = re.findall(r'<rect class="kernel (\w+)"', dom)
    assert sorted(boxes) == sorted(k.kind for k in graph.kernels)
    assert len(re.findall(r'<path class="edge"', dom)) > 0


@pytest.mark.slow
def test_browser_draws_the_kernels(tmp_path):
    path, report = make_report(tmp_path)
    shot = str(tmp_path / "shot.png")
    run = run_chromium("--window-size=1000,900", f"--screenshot={shot}", f"file://{path}")
    assert os.path.exists(shot), run.stderr[-2000:]
    pixels = read_png(shot)
    (graph,) = report.graphs
    for kind in {k.kind for k in graph.kernels}:
        color = np.array([int(FILLS[kind][i:i + 2], 16) for i in (1, 3, 5)])
        painted = int((np.abs(pixels[..., :3].astype(int) - color).max(-1) <= 3).sum())
        # each box is about 270 x 60 pixels; allow for text drawn over it
        assert painted > 5000, f"{kind} boxes are not drawn ({painted} pixels of {FILLS[kind]})"


def read_png(path: str) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG (what Chromium writes) to an HxWxC array."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and interlace == 0 and color in (2, 6), header
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(np.int32)
        if kind == 1:
            line = _unfilter_left(line, previous, channels, lambda a, b, c: a)
        elif kind == 2:
            line = (line + previous) % 256
        elif kind == 3:
            line = _unfilter_left(line, previous, channels, lambda a, b, c: (a + b) // 2)
        elif kind == 4:
            line = _unfilter_left(line, previous, channels, _paeth)
        rows[y] = line
        previous = line.astype(np.int32)
    return rows.reshape(height, width, channels)


def _unfilter_left(line: np.ndarray, above: np.ndarray, channels: int, predict) -> np.ndarray:
    out = [0] * len(line)
    values, up = line.tolist(), above.tolist()
    for i in range(len(values)):
        a = out[i - channels] if i >= channels else 0
        c = up[i - channels] if i >= channels else 0
        out[i] = (values[i] + predict(a, up[i], c)) % 256
    return np.array(out, dtype=np.int32)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)
