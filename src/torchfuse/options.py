"""User options of ``torchfuse.compile``, validated once (no global config)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TARGETS = ("auto", "triton", "cpp", "aten")
STAGES = ("aten", "ir", "schedule", "kernels", "wrapper")


@dataclass(frozen=True)
class Options:
    target: str = "auto"  # "triton" forces Triton (its interpreter on CPU tensors); "cpp": C++ (CPU)
    strict: bool = False  # raise on internal compile errors instead of running ATen
    dump: tuple[str, ...] = ()  # stages whose output is printed: see STAGES
    mode: str = "default"
    cache_dir: str | None = None
    check: bool = False  # also run each graph with ATen and compare (slow; for debugging)
    # Time candidate block sizes of each Triton kernel at its first launch and keep the fastest
    # (runtime/autotune.py); on by default in the max-autotune modes.
    autotune: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_user(options: dict[str, Any] | None, mode: str = "default") -> "Options":
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        options = dict(options or {})
        valid = [f.name for f in fields(Options) if f.name not in ("mode", "extra")]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"unknown torchfuse option(s) {unknown}; valid options: {', '.join(valid)}")
        if options.get("target", "auto") not in TARGETS:
            raise ValueError(f"unknown target {options['target']!r}; valid targets: {', '.join(TARGETS)}")
        dump = options.get("dump", ())
        dump = (dump,) if isinstance(dump, str) else tuple(dump)
        bad = [d for d in dump if d not in STAGES]
        if bad:
            raise ValueError(f"unknown dump stage(s) {bad}; valid stages: {', '.join(STAGES)}")
        options["dump"] = dump
        if not isinstance(options.setdefault("autotune", mode.startswith("max-autotune")), bool):
            raise ValueError(f"option 'autotune' must be True or False, not {options['autotune']!r}")
        return Options(mode=mode, **options)
