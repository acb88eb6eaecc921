"""OpInfo sweep: every op of PyTorch's ``op_db`` on its sample inputs, compiled and compared with eager.

    python scripts/opinfo_sweep.py --target cpp --json sweep-cpp.json
    python scripts/opinfo_sweep.py --target triton --ops add,sum,cat
    python scripts/opinfo_sweep.py --backends torchfuse,inductor --workers 2 --max-samples 3 --json both.json
    python scripts/opinfo_sweep.py --device cuda --dtype bfloat16 --backends torchfuse,inductor --workers 14 \\
        --max-samples 3 --deadline 500 --json bf16.json          # then --resume bf16.json to go on
    python scripts/opinfo_sweep.py --table both.json old-inductor.json

Each sample's outcome, per backend, is one of:
  pass      the compiled result matches eager (float64 reference decides the tolerance)
  mismatch  a wrong result (the worst outcome)
  error     the compiler raised (torchfuse's strict mode turns internal errors into exceptions)
  skip      eager itself fails, the op is random/nondeterministic, or it has no samples of the dtype
An op's outcome is its worst sample's (mismatch > error > pass; skip when every sample skipped).

With several ``--backends`` each sample is made once and run by every backend (eager and the
float64 reference once too), so the counts are side by side on the same samples. Ops run in
``--workers`` processes taking ops from one queue: an op that hangs past ``--timeout`` or crashes
its process is an error of the backend that was running it, and the worker is restarted.
``--deadline`` stops handing out ops after that many seconds and writes the results so far, with
the ops not run listed; ``--resume`` continues such a file.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

# Run from a checkout without installing: the worktree's src/ first, and the root for `scripts.`.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(_ROOT, "src"), _ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from scripts.opinfo_pool import OpRecord, Pool, SweepConfig  # noqa: E402
from scripts.opinfo_run import (NONDETERMINISTIC, OUTCOMES, TOLERANCE, Backend, OpResult, SampleResult,  # noqa: E402,F401
                                _SEVERITY, all_ops, compare, run_op, run_op_side_by_side, worst_outcome)

Records = dict[str, OpRecord]  # by op name


# ---------------------------------------------------------------------------------------------
# Counting


def summarize(records: Records, label: str) -> dict[str, Any]:
    """One backend's counts over the records that have it."""
    results = [r.runs[label] for r in records.values() if label in r.runs]
    ops = {o: sorted(r.name for r in results if r.outcome == o) for o in OUTCOMES}
    samples = {o: sum(1 for r in results for s in r.samples if s.outcome == o) for o in OUTCOMES}
    eager_only = sum(1 for r in results for s in r.samples if s.outcome == "pass" and s.detail.startswith("no graph"))
    seconds = sum(r.seconds for r in results)
    return {"op_counts": {o: len(ops[o]) for o in OUTCOMES}, "sample_counts": samples,
            "passes_without_a_graph": eager_only, "seconds": round(seconds, 1),
            "seconds_per_op": round(seconds / max(1, len(results)), 3), "ops": ops}


def outcomes_by_sample(records: Records, label: str) -> dict[tuple[str, int], SampleResult]:
    return {(r.name, s.index): s for r in records.values() if label in r.runs for s in r.runs[label].samples}


def side_by_side(records: Records, first: str, second: str) -> dict[str, Any]:
    """Both backends on the samples both ran: counts, and the samples one passes and the other not."""
    a, b = outcomes_by_sample(records, first), outcomes_by_sample(records, second)
    common = sorted(set(a) & set(b))

    def only(mine: dict, theirs: dict) -> list[dict[str, Any]]:
        return [{"op": op, "index": index, "other": theirs[op, index].outcome, "detail": theirs[op, index].detail[:300]}
                for op, index in common if mine[op, index].outcome == "pass" and theirs[op, index].outcome != "pass"]

    return {"backends": [first, second], "samples": len(common),
            "sample_counts": {label: {o: sum(1 for k in common if runs[k].outcome == o) for o in OUTCOMES}
                              for label, runs in ((first, a), (second, b))},
            f"{first} passes, {second} does not": only(a, b), f"{second} passes, {first} does not": only(b, a)}


