"""A damaged cache heals: every file kind in ``cache_dir`` is validated, ``batchfit cache verify``
names what is damaged, and a job on a damaged cache warns, rebuilds and draws what it drew before.

The end-to-end tests build one real cache (the example model on one example dataset, through the
normal ``batchfit fit`` path in a fresh process) and damage EVERY file in a copy of it: truncated
to half, emptied, or overwritten with random bytes. The unit tests check the validator on real
files of each kind (numba's index and data files written by numba, a real shared library,
PyTensor's version module, batchfit's JSON files).
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from testkit import REPO
from testkit.cache_jobs import assert_same_draws, cli, env_for, posterior, sweep_file

from batchfit.cache.heal import Damage, file_problem, find_damage, is_damage_error, remove_damage
from batchfit.cache.store import CacheDir

DATA = REPO / "data" / "example" / "store_000.csv"


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def empty(data: bytes) -> bytes:
    return b""


def garbage(data: bytes) -> bytes:
    return np.random.default_rng(len(data)).bytes(len(data))


DAMAGES = [truncate, empty, garbage]


def damage_every_file(root: Path, damage) -> list[Path]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        path.write_bytes(damage(path.read_bytes()))
    return files


# --- the validator, on real files of each kind --------------------------------------------------

NUMBA_MODULE = textwrap.dedent("""
    import numba

    @numba.njit(cache=True)
    def double(x):
        return 2 * x
""")


@pytest.fixture(scope="module")
def numba_files(tmp_path_factory) -> dict[str, bytes]:
    """An index (.nbi) and a data file (.nbc) that numba itself wrote for a cache=True function."""
    root = tmp_path_factory.mktemp("numba")
    (root / "cached_double.py").write_text(NUMBA_MODULE)
    cache_dir = root / "cache"
    env = {**env_for(cache_dir), "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", "import cached_double; print(cached_double.double(3))"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "6", proc.stderr
    [index] = cache_dir.rglob("*.nbi")
    [data] = cache_dir.rglob("*.nbc")
    return {"index.nbi": index.read_bytes(), "index.1.nbc": data.read_bytes()}


def _shared_library() -> bytes:
    import _ctypes

    return Path(_ctypes.__file__).read_bytes()  # a compiled extension module, as PyTensor builds one


def _intact_files(numba_files: dict[str, bytes]) -> dict[str, bytes]:
    return {
        **numba_files,
        "lazylinker_ext/lazylinker_ext.so": _shared_library(),
        "lazylinker_ext/__init__.py": b"_version = 0.32\n",
        "batchfit/entries/manifest.json": json.dumps({"format": 1, "files": {"a.nbc": "00"}}).encode(),
        "batchfit/stats.jsonl": b'{"event": "hit"}\n{"event": "miss", "key": "k"}\n',
    }


def test_validator_accepts_intact_files_of_every_kind(numba_files, tmp_path):
    for name, content in _intact_files(numba_files).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        assert file_problem(path) is None, name


@pytest.mark.parametrize("damage", DAMAGES)
def test_validator_finds_damage_in_every_kind(numba_files, tmp_path, damage):
    for name, content in _intact_files(numba_files).items():
        if damage is empty and name.endswith(("__init__.py", ".jsonl")):
            continue  # what a fresh cache holds: PyTensor's version module before building, no statistics
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(damage(content))
        assert file_problem(path) is not None, name


def test_validator_ignores_files_nothing_reads(tmp_path):
    for name in ("x.lock", "mod.cpp", ".lock"):
        path = tmp_path / name
        path.write_bytes(garbage(b"x" * 100))
        assert file_problem(path) is None, name


def test_what_numba_raises_on_a_damaged_index_counts_as_damage(numba_files, tmp_path):
    """Unpickling garbage raises many types; raised inside numba's reader they all mean damage."""
    from numba.core.caching import IndexDataCacheFile

    raised = []
    intact = numba_files["index.nbi"]
    damaged = [truncate(intact), *(np.random.default_rng(seed).bytes(len(intact)) for seed in range(20))]
    for i, content in enumerate(damaged):
        (tmp_path / f"f{i}.nbi").write_bytes(content)
        try:
            IndexDataCacheFile(str(tmp_path), f"f{i}", 0)._load_index()
        except Exception as exc:  # noqa: BLE001 - whatever numba raises is what we classify
            raised.append(exc)
    assert raised and all(is_damage_error(exc, CacheDir(tmp_path / "elsewhere")) for exc in raised), raised


