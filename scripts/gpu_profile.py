"""Profile whole-model GPU steps: eager, Inductor and torchfuse in one process (bench/profile.py).

    python3 scripts/gpu_profile.py --cases gpt2_infer,llama_stack_infer --out $OUT/profile
    python3 scripts/gpu_profile.py --backends eager,inductor-max-autotune,torchfuse,torchfuse-max-autotune

Backends are those of `torchfuse bench` (runner.BACKENDS): the -ro ones use mode="reduce-overhead",
the -max-autotune ones mode="max-autotune" (autotuning happens in the three settling steps,
before anything is profiled).

Per case and backend: wall ms per step, summed GPU kernel ms, wall/GPU, kernel launches, host ms
to issue the step and host microseconds per launch, and the memory a step allocates at its peak;
then torchfuse's top kernels, and its generated kernels' bandwidth against a copy
(bench/bandwidth.py: the worst three of 64 MB or more are printed, every kernel's is in
profile.json). Prints a table and writes profile.json. torchfuse's launch counters say how
many launches went straight to a compiled binary. With --host-profile N, N more steps of each backend run under cProfile
(host_<case>_<backend>.txt: the functions by own time and by cumulative time), to see where
the host time of a host-bound step goes. With --graph-times N, N more steps of each compiler run with
each compiled graph's own code timed: host ms a step inside the graphs and outside them
(Dynamo's guards, aot_autograd's runtime wrappers and autograd). With --op-profile N, N more steps run under
torch.profiler, CPU side only (ops_<case>_<backend>.txt: ATen ops by their own host time and by
their total, with call counts), to see what an ATen call does on the host (the copies, adds and
allocations inside a convolution, say).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import torchfuse  # noqa: E402
from torchfuse.bench import bandwidth  # noqa: E402
from torchfuse.bench.measure import copy_bandwidth_gbs, peak_memory_mb  # noqa: E402
from torchfuse.bench.runner import BACKENDS  # noqa: E402
from torchfuse.bench.suites import select  # noqa: E402
from torchfuse.bench.compile_time import compiler_for, use_fresh_caches, warm_up_compilers  # noqa: E402
from torchfuse.bench.profile import format_profiles, profile_steps  # noqa: E402
from torchfuse.runtime import launch  # noqa: E402


GENERATED = ("tf_", "triton_")  # torchfuse's and Inductor's kernel names


def generated_split(rows: list) -> str:
    """Per case and backend: GPU ms in generated kernels and in the rest (GEMMs, convolutions,
    ATen kernels), within the kept top kernels: where a backend's kernel time differs."""
    lines = [f"{'case':<22} {'backend':<10} {'generated':>9} {'launches':>8} {'other':>8} {'(top kept)':>10}"]
    for case, backend, p in rows:
        generated = [k for k in p.top if k.name.startswith(GENERATED)]
        lines.append(f"{case:<22} {backend:<10} {sum(k.ms for k in generated):9.3f} "
                     f"{sum(k.calls for k in generated):8.0f} {sum(k.ms for k in p.top) - sum(k.ms for k in generated):8.3f} "
                     f"{len(p.top):10d}")
    return "\n".join(lines)


def autotune_gains(count: int = 30) -> list[dict]:
    """The tuned launches whose chosen config beat the default the most (max-autotune timed
    both): which default block sizes leave the most on the table."""
    entries = [e for g in torchfuse.report().graphs for e in g.autotune
               if e.microseconds is not None and e.default_microseconds is not None]
    entries.sort(key=lambda e: e.microseconds - e.default_microseconds)
    return [{"kernel": e.kernel, "sizes": e.sizes, "default": e.default, "default_us": e.default_microseconds,
             "chosen": e.config, "chosen_us": e.microseconds} for e in entries[:count]]


def host_profile(step, steps: int, path: Path) -> None:
    """``steps`` calls of ``step`` under cProfile, written to ``path``: the top functions by own
    time, then by cumulative time (cProfile slows Python calls, so read shares, not microseconds)."""
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(f"{steps} steps\n")
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(45)
    stats.print_callees(r"_ops.py.*__call__|launch.py.*__call__")  # ATen externs, our launches
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())


# Host seconds spent inside compiled graphs' own code (torchfuse's wrappers, Inductor's
# CompiledFxGraph calls), by compiler, while ``--graph-times`` hooks are installed.
graph_seconds: dict[str, float] = {"torchfuse": 0.0, "inductor": 0.0}


