"""How many compile workers a process starts (runtime/compile_pool.py): its CPUs, bounded by a
container's CPU quota, read from control-group files laid out here as Linux lays them out."""
from __future__ import annotations

from pathlib import Path

import pytest

from torchfuse.runtime import compile_pool

V2_MEMBERSHIP = "0::/\n"  # a container's own namespace: its group is the root


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_quota_of_16_cpus_limits_a_larger_affinity(tmp_path):
    _write(tmp_path / "cpu.max", "1600000 100000\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path, V2_MEMBERSHIP) == 16


def test_a_fractional_quota_rounds_up(tmp_path):
    _write(tmp_path / "cpu.max", "250000 100000\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path, V2_MEMBERSHIP) == 3


def test_an_unlimited_v2_group_has_no_quota(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path, V2_MEMBERSHIP) is None


def test_the_tightest_of_a_nested_v2_group_and_its_parents_counts(tmp_path):
    _write(tmp_path / "kubepods" / "cpu.max", "400000 100000\n")
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    membership = "0::/kubepods/pod1\n"
    assert compile_pool.cgroup_cpu_quota(tmp_path, membership) == 4


def test_a_v1_quota_is_read_when_there_is_no_v2_limit(tmp_path):
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "800000\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path, "4:cpu:/\n") == 8


def test_an_unlimited_v1_group_and_unreadable_files_have_no_quota(tmp_path):
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path, "4:cpu:/\n") is None
    _write(tmp_path / "garbled" / "cpu.max", "not numbers\n")
    assert compile_pool.cgroup_cpu_quota(tmp_path / "garbled", V2_MEMBERSHIP) is None
    assert compile_pool.cgroup_cpu_quota(tmp_path / "absent", V2_MEMBERSHIP) is None


@pytest.mark.parametrize("affinity, quota, expected", [(192, 16, 16), (8, 16, 8), (4, None, 4), (64, 48, 32)])
def test_workers_follow_the_smaller_of_affinity_and_quota_up_to_the_maximum(monkeypatch, affinity, quota, expected):
    monkeypatch.delenv("TORCHFUSE_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(compile_pool.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(compile_pool, "cgroup_cpu_quota", lambda: quota)
    assert compile_pool.worker_count() == expected


def test_the_environment_variable_still_decides(monkeypatch):
    monkeypatch.setenv("TORCHFUSE_COMPILE_WORKERS", "3")
    monkeypatch.setattr(compile_pool, "cgroup_cpu_quota", lambda: 1)
    assert compile_pool.worker_count() == 3
