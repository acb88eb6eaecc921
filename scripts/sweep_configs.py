"""Time a wide grid of launch configs for each reduction kernel of some micro cases (GPU).

``mode="max-autotune"`` times the default and a few neighbours (``autotune_configs``); to choose
better *defaults* the whole neighbourhood is wanted: every XBLOCK that fits and 1 to 16 warps
(persistent), with a few RBLOCKs, plain and pipelined row loops (looped). This swaps the tuner's candidate list
for that grid, runs each case once under max-autotune with a fresh cache (tuning happens at the
first launch), and prints each kernel's configs fastest first, with GB/s for the bytes the
report says the kernel moves.

    python3 scripts/sweep_configs.py --cases short_rows_layer_norm,window_softmax --out out/sweep
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
os.environ["TORCHFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="sweep_configs_")  # nothing from disk

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench import bandwidth  # noqa: E402
from torchfuse.bench.patterns import BY_NAME, MODEL_SIZED  # noqa: E402
from torchfuse.runtime import autotune, autotune_configs  # noqa: E402
from torchfuse.runtime.launch_configs import Config, reduction_config  # noqa: E402

WARPS = (1, 2, 4, 8, 16)
MAX_TILE = 16384
STAGES = autotune_configs.PIPELINED_STAGES  # a looped kernel's row loop, pipelined (Config.num_stages)


def grid(kind: str, persistent: bool, outer: bool, xnumel: int, rnumel: int, live_tiles: int = 0,
         special_step: int = 0, chunk_lanes: int = 0) -> list[Config]:
    """The default first, then every config of the grid the kernel computes correctly with; a
    looped one's tiles both with the plain row loop and with a pipelined one (STAGES)."""
    if kind != "reduction":
        return autotune_configs.candidate_configs(kind, persistent, outer, xnumel, rnumel, live_tiles, special_step,
                                                  chunk_lanes)
    default = reduction_config(persistent, xnumel, rnumel, outer, live_tiles, special_step, chunk_lanes)
    rblock = default.constexprs[1]
    rblocks = [rblock] if persistent else sorted({max(2, rblock // 4), max(2, rblock // 2), rblock, rblock * 2})
    found = [default]
    for rblock in rblocks:
        for xblock in (2 ** i for i in range(13)):
            if xblock * rblock > MAX_TILE:
                break
            for warps in (WARPS if persistent else WARPS[1:4]):
                for stages in ((None,) if persistent else (None, STAGES)):
                    config = autotune_configs._make(xnumel, xblock, rblock, warps, stages)
                    if config not in found and _fits(config, persistent, outer, xnumel, rnumel):
                        found.append(config)
    return found


def _fits(config: Config, persistent: bool, outer: bool, xnumel: int, rnumel: int) -> bool:
    saved = autotune_configs.MAX_TILE
    autotune_configs.MAX_TILE = MAX_TILE
    try:
        return autotune_configs._valid(config, "reduction", persistent, outer, xnumel, rnumel)
    finally:
        autotune_configs.MAX_TILE = saved


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--size", default="bench")
    parser.add_argument("--keep", type=int, default=12, help="configs printed per kernel")
    parser.add_argument("--out", default="out/sweep")
    args = parser.parse_args()
    timed: list[dict] = []
    time_all = autotune.KernelTuner._time_all

    def recording(self, launcher, key, xnumel, rnumel, run_args, candidates, timer):
        timings, launches = time_all(self, launcher, key, xnumel, rnumel, run_args, candidates, timer)
        timed.append({"function": self.function, "persistent": self.persistent, "outer": self.outer,
                      "xnumel": xnumel, "rnumel": rnumel,
                      "timings": [(autotune.describe(c), s * 1e6) for c, s in timings]})
        return timings, launches

    autotune.KernelTuner._time_all = recording
    autotune.candidate_configs = grid
    results = []
    for name in args.cases.split(","):
        pattern = {**BY_NAME, **MODEL_SIZED}[name]
        inputs = pattern.make_inputs("cuda", torch.bfloat16, args.size)
        first = len(timed)
        graphs = len(torchfuse.report().graphs)
        torchfuse.compile(pattern.fn, mode="max-autotune")(*inputs)
        torch.cuda.synchronize()
        sizes = bandwidth.generated_kernel_bytes(torchfuse.report().graphs[graphs:])
        for entry in timed[first:]:
            moved = sizes.get(entry["function"], [0])[0]
            ordered = sorted(entry["timings"], key=lambda t: t[1])
            default_us = entry["timings"][0][1]
            kind = ("persistent" if entry["persistent"] else "looped") + (", outer" if entry["outer"] else "")
            print(f"\n{name}: {entry['function']} ({kind}) {entry['xnumel']} x {entry['rnumel']}, "
                  f"{moved / 1e6:.0f} MB; default {entry['timings'][0][0]}: {default_us:.1f} us")
            for config, us in ordered[:args.keep]:
                print(f"  {us:8.1f} us {moved / us / 1e3 if us else 0:7.0f} GB/s  {config}")
            results.append({"case": name, "bytes": moved, **entry})
        torch._dynamo.reset()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