def install_graph_timers() -> None:
    """Time every call of a compiled graph's own code, per compiler: what is left of a step's
    host time is Dynamo's guards, aot_autograd's runtime wrappers and autograd, the same
    machinery for both compilers. Script-side only (it patches Inductor's class)."""
    from torchfuse.runtime import wrapper

    bind = wrapper.bind_wrapper

    def timed_bind(*args, **kwargs):
        call = bind(*args, **kwargs)

        def timed(inputs):
            start = time.perf_counter()
            try:
                return call(inputs)
            finally:
                graph_seconds["torchfuse"] += time.perf_counter() - start
        return timed

    wrapper.bind_wrapper = timed_bind
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:
        return
    inductor_call = CompiledFxGraph.__call__

    def timed_call(self, inputs):
        start = time.perf_counter()
        try:
            return inductor_call(self, inputs)
        finally:
            graph_seconds["inductor"] += time.perf_counter() - start

    CompiledFxGraph.__call__ = timed_call


def graph_times(step, backend: str, steps: int) -> tuple[float, float]:
    """(host ms a step, of which inside the compiled graphs' own code) over ``steps`` steps."""
    compiler = "inductor" if backend.startswith("inductor") else "torchfuse"
    graph_seconds[compiler] = 0.0
    total = 0.0
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        total += time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e3 * total / steps, 1e3 * graph_seconds[compiler] / steps


