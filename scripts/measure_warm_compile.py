"""Cold and warm compile times of a few CPU models, with the warm cache (frontend/aot_cache.py) on
and off: how much of a later process's compile AOTAutograd's tracing was, and what is left.

    PYTHONPATH=src python scripts/measure_warm_compile.py [--cases llama_block_train,gpt2_infer,...]
    PYTHONPATH=src python scripts/measure_warm_compile.py --device cuda --cases gpt2_infer --profile 40

For each case: a cold process (fresh cache directories), then ``--repeats`` rounds of three warm
processes: the warm cache off (TORCHFUSE_AOT_CACHE=0: every graph traced, as before it existed),
on, and Dynamo's capture alone (backend="eager"); alternating, so that a busy machine slows all
three alike. Each process times the first call as ``torchfuse bench`` does
(bench/compile_time.timed_first_call: imports and device start-up paid by a tiny warm-up first);
the medians are printed with the split of diagnostics/compile_times.py (and the GC's seconds).

On a GPU (``--device cuda``) the cases are the bench's (bench/models.py, full size). ``--profile N``
also runs one warm torchfuse process and one Dynamo-alone process under cProfile and prints the N
functions whose cumulative time differs most between them: where a warm torchfuse first call
spends what Dynamo alone does not.

The cold process also prints torchfuse's own seconds by stage (``GraphReport.stage_seconds``,
summed over the graphs). ``--cold-workers 8,0`` adds a cold process per compile-pool size
(``TORCHFUSE_COMPILE_WORKERS``), each with fresh caches; ``--cold-profile N`` one more cold process
under cProfile, printing the N torchfuse functions of most cumulative time.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Callable

import torch
import torch.nn.functional as F

import torchfuse

CASES = ("llama_block_train", "gpt2_infer", "bert_mlm_train")


def build(case: str) -> tuple[torch.nn.Module, dict, bool]:
    """(model, keyword inputs, training) of a small float32 CPU case with seeded weights."""
    torch.manual_seed(0)
    if case == "llama_block_train":
        from torchfuse.models import make_llama_block

        model, x = make_llama_block("cpu", torch.float32, "small")
        return model.train(), {"x": x}, True
    if case == "gpt2_infer":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=_layers(), n_embd=128, n_head=4, vocab_size=1000, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg).eval(), {"input_ids": torch.randint(0, 1000, (2, 64))}, False
    if case == "bert_mlm_train":
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(num_hidden_layers=_layers(), hidden_size=128, num_attention_heads=4, intermediate_size=512,
                         vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        ids = torch.randint(0, 1000, (2, 64))
        labels = torch.where(torch.rand(2, 64) < 0.15, ids, torch.full_like(ids, -100))
        return BertForMaskedLM(cfg).train(), {"input_ids": ids, "labels": labels}, True
    raise ValueError(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def _layers() -> int:
    """The CPU transformers' depth (``--layers``): 12 gives the GPU model's graph and parameter
    count at small widths, where the warm path's per-node and per-parameter costs show."""
    return int(os.environ.get("MEASURE_LAYERS", "2"))


def step_of(case: str, compiler: Callable) -> Callable[[], Any]:
    model, inputs, training = build(case)
    compiled = compiler(model)

    def step() -> Any:
        if not training:
            with torch.no_grad():
                return compiled(**inputs)
        out = compiled(**inputs)
        loss = out.loss if hasattr(out, "loss") else F.mse_loss(out, torch.zeros_like(out))
        loss.backward()
        return loss

    return step


def maker(case: str, device: torch.device) -> Callable[[Callable], Callable[[], Any]]:
    """``make(compiler)`` -> the case's step compiled with ``compiler``."""
    if device.type == "cpu":
        return lambda compiler: step_of(case, compiler)
    from torchfuse.bench.suites import select

    (bench_case,) = select("all", device, {case})
    workload = bench_case.build(device, False)
    return workload.make_step


def child(case: str, backend: str, device_name: str, profile: str) -> None:
    from torchfuse.bench.compile_time import compiler_for, timed_first_call, warm_up_compilers

    device = torch.device(device_name)
    warm_up_compilers([backend], device)
    make = maker(case, device)
    make(compiler_for("eager"))()  # the model's own first-call costs
    graphs_before = len(torchfuse.report().graphs)  # the warm-up's graphs are not the case's
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    first = timed_first_call(lambda: make(compiler_for(backend)), device)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    print(json.dumps({"seconds": first.seconds, "backend": first.backend_seconds, "split": first.split,
                      "stages": stage_totals(graphs_before)}), flush=True)


def stage_totals(skipped: int) -> dict[str, float]:
    """torchfuse's own seconds by stage, summed over the process's graphs after the first ``skipped``."""
    totals: dict[str, float] = {}
    for graph in torchfuse.report().graphs[skipped:]:
        for stage, seconds in graph.stage_seconds.items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    return totals


