"""Where compile time went in this process: Dynamo's capture, AOTAutograd, torchfuse, the compilers.

Read from counters that only grow (Dynamo's timers, the graphs' stage times, the C++ build and
GPU compile statistics), so ``snapshot()`` taken before and after a call and subtracted
(``minus``) gives that call's split: what ``torchfuse bench`` does around each first call.

- capture: Dynamo's compile minus the part inside the backend;
- AOTAutograd: the backend minus torchfuse's own stages (its tracing, partitioning, wrappers);
- torchfuse: lowering, scheduling, code generation, loading (``GraphReport.stage_seconds``),
  which includes the C++ compiler, shown apart;
- GPU kernels: Triton compiles in the worker pool (summed over workers: they run beside all of
  the above) and the time first launches waited for them (on the critical path, outside the
  backend), plus launches Triton compiled itself at a first launch (not predicted, or failed);
- autotuning (max-autotune): first launches choosing their block sizes, candidates' compiles
  (or waits for them) and timing included; launches timed, and choices read from disk.
- the warm cache (frontend/aot_cache.py): captured graphs whose AOTAutograd result came from disk
  (hits: no tracing) and those traced (misses), and the seconds rebuilding the hits (inside
  "AOTAutograd", with our stages' share of it inside "torchfuse").
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from torchfuse.diagnostics.model import GraphReport
from torchfuse.frontend import aot_cache
from torchfuse.frontend.dynamo_events import BACKEND_TIMER, DYNAMO_TIMER, dynamo_timer_seconds
from torchfuse.runtime import autotune, compile_pool, cpp_build, launch, triton_ahead


@dataclass(frozen=True)
class CompileTimes:
    dynamo_s: float = 0.0  # Dynamo's frame compiles, backend included
    backend_s: float = 0.0  # the part inside the backend (AOTAutograd and torchfuse)
    ours_s: float = 0.0  # torchfuse's stages, the C++ compiler included
    cpp_compiler_s: float = 0.0  # the C++ compiler's runs
    gpu_workers_s: float = 0.0  # Triton compiles in the worker pool, summed over workers
    gpu_wait_s: float = 0.0  # first launches waiting for a worker's compile
    gpu_ahead: int = 0  # binaries compiled ahead (workers) or found on disk
    gpu_compiled: int = 0  # of which compiled by a worker (a warm process must have none)
    gpu_jit_launches: int = 0  # launches through Triton's JIT (a first launch of a specialization)
    autotune_s: float = 0.0  # first launches choosing their configs (max-autotune)
    autotuned: int = 0  # launches whose candidates were timed (a warm process must have none)
    autotune_from_disk: int = 0  # launches whose choice an earlier process stored
    aot_hits: int = 0  # captured graphs the warm cache served: AOTAutograd did not trace them
    aot_misses: int = 0  # looked up and not found: traced (and stored)
    aot_hit_s: float = 0.0  # rebuilding the hits (loading, our stages from the graph cache, wrappers)

    @property
    def capture_s(self) -> float:
        return max(0.0, self.dynamo_s - self.backend_s)

    @property
    def aot_s(self) -> float:
        return max(0.0, self.backend_s - self.ours_s)

    def minus(self, before: "CompileTimes") -> "CompileTimes":
        """What was added since ``before`` (never negative: ``torchfuse.reset()`` drops graphs)."""
        return CompileTimes(**{f.name: max(0, getattr(self, f.name) - getattr(before, f.name)) for f in fields(self)})

    def as_dict(self) -> dict[str, float]:
        """The split in seconds, as the benchmark records it."""
        return {"capture": self.capture_s, "aot": self.aot_s, "ours": self.ours_s - self.cpp_compiler_s,
                "cpp": self.cpp_compiler_s, "gpu_wait": self.gpu_wait_s, "gpu_workers": self.gpu_workers_s,
                "gpu_compiled": float(self.gpu_compiled), "gpu_jit_launches": float(self.gpu_jit_launches),
                "autotune": self.autotune_s, "autotuned": float(self.autotuned),
                "autotune_from_disk": float(self.autotune_from_disk),
                "aot_hits": float(self.aot_hits), "aot_misses": float(self.aot_misses), "aot_hit": self.aot_hit_s}

    def __str__(self) -> str:
        text = (f"compile time: Dynamo capture {self.capture_s:.2f} s, AOTAutograd {self.aot_s:.2f} s, "
                f"torchfuse {self.ours_s - self.cpp_compiler_s:.2f} s, C++ compiler {self.cpp_compiler_s:.2f} s")
        if self.gpu_ahead or self.gpu_workers_s or self.gpu_jit_launches:
            text += (f"; GPU kernels: {self.gpu_ahead} compiled ahead, {self.gpu_compiled} of them by workers "
                     f"({self.gpu_workers_s:.2f} s in workers, "
                     f"first runs waited {self.gpu_wait_s:.2f} s), {self.gpu_jit_launches} launches through "
                     "Triton's JIT")
        if self.autotuned or self.autotune_from_disk:
            text += (f"; autotune: {self.autotuned} launch{'' if self.autotuned == 1 else 'es'} timed, "
                     f"{self.autotune_from_disk} choices from disk, "
                     f"{self.autotune_s:.2f} s")
        return text


def snapshot(graphs: list[GraphReport]) -> CompileTimes:
    """The counters now; ``graphs`` are the process's compiled graphs (``report().graphs``)."""
    return CompileTimes(
        dynamo_s=dynamo_timer_seconds(DYNAMO_TIMER), backend_s=dynamo_timer_seconds(BACKEND_TIMER),
        ours_s=sum(sum(g.stage_seconds.values()) for g in graphs), cpp_compiler_s=cpp_build.stats.compiler_seconds,
        gpu_workers_s=compile_pool.stats.worker_seconds, gpu_wait_s=triton_ahead.stats.wait_seconds,
        gpu_ahead=triton_ahead.stats.predicted, gpu_compiled=triton_ahead.stats.compiled,
        gpu_jit_launches=launch.stats.through_triton, autotune_s=autotune.stats.seconds,
        autotuned=autotune.stats.timed, autotune_from_disk=autotune.stats.from_disk, aot_hits=aot_cache.stats.hits,
        aot_misses=aot_cache.stats.misses, aot_hit_s=aot_cache.stats.hit_seconds)


def compile_events() -> int:
    """Compiles started in this process so far: launches through Triton's JIT, C++ compiler runs
    and jobs sent to the GPU compile workers. The benchmark checks it does not move while timing."""
    return launch.stats.through_triton + cpp_build.stats.compiler_calls + compile_pool.stats.submitted
