"""The compiled bundle (batchfit.cache.bundle): written by the compile stage, installed by a fit job
whose cache lacks the entry (verified, atomically, under the entry's lock), ignored by one that has it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from testkit import HIERARCHICAL, REPO

from batchfit.cache.bundle import MANIFEST, bundle_keys, install_entry, write_bundle
from batchfit.cache.store import CacheDir, read_entry
from batchfit.errors import CacheError

KEY = "k" * 64


def fake_cache(root: Path, key: str = KEY) -> CacheDir:
    """A cache holding one entry of two numba files and a file of PyTensor's numba cache (no compiling)."""
    cache = CacheDir(root)
    for sub in (cache.entries_dir, cache.numba_dir, cache.pytensor_dir / "numba" / "ab"):
        sub.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in ((f"cb-{key}.nbi", b"index"), (f"cb-{key}.1.nbc", b"object code")):
        (cache.numba_dir / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
    cache.entry_path(key).write_text(json.dumps({"format": 1, "key": key, "files": files, "spec": {}}))
    (cache.pytensor_dir / "numba" / "ab" / "fn.nbi").write_bytes(b"pytensor's index")
    return cache


def test_bundle_round_trip_installs_an_identical_verified_entry(tmp_path):
    source = fake_cache(tmp_path / "source")
    bundle = tmp_path / "m.zip"
    manifest = write_bundle(source, {KEY: read_entry(source, KEY)}, bundle, shared_caches=True)
    assert bundle_keys(bundle) == [KEY] and manifest["keys"] == [KEY]
    target = CacheDir(tmp_path / "target")
    target.entries_dir.mkdir(parents=True)
    assert install_entry(target, KEY, bundle)
    assert read_entry(target, KEY) == read_entry(source, KEY)
    for file in source.root.rglob("*"):
        if file.is_file():
            assert (target.root / file.relative_to(source.root)).read_bytes() == file.read_bytes()
    assert not list(target.root.glob("batchfit/.bundle-*")), "the staging directory must be removed"
    assert not install_entry(target, "other", bundle), "a key the bundle lacks is not installed"


def test_existing_files_of_pytensors_cache_are_kept(tmp_path):
    source = fake_cache(tmp_path / "source")
    bundle = tmp_path / "m.zip"
    write_bundle(source, {KEY: read_entry(source, KEY)}, bundle, shared_caches=True)
    target = CacheDir(tmp_path / "target")
    index = target.pytensor_dir / "numba" / "ab" / "fn.nbi"
    index.parent.mkdir(parents=True)
    target.entries_dir.mkdir(parents=True)
    index.write_bytes(b"an index listing more functions")
    install_entry(target, KEY, bundle)
    assert index.read_bytes() == b"an index listing more functions"


def rewrite_member(bundle: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(bundle) as old:
        members = {n: old.read(n) for n in old.namelist()}
    members[name] = data
    with zipfile.ZipFile(bundle, "w") as new:
        for n, d in members.items():
            new.writestr(n, d)


def test_damaged_bundle_is_refused_and_installs_nothing(tmp_path):
    source = fake_cache(tmp_path / "source")
    bundle = tmp_path / "m.zip"
    write_bundle(source, {KEY: read_entry(source, KEY)}, bundle)
    rewrite_member(bundle, f"batchfit/numba/cb-{KEY}.1.nbc", b"object cod3")
    target = CacheDir(tmp_path / "target")
    target.entries_dir.mkdir(parents=True)
    with pytest.raises(CacheError, match=rf"m\.zip: member batchfit/numba/cb-{KEY}\.1\.nbc does not match its sha256"):
        install_entry(target, KEY, bundle)
    assert [p for p in target.root.rglob("*") if p.is_file()] == []


def test_bundle_members_outside_the_cache_are_refused(tmp_path):
    source = fake_cache(tmp_path / "source")
    bundle = tmp_path / "m.zip"
    manifest = write_bundle(source, {KEY: read_entry(source, KEY)}, bundle)
    manifest["files"]["../../escaped"] = manifest["files"].popitem()[1]
    rewrite_member(bundle, MANIFEST, json.dumps(manifest).encode())
    with pytest.raises(CacheError, match=r"no valid bundle.json .*'\.\./\.\./escaped' points outside the cache"):
        install_entry(CacheDir(tmp_path / "target"), KEY, bundle)


def test_unreadable_bundle_names_the_file(tmp_path):
    (tmp_path / "m.zip").write_text("not a zip")
    with pytest.raises(CacheError, match=r"compiled bundle .*m\.zip is unreadable"):
        bundle_keys(tmp_path / "m.zip")


# A fresh process: compile_model of the hierarchical model with the cache at argv[1] and the bundle
# at argv[3] ("-": none), counting numba's compiler pipeline runs up to a ready sampler model.
READY_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from numba.core import compiler

    runs = [0]
    _core = compiler.CompilerBase._compile_core
    def counting_core(self):
        runs[0] += 1
        return _core(self)
    compiler.CompilerBase._compile_core = counting_core

    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model
    from batchfit.compile.worker_pool import ModelSource
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    cache_dir, model_file, bundle, data_file = sys.argv[1:5]
    cache = open_cache(cache_dir, bundle=None if bundle == "-" else bundle)
    dataset = load_dataset(Path(data_file).stem, Path(data_file))
    model = build_model(load_model_file(model_file), dataset)
    compiled = compile_model(model, cache, source=ModelSource(Path(model_file), dataset))
    compiled.sampler_for(model)
    print(json.dumps({"key": compiled.key, "hit": compiled.report.hit, "installed": compiled.report.installed,
                      "line": compiled.report.line(), "compiler_runs": runs[0]}))
""")


def ready(cache_dir: Path, bundle: Path | str, data_file: Path) -> dict:
    env = {**os.environ, "PYTENSOR_FLAGS": f"base_compiledir={cache_dir / 'pytensor'}",
           "NUMBA_CACHE_DIR": str(cache_dir / "numba")}
    run = subprocess.run([sys.executable, "-c", READY_SCRIPT, str(cache_dir), str(HIERARCHICAL), str(bundle),
                          str(data_file)], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_empty_cache_installs_from_the_bundle_and_compiles_nothing(hierarchical_entry, tmp_path):
    data = sorted((REPO / "data" / "example").glob("*.csv"))[0]
    warm = ready(hierarchical_entry, "-", data)
    assert warm["hit"] and not warm["installed"]
    cache = CacheDir(hierarchical_entry)
    bundle = tmp_path / "m.zip"
    write_bundle(cache, {warm["key"]: read_entry(cache, warm["key"])}, bundle)

    empty = tmp_path / "job-cache"
    first = ready(empty, bundle, data)
    assert first["key"] == warm["key"]
    assert first["hit"] and first["installed"], first["line"]
    assert "installed from the compiled bundle" in first["line"]
    assert first["compiler_runs"] == 0, "a cache installed from the bundle must compile nothing"
    again = ready(empty, bundle, data)
    assert again["hit"] and not again["installed"], "a cache that has the entry ignores the bundle"
    assert [e["event"] for e in map(json.loads, (empty / "batchfit" / "stats.jsonl").read_text().splitlines())] \
        == ["hit", "hit"]


def test_cache_with_the_entry_never_reads_the_bundle(hierarchical_entry, tmp_path):
    data = sorted((REPO / "data" / "example").glob("*.csv"))[0]
    broken = tmp_path / "m.zip"
    broken.write_text("not a zip: reading it would fail")
    result = ready(hierarchical_entry, broken, data)
    assert result["hit"] and not result["installed"]


def test_pytensors_cache_is_bundled_only_when_asked_for(tmp_path):
    source = fake_cache(tmp_path / "source")
    entry_only = write_bundle(source, {KEY: read_entry(source, KEY)}, tmp_path / "entry.zip")
    with_caches = write_bundle(source, {KEY: read_entry(source, KEY)}, tmp_path / "all.zip", shared_caches=True)
    assert set(with_caches["files"]) - set(entry_only["files"]) == {"pytensor/numba/ab/fn.nbi"}
    assert sorted(entry_only["files"]) == [f"batchfit/entries/{KEY}.json", f"batchfit/numba/cb-{KEY}.1.nbc",
                                           f"batchfit/numba/cb-{KEY}.nbi"]


def test_processes_on_one_empty_cache_install_the_bundle_once(hierarchical_entry, tmp_path):
    """Three fit jobs start at once on one empty cache: one installs under the lock, the others load it."""
    data = sorted((REPO / "data" / "example").glob("*.csv"))[0]
    key = ready(hierarchical_entry, "-", data)["key"]
    cache = CacheDir(hierarchical_entry)
    bundle = tmp_path / "m.zip"
    write_bundle(cache, {key: read_entry(cache, key)}, bundle)
    empty = tmp_path / "job-cache"
    env = {**os.environ, "PYTENSOR_FLAGS": f"base_compiledir={empty / 'pytensor'}",
           "NUMBA_CACHE_DIR": str(empty / "numba")}
    jobs = [subprocess.Popen([sys.executable, "-c", READY_SCRIPT, str(empty), str(HIERARCHICAL), str(bundle),
                              str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(3)]
    results = []
    for job in jobs:
        out, err = job.communicate(timeout=900)
        assert job.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["hit"] and r["key"] == key and r["compiler_runs"] == 0 for r in results), results
    assert sum(r["installed"] for r in results) == 1, results
    assert read_entry(CacheDir(empty), key) == read_entry(cache, key)
    assert not list((empty / "batchfit").glob(".bundle-*")), "a staging directory was left behind"
