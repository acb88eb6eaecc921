"""Worker processes for the OpInfo sweep: ops from one queue, each op in one worker at a time.

A worker is a spawned process that imports torch and ``op_db`` once, then runs the ops it is
handed (every backend on the same samples, ``opinfo_run.run_op_side_by_side``) and tells its parent
what it is doing: ``("at", label, index)`` before a backend compiles a sample, ``("sample", label,
result)`` after each sample and ``("done", record)`` at the end of the op. An op that hangs past
the timeout or crashes its worker is recorded as an error of the backend that was compiling or
running it (the samples before it keep their results) and the worker is restarted; a worker whose
CUDA context a kernel broke exits after its op and is restarted too.

Past the deadline no op is handed out; ops still running after the grace period are stopped and,
like the ops never handed out, listed as not run, so a later ``--resume`` runs them.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from scripts.opinfo_run import (Backend, CudaContextLost, OpResult, SampleResult, configure_dynamo, run_op_side_by_side,
                                worst_outcome)

_START_TIMEOUT = 300.0  # seconds for a worker to import torch and op_db
_START_FAILURES = 5  # workers dying before they are ready: then something is broken, stop


@dataclass(frozen=True)
class SweepConfig:
    backends: tuple[Backend, ...]
    dtype: str
    device: str = "cpu"
    max_samples: int | None = None
    threads: int = 1  # intra-op (and OpenMP) threads of each worker

    @property
    def labels(self) -> list[str]:
        return [b.label for b in self.backends]


@dataclass
class OpRecord:
    """One op: each backend's results on the same samples, by label."""

    name: str
    runs: dict[str, OpResult]
    seconds: float = 0.0  # wall time in the worker: samples, eager, reference and every backend

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 3),
                "runs": {label: {"outcome": r.outcome, "seconds": r.seconds, "samples": [asdict(s) for s in r.samples]}
                         for label, r in self.runs.items()}}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "OpRecord":
        runs = {label: OpResult(data["name"], run["outcome"], [SampleResult(**s) for s in run["samples"]],
                                run.get("seconds", 0.0))
                for label, run in data["runs"].items()}
        return OpRecord(data["name"], runs, data.get("seconds", 0.0))


def run_in_process(name: str, config: SweepConfig, notify=None) -> OpRecord:
    """One op in this process (what a worker does), a failure of the sweep itself kept as an error."""
    start = time.perf_counter()
    try:
        runs = run_op_side_by_side(name, list(config.backends), config.dtype, config.max_samples, config.device, notify)
    except CudaContextLost:
        raise
    except Exception as error:  # noqa: BLE001 - report it, keep the worker alive
        detail = f"sweep: {type(error).__name__}: {str(error).strip()[:300]}"
        runs = {label: OpResult(name, "error", [SampleResult(0, "error", detail)]) for label in config.labels}
    return OpRecord(name, runs, time.perf_counter() - start)


def _worker(conn, config: SweepConfig) -> None:
    # Before torch is imported: one OpenMP pool per worker of `threads` threads, and Inductor
    # compiling in this process (its default pool of compile processes per worker would be
    # workers x cores processes).
    os.environ["OMP_NUM_THREADS"] = str(config.threads)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    from scripts.opinfo_run import all_ops

    torch.set_num_threads(config.threads)
    configure_dynamo()
    all_ops()
    conn.send(("ready",))

    faults = _faults()

    def notify(label: str, index: int, result: SampleResult | None) -> None:
        conn.send(("at", label, index) if result is None else ("sample", label, asdict(result)))
        if result is None and (current, label.replace(" ", "-"), index) in faults:
            _fail(faults[current, label.replace(" ", "-"), index])

    while True:
        name = current = conn.recv()
        if name is None:
            return
        start = time.perf_counter()
        try:
            record = run_in_process(name, config, notify)
        except CudaContextLost as lost:  # report what ran, then exit: this process can use CUDA no more
            conn.send(("done", OpRecord(name, lost.op_results, time.perf_counter() - start).to_dict()))
            return
        conn.send(("done", record.to_dict()))


def _faults() -> dict[tuple[str, str, int], str]:
    """Faults to inject, for testing the sweep itself: ``$OPINFO_SWEEP_FAULTS`` holds items
    ``op:label:sample:crash`` or ``op:label:sample:hang`` separated by commas, the label's spaces
    written as dashes (``add:torchfuse-cpp:1:crash``)."""
    items = [item.rsplit(":", 3) for item in os.environ.get("OPINFO_SWEEP_FAULTS", "").split(",") if item]
    return {(op, backend, int(index)): what for op, backend, index, what in items}


def _fail(what: str) -> None:
    if what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3600)