def run(case: str, backend: str, caches: str, device: str = "cpu", profile: str = "", **env: str) -> dict[str, Any]:
    variables = dict(os.environ, TORCHFUSE_CACHE_DIR=os.path.join(caches, "torchfuse"),
                     TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"), **env)
    proc = subprocess.run([sys.executable, __file__, "--child", case, backend, device, profile], capture_output=True,
                          text=True, env=variables)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{case} {backend} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number over the runs."""
    split = {k: statistics.median(r["split"].get(k, 0.0) for r in runs) for k in runs[0]["split"]}
    return {"seconds": statistics.median(r["seconds"] for r in runs), "split": split}


def describe(name: str, measured: dict[str, Any]) -> str:
    split = measured["split"]
    parts = (f"capture {split.get('capture', 0):.2f} / aot {split.get('aot', 0):.2f} / ours {split.get('ours', 0):.2f}"
             f" / c++ {split.get('cpp', 0):.2f}; gc {split.get('gc', 0):.2f}; warm cache hits "
             f"{split.get('aot_hits', 0):.0f}, misses {split.get('aot_misses', 0):.0f}")
    stages = measured.get("stages") or {}
    by_stage = ", ".join(f"{k} {v:.2f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]) if v >= 0.01)
    return f"  {name:<22} {measured['seconds']:6.2f} s  {parts}" + (f"\n{'':26}ours by stage: {by_stage}" if by_stage else "")


def cold_profile(path: str, top: int) -> None:
    """The torchfuse functions of most cumulative seconds in a cold first call's profile."""
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    rows = sorted(((v[3], v[2], f"{f.split('src/')[-1]}:{line}({name})") for (f, line, name), v in stats.items()
                   if "torchfuse" in f), reverse=True)
    print(f"  cold torchfuse first call under cProfile, top {top} torchfuse functions (cumulative, own s):")
    for cumulative, own, name in rows[:top]:
        print(f"    {cumulative:8.3f} {own:8.3f}  {name}")


def profile_difference(torchfuse_stats: str, dynamo_stats: str, top: int) -> None:
    """The functions whose cumulative and own seconds differ most between the two profiles."""
    def seconds(path: str, column: int) -> dict[str, float]:
        stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
        return {f"{f.split('site-packages/')[-1]}:{line}({name})": v[column] for (f, line, name), v in stats.items()}

    for title, column in (("cumulative", 3), ("own", 2)):
        ours, theirs = seconds(torchfuse_stats, column), seconds(dynamo_stats, column)
        rows = sorted(((ours.get(k, 0.0) - theirs.get(k, 0.0), k) for k in ours.keys() | theirs.keys()), reverse=True)
        print(f"  warm torchfuse minus Dynamo alone, {title} seconds (top {top}; torchfuse, Dynamo alone):")
        for difference, name in rows[:top]:
            print(f"    {difference:+8.3f}  {ours.get(name, 0.0):7.3f}  {theirs.get(name, 0.0):7.3f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, help="print this many functions of a profile difference")
    parser.add_argument("--cold-workers", default="", help="comma-separated compile-pool sizes for more cold runs")
    parser.add_argument("--cold-profile", type=int, default=0, help="profile one more cold run; print this many")
    parser.add_argument("--layers", type=int, default=2, help="the CPU transformers' depth")
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    os.environ["MEASURE_LAYERS"] = str(args.layers)  # the children inherit it
    if args.child:
        child(*args.child)
        return
    for case in args.cases.split(","):
        caches = tempfile.mkdtemp(prefix="torchfuse-warm-")
        print(case)
        print(describe("cold", run(case, "torchfuse", caches, args.device)), flush=True)
        for workers in filter(None, args.cold_workers.split(",")):
            fresh = tempfile.mkdtemp(prefix="torchfuse-cold-")
            measured = run(case, "torchfuse", fresh, args.device, TORCHFUSE_COMPILE_WORKERS=workers)
            print(describe(f"cold, {workers} workers", measured), flush=True)
        if args.cold_profile:
            fresh = tempfile.mkdtemp(prefix="torchfuse-cold-")
            run(case, "torchfuse", fresh, args.device, os.path.join(fresh, "cold.prof"))
            cold_profile(os.path.join(fresh, "cold.prof"), args.cold_profile)
        rounds: dict[str, list] = {"warm, warm cache off": [], "warm": [], "Dynamo's capture alone": []}
        for _ in range(args.repeats):
            rounds["warm, warm cache off"].append(run(case, "torchfuse", caches, args.device, TORCHFUSE_AOT_CACHE="0"))
            rounds["warm"].append(run(case, "torchfuse", caches, args.device))
            rounds["Dynamo's capture alone"].append(run(case, "dynamo", caches, args.device))
        for name, runs in rounds.items():
            print(describe(name + f" (median of {len(runs)})", median(runs)), flush=True)
        if args.profile:
            paths = [os.path.join(caches, f"{backend}.prof") for backend in ("torchfuse", "dynamo")]
            run(case, "torchfuse", caches, args.device, paths[0])
            run(case, "dynamo", caches, args.device, paths[1])
            profile_difference(*paths, args.profile)


if __name__ == "__main__":
    main()
