"""Measure compiling Triton kernels ahead: serial in this process against the worker pool, and a
warm process loading the stored binaries against going through Triton's own cache.

    python scripts/measure_compile_ahead.py [--kernels 32] [--workers 0]

Each phase runs in a fresh process with fresh cache directories where it must (cold), or the
directories an earlier phase filled (warm). Kernels are softmax-like row reductions over rows of
1024, one distinct constant each, so no two share a binary. The target is the current GPU, else
sm_90 (Triton compiles for it without a GPU). Prints one line per phase.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def kernels(count: int):
    import torch

    from torchfuse.codegen.triton.kernel import TritonKernel
    from torchfuse.runtime import kernel_cache
    from torchfuse.runtime.launch import PointerArg
    from torchfuse.runtime.predict import PredictedLaunch

    made = {}
    for i in range(count):
        function = f"tf_red_measure{i}"
        source = (f"@jit\ndef {function}(ptr0, ptr1, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):\n"
                  "    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]\n"
                  "    rindex = tl.arange(0, RBLOCK)[None, :]\n"
                  "    xmask = xindex < xnumel\n"
                  "    rmask = rindex < rnumel\n"
                  "    x = tl.load(ptr0 + xindex * rnumel + rindex, xmask & rmask, other=0).to(tl.float32)\n"
                  f"    x = libdevice.erf(x * {i + 1}.5) + tl.sigmoid(x)\n"
                  "    m = tl.max(tl.where(rmask, x, float('-inf')), 1)[:, None]\n"
                  "    e = tl.exp(x - m)\n"
                  "    s = tl.sum(tl.where(rmask, e, 0), 1)[:, None]\n"
                  "    tl.store(ptr1 + xindex * rnumel + rindex, (e / s).to(tl.float16), xmask & rmask)\n")
        kernel = TritonKernel(f"kernel{i}", source, ["a", "b"], [], 4096, 1024, "reduction", True, function=function)
        fn = kernel_cache.load_kernel(source, function, interpret=False)
        launch = PredictedLaunch(4096, 1024, (PointerArg(torch.float32, True), PointerArg(torch.float16, True)))
        made[kernel.name] = (kernel, fn, launch)
    return made


def phase(name: str, count: int) -> dict:
    """One phase, in this (fresh) process."""
    from torchfuse.runtime import binary_cache, compile_pool, triton_ahead

    target = triton_ahead.current_target() or triton_ahead.Target("cuda", 90, 32)
    made = kernels(count)
    started = time.perf_counter()
    if name == "serial":  # what the first launches do today: triton.compile, one after another
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        for kernel, fn, launch in made.values():
            spec = triton_ahead.specialize(fn, kernel, launch, target)
            triton.compile(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs),
                           target=GPUTarget(target.backend, target.arch, target.warp_size), options=spec.options)
    elif name in ("pool", "warm"):  # compile ahead (cold: the pool; warm: all from disk) and load each
        ready = triton_ahead.compile_ahead({k: m[0] for k, m in made.items()}, {k: m[1] for k, m in made.items()},
                                           {k: m[2] for k, m in made.items()}, target=target)
        for _, loader in ready.values():
            if loader.future is not None:
                assert loader.future.result()["ok"]
            entry = binary_cache.lookup(triton_ahead.binaries_root(), loader.key)
            assert triton_ahead.load_compiled(loader.fn, loader.spec, entry) is not None
        if name == "warm":
            assert compile_pool.stats.submitted == 0, "a warm process compiled"
    elif name == "triton-warm":  # the alternative: Triton's own cache, filled by the workers' compiles
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        for kernel, fn, launch in made.values():
            spec = triton_ahead.specialize(fn, kernel, launch, target)
            triton.compile(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs),
                           target=GPUTarget(target.backend, target.arch, target.warp_size), options=spec.options)
    seconds = time.perf_counter() - started
    return {"phase": name, "kernels": count, "seconds": seconds, "workers": compile_pool.worker_count(),
            "worker_seconds": compile_pool.stats.worker_seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0, help="pool size (default: TORCHFUSE_COMPILE_WORKERS or CPUs)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.kernels)))
        return
    env = dict(os.environ)
    if args.workers:
        env["TORCHFUSE_COMPILE_WORKERS"] = str(args.workers)
    cold = tempfile.mkdtemp(prefix="tf-measure-serial-")
    warm = tempfile.mkdtemp(prefix="tf-measure-pool-")
    plan = [("serial", cold), ("pool", warm), ("warm", warm), ("triton-warm", warm)]
    for name, root in plan:
        run_env = dict(env, TORCHFUSE_CACHE_DIR=root, TRITON_CACHE_DIR=os.path.join(root, "triton-cache"))
        out = subprocess.run([sys.executable, __file__, "--phase", name, "--kernels", str(args.kernels)],
                             env=run_env, capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode or not lines:
            print(f"{name}: failed\n{out.stderr[-3000:]}")
            continue
        result = json.loads(lines[-1])
        print(f"{name:12s} {result['kernels']} kernels: {result['seconds']:.2f} s "
              f"({1000 * result['seconds'] / result['kernels']:.1f} ms each; pool of {result['workers']}, "
              f"{result['worker_seconds']:.2f} s of work in workers)")


if __name__ == "__main__":
    main()
