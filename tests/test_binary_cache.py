"""The on-disk store of compiled GPU binaries (runtime/binary_cache.py): an entry is loaded only
when every file is what was stored; a bad entry is deleted and reported as a miss; concurrent
writers of one entry all succeed; every part of the key changes it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchfuse.runtime import binary_cache

FILES = {"tf_poi_x.json": b'{"hash": "abc", "name": "tf_poi_x"}', "tf_poi_x.cubin": bytes(range(256)) * 40}


def test_a_stored_entry_comes_back_with_its_files(tmp_path):
    binary_cache.store(tmp_path, "k" * 64, FILES, {"function": "tf_poi_x"})
    entry = binary_cache.lookup(tmp_path, "k" * 64)
    assert entry is not None
    assert {name: path.read_bytes() for name, path in entry.files.items()} == FILES
    assert entry.verified("tf_poi_x.cubin", FILES["tf_poi_x.cubin"])
    assert not entry.verified("tf_poi_x.cubin", FILES["tf_poi_x.cubin"][:-1])
    assert binary_cache.lookup(tmp_path, "j" * 64) is None  # another key: a miss


def _truncate(directory: Path) -> None:
    path = directory / "tf_poi_x.cubin"
    path.write_bytes(path.read_bytes()[:100])


def _garble(directory: Path) -> None:
    path = directory / "tf_poi_x.cubin"
    data = bytearray(path.read_bytes())
    data[500] ^= 0xFF
    path.write_bytes(bytes(data))


def _drop_file(directory: Path) -> None:
    (directory / "tf_poi_x.json").unlink()


def _no_manifest(directory: Path) -> None:  # a writer that died before its manifest (not possible
    (directory / binary_cache.MANIFEST).unlink()  # with our rename, but a copied cache could be so)


def _bad_manifest(directory: Path) -> None:
    (directory / binary_cache.MANIFEST).write_text("{not json")


def _other_key(directory: Path) -> None:  # an entry moved or copied under the wrong name
    manifest = json.loads((directory / binary_cache.MANIFEST).read_text())
    manifest["key"] = "0" * 64
    (directory / binary_cache.MANIFEST).write_text(json.dumps(manifest))


def _old_format(directory: Path) -> None:
    manifest = json.loads((directory / binary_cache.MANIFEST).read_text())
    manifest["format"] = "gpu-binary-0"
    (directory / binary_cache.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [_truncate, _garble, _drop_file, _no_manifest, _bad_manifest, _other_key,
                                    _old_format])
def test_a_damaged_entry_is_never_loaded_and_is_rebuilt(tmp_path, damage):
    key = "a" * 64
    binary_cache.store(tmp_path, key, FILES)
    damage(binary_cache.entry_dir(tmp_path, key))
    corrupt = binary_cache.stats.corrupt
    assert binary_cache.lookup(tmp_path, key) is None
    assert binary_cache.stats.corrupt == corrupt + 1
    assert not binary_cache.entry_dir(tmp_path, key).exists()  # deleted, nothing half-deleted left
    assert [p.name for p in binary_cache.entry_dir(tmp_path, key).parent.iterdir()] == []
    binary_cache.store(tmp_path, key, FILES)  # the caller compiles again and stores
    assert binary_cache.lookup(tmp_path, key) is not None


def test_storing_over_a_damaged_entry_replaces_it(tmp_path):
    key = "b" * 64
    binary_cache.store(tmp_path, key, FILES)
    _truncate(binary_cache.entry_dir(tmp_path, key))
    binary_cache.store(tmp_path, key, FILES)  # the rename finds it, lookup discards it, rename again
    entry = binary_cache.lookup(tmp_path, key)
    assert entry is not None and entry.files["tf_poi_x.cubin"].read_bytes() == FILES["tf_poi_x.cubin"]


WRITER = textwrap.dedent("""
    import importlib.util, sys, time
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("binary_cache", sys.argv[1])
    cache = importlib.util.module_from_spec(spec)
    sys.modules["binary_cache"] = cache  # dataclasses look their module up
    spec.loader.exec_module(cache)
    root, key = Path(sys.argv[2]), sys.argv[3]
    files = {"tf_poi_x.json": b"{}", "tf_poi_x.cubin": bytes(range(256)) * 4000}
    start = float(sys.argv[4])
    while time.time() < start:  # all writers begin together
        time.sleep(0.001)
    for _ in range(30):
        entry = cache.store(root, key, files)
        assert entry.files["tf_poi_x.cubin"].read_bytes() == files["tf_poi_x.cubin"]
        found = cache.lookup(root, key)
        assert found is not None, "a reader saw a bad entry"
    print(cache.stats.stored, cache.stats.lost_races, cache.stats.corrupt)
""")


def test_processes_writing_one_entry_at_once_all_succeed(tmp_path):
    """Four processes store and read the same entry 30 times each: every store returns the
    entry, no reader ever finds a bad one, and one intact entry is left."""
    import time

    key = "c" * 64
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, binary_cache.__file__, str(tmp_path), key, str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert out.split()[2] == "0"  # no process ever saw a corrupt entry
    assert sum(int(out.split()[0]) for out, _ in results) >= 1
    assert binary_cache.lookup(tmp_path, key) is not None
    leftovers = [p.name for p in binary_cache.entry_dir(tmp_path, key).parent.iterdir() if p.name != key]
    assert leftovers == []  # no temporary directories left behind


BASE_PARTS = {"module": "source", "function": "tf_poi_x", "signature": "sig", "constexprs": "c", "attrs": "a",
              "options": "o", "target": "cuda:90:32", "triton": "3.6.0:/lib/libtriton.so:1:2", "torch": "2.11.0",
              "env": "[]"}


@pytest.mark.parametrize("part,value", [("target", "cuda:80:32"), ("target", "cuda:100:32"),
                                        ("triton", "3.9.0:/lib/libtriton.so:1:2"),
                                        ("triton", "3.6.0:/lib/libtriton.so:1:3"), ("torch", "2.12.0"),
                                        ("module", "source2"), ("options", "o2"), ("attrs", "a2"),
                                        ("env", "[('TRITON_X', '1')]")])
def test_every_part_of_the_key_changes_it(part, value):
    assert binary_cache.entry_key(BASE_PARTS) == binary_cache.entry_key(dict(BASE_PARTS))
    assert binary_cache.entry_key({**BASE_PARTS, part: value}) != binary_cache.entry_key(BASE_PARTS)
