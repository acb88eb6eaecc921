"""A pool of compile worker processes, started once per process and shared by every graph.

Triton compiles a kernel in Python and MLIR, holding the GIL for much of it, so kernels compile in
parallel only in separate processes (``compile_worker.py``). Each worker is a fresh interpreter
started with fork and exec (``subprocess``), never a forked copy of this process, which may hold
CUDA state. One feeder thread per worker sends it a job and waits for the reply (blocking on a
pipe releases the GIL); jobs are taken in submission order.

``submit`` returns a ``Future`` per job and gives every caller of the same key the same future,
so a kernel two graphs (or two layers) need is compiled once. A worker that dies fails its job
(the caller then compiles that kernel itself, at its first launch) and is replaced.

The pool is sized by ``TORCHFUSE_COMPILE_WORKERS`` (0 turns compiling ahead off), else by the
CPUs this process may use (its affinity, bounded by a container's CPU quota), at most
``MAX_WORKERS``. Workers start when the pool is first asked for (``get_pool``), ideally while
Dynamo and AOTAutograd still trace, and stop at exit.
"""
from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchfuse.runtime import progress
from torchfuse.runtime.compile_worker import BOOT, read_message, write_message

MAX_WORKERS = 32
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the directory holding torchfuse/


@dataclass
class PoolStats:
    submitted: int = 0  # distinct jobs sent to workers
    finished: int = 0  # of which answered (done or failed)
    shared: int = 0  # submissions answered by a job already submitted (same key)
    failed: int = 0  # jobs that failed (compile error or a dead worker)
    workers_started: int = 0
    worker_seconds: float = 0.0  # time workers spent on jobs, summed


stats = PoolStats()


def worker_count() -> int:
    """``TORCHFUSE_COMPILE_WORKERS``, else the CPUs this process may use (``usable_cpus``), at most
    ``MAX_WORKERS``."""
    configured = os.environ.get("TORCHFUSE_COMPILE_WORKERS", "").strip()
    if configured:
        return max(0, int(configured))
    return max(1, min(usable_cpus(), MAX_WORKERS))