class Worker:
    """The parent's side of one worker process: what it runs and what it has reported."""

    def __init__(self, config: SweepConfig) -> None:
        self.config = config
        self.process: Any = None
        self.conn: Any = None
        self.ready = False
        self.since = 0.0  # when it started, or when it was handed its op
        self.op: str | None = None
        self.at: tuple[str, int] | None = None  # the backend and sample it is compiling or running
        self.partial: dict[str, list[SampleResult]] = {}

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        process = context.Process(target=_worker, args=(child, self.config), daemon=True)
        try:
            process.start()
        finally:
            child.close()  # the child holds its end: a crash then reads as end of file here
        self.process = process
        self.ready, self.since, self.op = False, time.monotonic(), None

    def assign(self, name: str) -> None:
        self.conn.send(name)
        self.op, self.since, self.at = name, time.monotonic(), None
        self.partial = {label: [] for label in self.config.labels}

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def messages(self) -> list[tuple]:
        """What it has sent; ("eof",) last when the process has gone."""
        out = []
        try:
            while self.conn.poll(0):
                out.append(self.conn.recv())
        except (EOFError, OSError):
            out.append(("eof",))
        return out

    def partial_record(self, why: str) -> OpRecord:
        """The op's results so far, with ``why`` as an error of the backend that was running."""
        runs = {label: list(samples) for label, samples in self.partial.items()}
        if self.at is not None:
            label, index = self.at
            runs[label].append(SampleResult(index, "error", f"{why} (compiling or running this sample)"))
        else:  # before any backend ran a sample: the samples or eager
            for label in runs:
                runs[label].append(SampleResult(len(runs[label]), "error", f"sweep: {why} (outside the backends)"))
        # A backend that ran none of the samples is left out of the record (it did not run the op).
        name = self.op or "?"
        results = {label: OpResult(name, worst_outcome(s), s, round(sum(r.seconds for r in s), 3))
                   for label, s in runs.items() if s}
        return OpRecord(name, results, time.monotonic() - self.since)

    def ask_to_stop(self, kill: bool = False) -> None:
        """Kill it, or ask it to exit after its op (``stop`` then waits)."""
        if self.process is None:
            return
        if kill or not self.process.is_alive():
            self.process.kill()
            return
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            self.process.kill()

    def stop(self, kill: bool = False, wait: float = 5.0) -> None:
        if self.process is None:
            return
        self.ask_to_stop(kill)
        self.process.join(wait)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()
        self.process, self.ready, self.op = None, False, None


class Pool:
    """``workers`` processes sharing one queue of ops."""

    def __init__(self, config: SweepConfig, workers: int) -> None:
        self.config = config
        self.workers = [Worker(config) for _ in range(max(1, workers))]
        self.not_run: list[str] = []  # after run(): the ops it did not finish (deadline, interruption)
        self._start_failures = 0

    def run(self, names: list[str], on_record: Callable[[OpRecord], None], timeout: float,
            deadline: float | None = None, grace: float = 30.0) -> list[str]:
        """Run ``names``, calling ``on_record`` with each op's record; returns the ops not run.

        ``deadline`` (seconds from now): hand out no op after it; ops still running ``grace``
        seconds later are stopped. ``timeout``: seconds one op may take.
        """
        start = time.monotonic()
        pending = deque(names)
        self.not_run = []
        try:
            while pending or any(w.op for w in self.workers):
                elapsed = time.monotonic() - start
                if deadline is not None and elapsed > deadline and pending:
                    self.not_run.extend(pending)
                    pending.clear()
                for worker in self.workers:
                    if worker.process is None:  # (re)started while there is work for it
                        if pending:
                            worker.start()
                        continue
                    self._service(worker, on_record, timeout)
                    if worker.op and deadline is not None and elapsed > deadline + grace:
                        self.not_run.append(worker.op)
                        worker.stop(kill=True)
                    if worker.ready and worker.op is None and pending:
                        worker.assign(pending.popleft())
                self._wait()
        finally:
            self.not_run += list(pending) + [w.op for w in self.workers if w.op]
            for worker in self.workers:  # all at once: each takes a moment to exit
                worker.ask_to_stop(kill=bool(worker.op) or not worker.ready)
            for worker in self.workers:
                worker.stop(kill=bool(worker.op) or not worker.ready)
        return self.not_run

    def _service(self, worker: Worker, on_record: Callable[[OpRecord], None], timeout: float) -> None:
        """Read the worker's messages; record a finished, crashed or timed-out op (and stop the worker)."""
        for message in worker.messages():
            kind = message[0]
            if kind == "ready":
                worker.ready, self._start_failures = True, 0
            elif kind == "at":
                worker.at = (message[1], message[2])
            elif kind == "sample":
                worker.partial[message[1]].append(SampleResult(**message[2]))
                worker.at = None
            elif kind == "done":
                on_record(OpRecord.from_dict(message[1]))
                worker.op, worker.at = None, None
            elif kind == "eof":
                worker.process.join(2)  # for its exit code
                self._lost(worker, on_record, f"worker crashed (exit code {worker.process.exitcode})")
                return
        now = time.monotonic()
        if worker.op and now - worker.since > timeout:
            self._lost(worker, on_record, f"timeout after {timeout:.0f} s")
        elif not worker.ready and now - worker.since > _START_TIMEOUT:
            self._lost(worker, on_record, "worker did not start")
        elif worker.process is not None and not worker.alive():  # (or exited after a CUDA error, its op reported)
            self._lost(worker, on_record, f"worker crashed (exit code {worker.process.exitcode})")

    def _lost(self, worker: Worker, on_record: Callable[[OpRecord], None], why: str) -> None:
        if worker.op:
            on_record(worker.partial_record(why))
        elif not worker.ready:
            self._start_failures += 1
            if self._start_failures > _START_FAILURES:
                raise RuntimeError(f"workers keep failing to start ({why}); see their output above")
        worker.stop(kill=True)

    def _wait(self) -> None:
        """Until a worker says something or exits, or a second passes (timeouts are checked then)."""
        handles = [h for w in self.workers if w.process is not None for h in (w.conn, w.process.sentinel)]
        if handles:
            wait(handles, timeout=1.0)