def op_profile(step, steps: int, path: Path) -> None:
    """``steps`` calls of ``step`` under torch.profiler (CPU activity only: no CUPTI), written to
    ``path``: the ops by self host time, then by total host time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    text = (f"{steps} steps\n" + averages.table(sort_by="self_cpu_time_total", row_limit=40)
            + "\n" + averages.table(sort_by="cpu_time_total", row_limit=40))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_sources(graphs, top, count: int, folder: Path, slow_big: list[str] = ()) -> None:
    """The slowest ``count`` generated kernels of ``top``, and those named in ``slow_big`` (the
    kernels of 64 MB or more below issue 16's share of copy bandwidth), each as its source headed
    by what the report says it reads and writes, to read their index math offline."""
    by_name: dict[str, list] = {}
    for graph in graphs:
        for kernel in graph.kernels:
            name = bandwidth.kernel_function_name(kernel.source)
            if name:
                by_name.setdefault(name, []).append(kernel)
    folder.mkdir(parents=True, exist_ok=True)
    slowest = [k for k in sorted(top, key=lambda k: -k.ms) if k.name in by_name][:count]
    slowest += [k for k in top if k.name in slow_big and k.name in by_name and k not in slowest]
    for timed in slowest:
        kernels = by_name[timed.name]
        header = "".join(f"# {k.name} ({k.label}): reads {k.reads}, writes {k.writes}\n" for k in kernels[:4])
        (folder / f"{timed.name}.py").write_text(
            f"# {timed.ms:.3f} ms a step over {timed.calls:.0f} calls\n{header}\n{kernels[0].source}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="", help="comma-separated model case names (default: all GPU models)")
    parser.add_argument("--backends", default="eager,inductor,torchfuse")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=400, help="kernels kept per case and backend")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--host-profile", type=int, default=0, metavar="STEPS",
                        help="also run STEPS steps per backend under cProfile (host_<case>_<backend>.txt)")
    parser.add_argument("--op-profile", type=int, default=0, metavar="STEPS",
                        help="also run STEPS steps per backend under torch.profiler, CPU side (ops_<case>_<backend>.txt)")
    parser.add_argument("--sources", type=int, default=0, metavar="N",
                        help="write the sources of torchfuse's N slowest generated kernels a case "
                             "and every one of 64 MB or more below 70%% of copy bandwidth "
                             "(sources_<case>/<kernel>.py, headed by the buffers each reads and writes)")
    parser.add_argument("--graph-times", type=int, default=0, metavar="STEPS",
                        help="also time STEPS steps per backend with each compiled graph's own code timed "
                             "(host ms a step, and how much of it runs inside the graphs)")
    parser.add_argument("--out", default="out/profile")
    args = parser.parse_args()
    if args.graph_times:
        install_graph_timers()
    warnings.filterwarnings("ignore")
    use_fresh_caches()
    device = torch.device("cuda")
    backends = args.backends.split(",")
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        print(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
        return 2
    warm_up_compilers(backends, device)
    copy_gbs = copy_bandwidth_gbs(device)
    rows, tops, failures, peaks, graph_rows, graph_calls = [], {}, {}, {}, [], {}
    for case in select("models", device, set(filter(None, args.cases.split(","))) or None):
        if case.missing():
            continue
        workload = case.build(device, args.quick)
        graphs_before = len(torchfuse.report().graphs)  # this case's graphs size its kernels
        steps = {}
        for backend in backends:
            try:
                steps[backend] = workload.make_step(compiler_for(backend))
                for _ in range(3):  # compile and settle: nothing compiles while profiling
                    steps[backend]()
            except Exception as exc:  # noqa: BLE001 - one backend failing must not end the run
                traceback.print_exc()
                failures[f"{case.name}/{backend}"] = f"{type(exc).__name__}: {exc}"[:300]
                steps.pop(backend, None)
        # Memory a step allocates beyond what was live before it (issue 16: at most eager's).
        peaks[case.name] = {backend: peak_memory_mb(step, device) for backend, step in steps.items()}
        before = (launch.stats.direct, launch.stats.through_triton)
        try:
            # Backends timed in turn, round by round (profile_steps): the machine's slow spells
            # fall on all of them alike.
            profiles = profile_steps(steps, args.steps, top=args.top)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            failures[f"{case.name}/profile"] = f"{type(exc).__name__}: {exc}"[:300]
            profiles = {}
        for backend, profile in profiles.items():
            rows.append((case.name, backend, profile))
            if backend.startswith("torchfuse"):
                sizes = bandwidth.generated_kernel_bytes(torchfuse.report().graphs[graphs_before:])
                shares = bandwidth.kernel_bandwidths(profile.top, sizes, copy_gbs)
                tops[case.name if backend == "torchfuse" else f"{case.name} ({backend})"] = {
                    "top": [asdict(k) for k in profile.top], "direct": launch.stats.direct - before[0],
                    "through_triton": launch.stats.through_triton - before[1],
                    "bandwidth": [row.as_dict() for row in shares],
                    "autotune_gains": autotune_gains() if "max-autotune" in backend else []}
                if args.sources and backend == "torchfuse":
                    slow_big = [row.name for row in shares
                                if row.bytes >= bandwidth.BIG_KERNEL_BYTES and row.share < bandwidth.TARGET_SHARE]
                    write_sources(torchfuse.report().graphs[graphs_before:], profile.top, args.sources,
                                  Path(args.out) / f"sources_{case.name}", slow_big)
        # Each case's figures as soon as it is done: a call cut short by its time limit keeps them.
        print(format_profiles([row for row in rows if row[0] == case.name]), flush=True)
        if "torchfuse-ro" in steps:  # how the CUDA-graph runner took this case's calls (issue 15)
            graph_calls[case.name] = dict(sum((g.cudagraphs for g in torchfuse.report().graphs[graphs_before:]),
                                              collections.Counter()))
            print(f"{case.name} torchfuse-ro graph calls: {graph_calls[case.name]}", flush=True)
        for backend, step in steps.items():
            if args.graph_times and backend != "eager":
                host_ms, inside_ms = graph_times(step, backend, args.graph_times)
                graph_rows.append((case.name, backend, host_ms, inside_ms))
                print(f"{case.name:<22} {backend:<10} host {host_ms:8.3f} ms a step, in compiled graphs "
                      f"{inside_ms:8.3f}, outside {host_ms - inside_ms:8.3f}", flush=True)
            if args.host_profile:
                host_profile(step, args.host_profile, Path(args.out) / f"host_{case.name}_{backend}.txt")
            if args.op_profile:
                op_profile(step, args.op_profile, Path(args.out) / f"ops_{case.name}_{backend}.txt")
        del steps
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps({
        "rows": [{"case": c, "backend": b, **asdict(p), "host_us_per_launch": p.host_us_per_launch}
                 for c, b, p in rows], "torchfuse_top": tops, "failures": failures, "copy_gbs": copy_gbs,
        "peak_mb": peaks, "cudagraph_calls": graph_calls, "graph_times": [{"case": c, "backend": b, "host_ms": h, "in_graphs_ms": i}
                                          for c, b, h, i in graph_rows]}, indent=1))
    for case, info in tops.items():
        print(f"\n{case}: torchfuse launches (all torchfuse backends of the case) direct {info['direct']}, "
              f"through Triton {info['through_triton']}")
        for kernel in info["top"][:5]:
            print(f"  {kernel['ms']:8.3f} ms  x{kernel['calls']:.0f}  {kernel['name']}")
        print("  " + bandwidth.format_bandwidths(case, [bandwidth.KernelBandwidth(**row) for row in info["bandwidth"]])
              + f" (copy {copy_gbs:.0f} GB/s)")
    print("\npeak MB a step beyond what was live before it:")
    for case, by_backend in peaks.items():
        print(f"  {case:<22} " + "  ".join(f"{b} {mb:.0f}" for b, mb in by_backend.items()))
    for name, failure in failures.items():
        print(f"FAILED {name}: {failure}")
    print()
    print(format_profiles(rows))
    print(generated_split(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