def usable_cpus() -> int:
    """The CPUs this process may run on, bounded by its control group's CPU quota: a container
    limited to 16 CPUs of a 192-CPU host sees all 192 in its affinity mask, and a worker per
    CPU there would starve the process that traces the model (the quota throttles them all)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, quota)) if quota is not None else cpus


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, membership: str | None = None) -> int | None:
    """CPUs' worth of time this process's control group may use a period, rounded up: the
    smallest ``cpu.max`` (cgroup v2) of its group and the groups above it, or v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; None when unlimited or unreadable.
    ``membership``: the text of /proc/self/cgroup (tests give their own)."""
    try:
        if membership is None:
            membership = Path("/proc/self/cgroup").read_text()
        limits = [limit for limit in map(_v2_limit, _v2_groups(root, membership)) if limit is not None]
        if not limits and (root / "cpu" / "cpu.cfs_quota_us").exists():
            limits = [_ratio(int((root / "cpu" / "cpu.cfs_quota_us").read_text()),
                             int((root / "cpu" / "cpu.cfs_period_us").read_text()))]
    except (OSError, ValueError):
        return None
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def _v2_groups(root: Path, membership: str) -> list[Path]:
    """The v2 group directories from this process's group up to ``root`` (a container's
    namespace shows its own group as "/", the root)."""
    paths = [line.split("::", 1)[1].strip() for line in membership.splitlines() if line.startswith("0::")]
    group = root / paths[0].lstrip("/") if paths else root
    groups = [group]
    while group != root and root in group.parents:
        group = group.parent
        groups.append(group)
    return groups


def _v2_limit(group: Path) -> int | None:
    limit = group / "cpu.max"
    if not limit.exists():
        return None
    quota, period = limit.read_text().split()[:2]  # "max 100000" (unlimited) or "1600000 100000"
    return None if quota == "max" else _ratio(int(quota), int(period))


def _ratio(quota: int, period: int) -> int | None:
    """CPUs a quota of ``quota`` microseconds per ``period`` allows, rounded up (None: no quota)."""
    return -(-quota // period) if quota > 0 and period > 0 else None


class WorkerDied(RuntimeError):
    """A worker process exited (or closed its pipe) before replying."""


class _Worker:
    """One worker process and its pipes; used by one feeder thread at a time."""

    def __init__(self) -> None:
        # Its stderr (Triton's warnings, a crash's traceback) goes to a file, read back on death.
        self.log: IO[bytes] = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-c", BOOT, PACKAGE_PARENT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, close_fds=True)
        stats.workers_started += 1

    def request(self, job: dict) -> dict:
        try:
            write_message(self.process.stdin, job)
            reply = read_message(self.process.stdout)
        except (BrokenPipeError, OSError, EOFError) as error:
            raise WorkerDied(self._last_words()) from error
        if reply is None:
            raise WorkerDied(self._last_words())
        return reply

    def _last_words(self) -> str:
        code = self.process.poll()
        self.log.seek(0)
        tail = self.log.read()[-2000:].decode(errors="replace").strip()
        return f"compile worker {self.process.pid} died (exit {code}): {tail or 'no output'}"

    def close(self) -> None:
        """Ask the worker to exit: it returns from serve() at the end of its input."""
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def reap(self, deadline: float) -> None:
        """Wait for the worker until ``deadline`` (a ``time.monotonic`` time), then kill it."""
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()  # a compile in flight: its entry is never renamed into place
            self.process.wait()
        self.log.close()


class CompilePool:
    """``workers`` compile processes fed from one queue of jobs."""

    def __init__(self, workers: int) -> None:
        self.size = workers
        self._jobs: queue.Queue[tuple[dict, Future] | None] = queue.Queue()
        self._by_key: dict[tuple[str | None, str], Future] = {}
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._closed = False
        for index in range(workers):
            worker = _Worker()  # starts now, so its imports overlap with the caller's work
            self._workers.append(worker)
            threading.Thread(target=self._feed, args=(index,), name=f"torchfuse-compile-{index}", daemon=True).start()

    def submit(self, job: dict) -> Future:
        """Compile ``job`` (a ``compile_worker`` job with a ``key``) in a worker; one future per key
        and cache root (a job whose key was compiled into another root, before the cache directory
        changed, still writes its binary where the caller will look)."""
        identity = (job.get("root"), job["key"])
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile pool was shut down")
            future = self._by_key.get(identity)
            if future is not None:
                stats.shared += 1
                return future
            future = Future()
            self._by_key[identity] = future
            stats.submitted += 1
        self._jobs.put((job, future))
        return future

    def ping(self) -> list[dict]:
        """One reply from each worker's process (tests: is it alive, did it import torch). The
        feeders meet at a barrier before sending their ping, so no feeder takes two (a quick
        worker once answered both pings of a two-worker pool)."""
        futures = []
        barrier = threading.Barrier(self.size)
        for _ in range(self.size):
            future: Future = Future()
            self._jobs.put(({"kind": "ping", "key": None}, future, barrier))
            futures.append(future)
        return [f.result() for f in futures]

    def _feed(self, index: int) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, future, *barrier = item
            if not future.set_running_or_notify_cancel():
                continue
            if barrier:
                try:
                    barrier[0].wait(timeout=120)  # every feeder holds one ping (``ping``)
                except threading.BrokenBarrierError:
                    pass  # a feeder busy past the timeout: the ping still gets its reply
            started = time.perf_counter()
            try:
                reply = self._workers[index].request(job)
            except WorkerDied as death:
                reply = {"ok": False, "error": str(death), "key": job.get("key")}
                if not self._closed:
                    self._workers[index] = _Worker()
            with self._lock:
                if job["kind"] != "ping":
                    stats.finished += 1
                    stats.failed += not reply.get("ok")
                    stats.worker_seconds += time.perf_counter() - started
            future.set_result(reply)

    def shutdown(self, timeout: float = 1.0) -> None:
        """Stop taking jobs and end the workers, all within ``timeout`` seconds (a compile still
        in flight then is abandoned: nothing waits for its result any more)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:  # jobs not started are answered as failed: their kernels compile at launch
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_result({"ok": False, "error": "the compile pool was shut down", "key": item[0].get("key")})
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.close()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.reap(deadline)


def wait(future: Future) -> dict:
    """A job's reply; on a terminal, a progress line while the wait is long (``progress.py``)."""
    return progress.wait(future, _describe)


def _describe() -> str:
    size = _pool.size if _pool is not None else 0
    return f"torchfuse: compiling GPU kernels {stats.finished}/{stats.submitted} in {size} processes"


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def get_pool() -> CompilePool | None:
    """The process's pool, started at the first call; None when compiling ahead is off."""
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = worker_count()
            if workers == 0:
                return None
            _pool = CompilePool(workers)
            atexit.register(_pool.shutdown)
        return _pool


def shutdown_pool() -> None:
    """Stop the process's pool (tests; a later ``get_pool`` starts a new one)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown()