def all_side_by_side(records: Records, labels: list[str]) -> list[dict[str, Any]]:
    return [side_by_side(records, x, y) for i, x in enumerate(labels) for y in labels[i + 1:]]


# ---------------------------------------------------------------------------------------------
# Results files


def load_records(path: str, max_samples: int | None = None) -> tuple[list[str], Records]:
    """The labels and ops of a results file (this format or the single-backend one before it),
    cut to the first ``max_samples`` samples so that counts stay comparable."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") == 2:
        labels, records = data["labels"], {r["name"]: OpRecord.from_dict(r) for r in data["results"]}
    else:
        labels = [data["label"]]
        records = {}
        for raw in data["results"]:
            samples = [SampleResult(**s) for s in raw["samples"]]
            result = OpResult(raw["name"], raw["outcome"], samples, raw.get("seconds", 0.0))
            records[raw["name"]] = OpRecord(raw["name"], {data["label"]: result}, raw.get("seconds", 0.0))
    for record in records.values():
        for result in record.runs.values():
            if max_samples is not None and len(result.samples) > max_samples:
                result.samples = result.samples[:max_samples]
                result.outcome = worst_outcome(result.samples)
    return labels, records


def write_json(path: str, args: argparse.Namespace, config: SweepConfig, records: Records, not_run: list[str],
               elapsed: float) -> None:
    labels = config.labels
    data = {"format": 2, "labels": labels, "device": config.device, "dtype": config.dtype,
            "max_samples": config.max_samples, "workers": args.workers, "seconds": round(elapsed, 1),
            "complete": not not_run, "not_run": sorted(not_run),
            "summary": {label: summarize(records, label) for label in labels},
            "side_by_side": all_side_by_side(records, labels),
            "results": [records[name].to_dict() for name in sorted(records)]}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # an interrupted write never leaves half a file


# ---------------------------------------------------------------------------------------------
# Printing


def _counts_row(counts: dict[str, int]) -> str:
    return " ".join(f"{counts[o]:>8}" for o in OUTCOMES)


def print_summary(records: Records, labels: list[str], title: str) -> None:
    print(f"\n== {title}")
    print(f"{'backend':20} samples: " + " ".join(f"{o:>8}" for o in OUTCOMES) + "  |  ops: "
          + " ".join(f"{o:>8}" for o in OUTCOMES) + "  |  s/op  no-graph passes")
    summaries = {label: summarize(records, label) for label in labels}
    for label, s in summaries.items():
        print(f"{label:20}          {_counts_row(s['sample_counts'])}  |       {_counts_row(s['op_counts'])}  |"
              f" {s['seconds_per_op']:5.2f}  {s['passes_without_a_graph']}")
    for pair in all_side_by_side(records, labels):
        first, second = pair["backends"]
        print(f"\nside by side on the {pair['samples']} samples both ran:")
        for label, counts in pair["sample_counts"].items():
            print(f"  {label:20} " + "  ".join(f"{o} {n}" for o, n in counts.items()))
        for key in (f"{first} passes, {second} does not", f"{second} passes, {first} does not"):
            print(f"  {key}: {len(pair[key])}")
            for item in pair[key][:40]:
                print(f"    {item['op']} sample {item['index']}: {item['other']}: {item['detail'][:160]}")
    for label in labels:
        _print_failures(records, label, skips=label == labels[0])


def _print_failures(records: Records, label: str, skips: bool) -> None:
    """Mismatches and errors (every failing sample), then skipped ops (only for the first backend)."""
    results = sorted((r.runs[label] for r in records.values() if label in r.runs), key=lambda r: r.name)
    for outcome in ("mismatch", "error") + (("skip",) if skips else ()):
        chosen = [r for r in results if r.outcome == outcome]
        if not chosen:
            continue
        print(f"\n-- {label}: {outcome} ({len(chosen)} ops)")
        for result in chosen:
            if outcome == "skip":
                print(f"  {result.name}: {result.first_detail[:160]}")
                continue
            for s in (s for s in result.samples if s.outcome == outcome):
                print(f"  {result.name} sample {s.index}: {s.detail}" + (f"\n      inputs: {s.sample}" if s.sample else ""))


def print_table(paths: list[str]) -> None:
    """Sample and op counts of several runs, restricted to the (op, sample) pairs every run has.

    A file of several backends gives one run per backend (named ``backend [file]`` where several
    files have that backend).
    """
    loaded = [(path, *load_records(path)) for path in paths]
    seen = [label for _, labels, _ in loaded for label in labels]
    repeated = {label for label in seen if seen.count(label) > 1}
    runs: dict[str, dict[tuple[str, int], str]] = {}
    for path, labels, records in loaded:
        for label in labels:
            name = f"{label} [{os.path.basename(path)}]" if label in repeated else label
            runs[name] = {k: s.outcome for k, s in outcomes_by_sample(records, label).items()}
    common = set.intersection(*(set(outcomes) for outcomes in runs.values()))
    print(f"{len(common)} samples of {len({op for op, _ in common})} ops ran in every run")
    print(f"{'run':28} " + " ".join(f"{o:>9}" for o in OUTCOMES) + "   ops: " + " ".join(f"{o:>8}" for o in OUTCOMES))
    for label, outcomes in runs.items():
        samples = {o: sum(1 for key in common if outcomes[key] == o) for o in OUTCOMES}
        per_op: dict[str, str] = {}
        for (op, _), outcome in ((key, outcomes[key]) for key in common):
            per_op[op] = max(per_op.get(op, "skip"), outcome, key=_SEVERITY.__getitem__)
        ops = {o: sum(1 for v in per_op.values() if v == o) for o in OUTCOMES}
        print(f"{label:28} " + " ".join(f"{samples[o]:>9}" for o in OUTCOMES) + "        "
              + " ".join(f"{ops[o]:>8}" for o in OUTCOMES))
    labels = list(runs)
    for i, first in enumerate(labels):
        for second in labels[i + 1:]:
            a = sum(1 for k in common if runs[first][k] == "pass" and runs[second][k] != "pass")
            b = sum(1 for k in common if runs[second][k] == "pass" and runs[first][k] != "pass")
            print(f"{first} vs {second}: passes only {first}: {a}, only {second}: {b}")


class Progress:
    """Collects records as workers finish them: failures at once, counts every ``every`` ops, the
    results file every 20 ops or 30 s."""

    def __init__(self, records: Records, total: int, labels: list[str], every: int, save) -> None:
        self.records, self.total, self.labels, self.every, self.save = records, total, labels, max(1, every), save
        self.start = self.saved = time.monotonic()
        self.done = 0

    def __call__(self, record: OpRecord) -> None:
        self.records[record.name] = record
        self.done += 1
        elapsed = time.monotonic() - self.start
        for label, result in record.runs.items():
            bad = result.first_bad
            if result.outcome in ("mismatch", "error") and bad is not None:
                print(f"[{self.done}/{self.total}] {record.name}: {label} {result.outcome} at sample {bad.index}: "
                      f"{bad.detail[:200]}", flush=True)
        if self.done % self.every == 0 or self.done == self.total:
            counts = " | ".join(f"{label}: " + " ".join(f"{o} {n}" for o, n in self._counts(label).items())
                                for label in self.labels)
            print(f"[{self.done}/{self.total} ops, {elapsed:.0f} s] samples {counts}", flush=True)
        if self.done % 20 == 0 or time.monotonic() - self.saved > 30:
            self.save()
            self.saved = time.monotonic()

    def _counts(self, label: str) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for record in self.records.values():
            for s in record.runs[label].samples if label in record.runs else ():
                counts[s.outcome] += 1
        return counts


# ---------------------------------------------------------------------------------------------
# The command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="", help="comma-separated op names (op_db names, e.g. add,sum,nn.functional.pad)")
    parser.add_argument("--backends", "--backend", default="torchfuse",
                        help="comma-separated: torchfuse, torchfuse:TARGET, inductor (all run on the same samples)")
    parser.add_argument("--target", default=None, choices=["cpp", "triton", "aten"],
                        help="torchfuse's target (default: cpp on cpu, triton on cuda)")
    parser.add_argument("--device", default="cpu", help="where samples are made: cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    parser.add_argument("--limit", type=int, default=None, help="at most this many ops")
    parser.add_argument("--shard", default=None, metavar="I/N", help="only every N-th op, starting at the I-th (0-based)")
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many samples per op")
    parser.add_argument("--workers", type=int, default=1, help="processes running ops in parallel")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads per worker (default: cores / workers)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per op before its worker is killed")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start after which no op is handed out (results so far are written)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds past --deadline that running ops may finish")
    parser.add_argument("--progress", type=int, default=20, help="print the counts every this many ops")
    parser.add_argument("--json", default=None, help="write the results here (also while running)")
    parser.add_argument("--table", nargs="+", default=None, metavar="JSON",
                        help="print counts of several --json files side by side on the samples all of them ran")
    parser.add_argument("--update", default=None, help="a --json file: run the --ops again and replace their "
                        "results in it (after a fix), keeping the other ops")
    parser.add_argument("--resume", default=None, help="a --json file of an interrupted sweep: keep its ops "
                        "(samples beyond --max-samples dropped) and run only the others")
    return parser.parse_args(argv)


def make_config(args: argparse.Namespace) -> SweepConfig:
    device_type = args.device.split(":")[0]
    target = args.target or ("triton" if device_type == "cuda" else "cpp")
    backends = []
    for spec in filter(None, (b.strip() for b in args.backends.split(","))):
        name, _, own_target = spec.partition(":")  # torchfuse:aten names its target
        if name not in ("torchfuse", "inductor") or (own_target and own_target not in ("cpp", "triton", "aten")):
            raise SystemExit(f"unknown backend {spec!r} (torchfuse, torchfuse:TARGET, inductor)")
        backends.append(Backend(name, own_target or target))
    if not backends or len({b.label for b in backends}) != len(backends):
        raise SystemExit(f"--backends {args.backends!r}: name each backend once")
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.workers))
    return SweepConfig(tuple(backends), args.dtype, args.device, args.max_samples, threads)


def select_ops(args: argparse.Namespace) -> list[str]:
    names = sorted(all_ops())
    if args.ops:
        wanted = [n.strip() for n in args.ops.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise SystemExit(f"unknown ops: {unknown}")
        names = wanted
    if args.shard:
        index, count = (int(x) for x in args.shard.split("/"))
        names = names[index::count]
    return names[: args.limit] if args.limit else names


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse_args(argv)
    if args.table:
        print_table(args.table)
        return 0
    config = make_config(args)
    names = select_ops(args)
    records: Records = {}
    for path in filter(None, (args.resume, args.update)):
        if path == args.resume and not os.path.exists(path):
            continue  # a first call may --resume the file it is to write
        labels, old = load_records(path, args.max_samples)
        if set(labels) != set(config.labels):
            raise SystemExit(f"{path} has the backends {labels}, not {config.labels}")
        records = {n: r for n, r in old.items() if path == args.resume or n not in names}
    todo = [n for n in names if n not in records]
    json_path = args.json or args.update

    def not_run() -> list[str]:  # while running too: a file written then is complete only at the end
        return [n for n in names if n not in records]

    def save() -> None:
        if json_path:
            write_json(json_path, args, config, records, not_run(), time.monotonic() - start)

    kept = f" ({len(names) - len(todo)} kept from {args.resume or args.update})" if len(todo) < len(names) else ""
    print(f"{len(todo)} ops to run{kept}, {config.dtype} on {config.device}, {', '.join(config.labels)}, "
          f"{args.workers} workers x {config.threads} threads", flush=True)
    # `timeout` (or a Ctrl-C) ends the sweep through the finally below: the results so far are written.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)) if in_main_thread else None
    pool = Pool(config, args.workers)
    deadline = None if args.deadline is None else args.deadline - (time.monotonic() - start)
    try:
        pool.run(todo, Progress(records, len(todo), config.labels, args.progress, save), args.timeout, deadline, args.grace)
    finally:
        save()
        elapsed, missing = time.monotonic() - start, not_run()
        title = (f"{config.dtype} on {config.device}: {len(names) - len(missing)} of {len(names)} ops run, "
                 f"max {args.max_samples or 'all'} samples per op, {args.workers} workers, {elapsed:.0f} s")
        print_summary({n: r for n, r in records.items() if n in set(names)}, config.labels, title)
        if missing:
            print(f"\nnot run ({len(missing)}; --resume runs them): {', '.join(sorted(missing))}")
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
