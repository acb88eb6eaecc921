"""``scripts/ab_policy.py --plan``: the launches a policy variant would make, found without a GPU
(fake CUDA), so that an A/B's variants are known to differ before device time is spent."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_a_variant_that_fills_looped_outer_grids_doubles_a_column_sums_first_stage():
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ab_policy.py"), "--plan", "--cases", "column_sum",
         "--variant", "fill528=torchfuse.runtime.launch_configs:LOOPED_OUTER_MIN_PROGRAMS=528"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines() if ":" in line}
    # [16384, 4096] bf16 summed over the rows: the split's first stage (its second follows),
    # pipelined (launch_configs.LIGHT_OUTER_PIPELINE: half the tile's rows, 2 warps)
    assert "grid 512 [128 x 16] w2 134 MB" in lines["default"]
    assert "grid 1024 [64 x 16] w2 134 MB" in lines["fill528"]