def test_only_damage_errors_count_as_damage(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    try:
        try:
            pickle.loads(b"\x80\x05K")
        except pickle.UnpicklingError as exc:
            raise RuntimeError("compile failed") from exc
    except RuntimeError as exc:
        chained = exc
    assert is_damage_error(chained, cache)
    assert is_damage_error(EOFError("Ran out of input"), cache)
    assert not is_damage_error(AttributeError("module 'nutpie' has no attribute 'compile'"), cache)
    assert not is_damage_error(ValueError("bad value"), cache)


def test_an_error_in_a_module_run_from_the_cache_counts_as_damage(tmp_path):
    """PyTensor imports its compiled extension's __init__.py from the cache: a truncated one raises NameError."""
    import runpy

    module = tmp_path / "cache" / "pytensor" / "lazylinker_ext" / "__init__.py"
    module.parent.mkdir(parents=True)
    module.write_text("_version")
    with pytest.raises(NameError) as info:
        runpy.run_path(str(module))
    assert is_damage_error(info.value, CacheDir(tmp_path / "cache"))
    assert not is_damage_error(info.value, CacheDir(tmp_path / "other"))


def test_repair_removes_a_damaged_index_with_its_data_files(numba_files, tmp_path):
    cache = CacheDir(tmp_path)
    index = tmp_path / "pytensor" / "numba" / "f-abc.py312.nbi"
    index.parent.mkdir(parents=True)
    index.write_bytes(truncate(numba_files["index.nbi"]))
    data_file = index.with_name("f-abc.py312.1.nbc")
    data_file.write_bytes(numba_files["index.1.nbc"])
    other = index.with_name("g-abc.py312.1.nbc")
    other.write_bytes(numba_files["index.1.nbc"])
    [found] = find_damage(cache)
    assert found.path == index
    remove_damage(cache, found)
    assert not index.exists() and not data_file.exists() and other.exists()


def test_repair_keeps_the_readable_statistics(tmp_path):
    cache = CacheDir(tmp_path)
    cache.stats_path.parent.mkdir(parents=True)
    cache.stats_path.write_bytes(b'{"event": "hit"}\n{"event": "mi')
    remove_damage(cache, Damage(cache.stats_path, "truncated"))
    assert cache.stats_path.read_bytes() == b'{"event": "hit"}\n'


# --- end to end: every file damaged -------------------------------------------------------------

def _config(path: Path, cache_dir: Path, results_dir: Path) -> Path:
    # The optional outputs make the fit job load PyTensor's numba functions from the cache too.
    return sweep_file(path, data_glob=str(DATA), cache_dir=cache_dir, results_dir=results_dir,
                      outputs={"log_likelihood": True, "posterior_predictive": True})


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory) -> dict:
    """A cache filled by one normal fit job in a fresh process, and that job's posterior."""
    root = tmp_path_factory.mktemp("heal")
    cache_dir = root / "cache"
    config = _config(root / "config.json", cache_dir, root / "results")
    proc = cli("fit", "--config", config, DATA.stem, cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cache miss" in proc.stdout + proc.stderr
    return {"cache": cache_dir, "draws": posterior(root / "results" / "fits" / f"{DATA.stem}.nc")}


def read_by_something(path: Path, *, emptied: bool) -> bool:
    """Files whose damage matters: numba's and batchfit's files, PyTensor's compiled extension.

    An empty statistics log or an empty extension version module is what a fresh cache holds."""
    if path.suffix in (".nbi", ".nbc", ".json", ".so"):
        return True
    return not emptied and (path.name == "stats.jsonl" or path.parent.name == "lazylinker_ext" and path.suffix == ".py")


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES)
def test_every_file_damaged_is_reported_then_healed(built_cache, tmp_path, damage):
    cache_dir = tmp_path / "cache"
    shutil.copytree(built_cache["cache"], cache_dir, symlinks=True)
    files = damage_every_file(cache_dir, damage)
    checked = [p for p in files if read_by_something(p, emptied=damage is empty)]
    assert len([p for p in checked if p.suffix in (".nbi", ".nbc")]) > 20

    # 1. verify names every damaged file (batchfit's callbacks under their entry) and exits non-zero
    verify = cli("cache", "verify", "--cache-dir", cache_dir)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    [key] = [p.stem for p in (cache_dir / "batchfit" / "entries").glob("*.json")]
    assert f"entry {key[:12]}" in verify.stdout
    for path in checked:
        if not path.is_relative_to(cache_dir / "batchfit" / "entries") and key not in path.name:
            assert _rel(path, cache_dir) in verify.stdout, path
    assert damaged_listing_unchanged(cache_dir, files), "verify without --repair must not change the cache"

    # 2. a fit job in a fresh process warns, naming the damaged files, rebuilds, and draws the same
    # (with two threads: its two compile workers both meet the damage)
    results = tmp_path / "results"
    fit = cli("fit", "--config", _config(tmp_path / "config.json", cache_dir, results), "--threads", "2", DATA.stem,
              cache_dir=cache_dir)
    assert fit.returncode == 0, fit.stderr[-4000:]
    log = fit.stdout + fit.stderr
    assert f"cache entry {key[:12]}" in log and "damaged" in log, log[-4000:]
    for path in checked:
        if not path.is_relative_to(cache_dir / "batchfit") or path.name == "stats.jsonl":
            assert _rel(path, cache_dir) in log, path
    assert_same_draws(posterior(results / "fits" / f"{DATA.stem}.nc"), built_cache["draws"])

    again = cli("cache", "verify", "--cache-dir", cache_dir)
    assert again.returncode == 0 and "intact" in again.stdout, again.stdout


def damaged_listing_unchanged(root: Path, files: list[Path]) -> bool:
    return sorted(p for p in root.rglob("*") if p.is_file()) == files


@pytest.mark.slow
def test_damaged_pytensor_files_behind_an_intact_entry_heal_in_the_fit_job(built_cache, tmp_path):
    """A cache hit whose optional outputs read damaged PyTensor code rebuilds that code."""
    cache_dir = tmp_path / "cache"
    shutil.copytree(built_cache["cache"], cache_dir, symlinks=True)
    damaged = [p for p in damage_every_file(cache_dir / "pytensor", truncate) if file_problem(p) is not None]
    results = tmp_path / "results"
    fit = cli("fit", "--config", _config(tmp_path / "config.json", cache_dir, results), DATA.stem,
              cache_dir=cache_dir)
    assert fit.returncode == 0, fit.stderr[-4000:]
    log = fit.stdout + fit.stderr
    assert "cache hit" in log
    [batch] = (results / "batches").glob("*.json")
    assert json.loads(batch.read_text())["datasets"][DATA.stem]["status"] == "ok", batch.read_text()
    assert any(_rel(p, cache_dir) in log for p in damaged), log[-4000:]
    assert_same_draws(posterior(results / "fits" / f"{DATA.stem}.nc"), built_cache["draws"])
