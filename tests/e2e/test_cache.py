"""The shared compiled-function cache: warm loads compile nothing, keys are content addresses,
concurrent jobs compile once, damaged entries are rebuilt, untrusted directories are refused,
and the ``batchfit cache`` / ``batchfit compile`` commands work on a real cache.

Every test that runs the model does so in a subprocess (a fresh interpreter, as a Snakemake job
is), so what is measured is what a later process gets from the cache. Tests that need an empty
cache make one under ``tmp_path``; the rest share the session cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from testkit import HIERARCHICAL, REPO
from testkit.cache_jobs import SAMPLER, assert_same_draws, cli, env_for, posterior, sweep_file

from batchfit.cache.store import CacheDir, compile_lock, read_entry
from batchfit.errors import CacheError

GROUPED = REPO / "models" / "grouped_mvnormal.py"


# --- helpers -----------------------------------------------------------------------------------


def run_script(script: str, *args: object, cache_dir: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=env_for(cache_dir), timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON line a script printed last (its result)."""
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result line in stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def simulate(model_file: Path, out_dir: Path, indices: list[int], *, seed: int = 11) -> list[Path]:
    """Datasets ``d{i}.csv`` from the model file's ``simulate(rng, i)``."""
    import pandas as pd  # noqa: F401 - the model files return DataFrames

    from batchfit.model.model_file import load_model_file

    module = load_model_file(model_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in indices:
        path = out_dir / f"d{i}.csv"
        module.simulate(np.random.default_rng([seed, i]), i).to_csv(path, index=False)
        paths.append(path)
    return paths


def entry_keys(cache_dir: Path) -> list[str]:
    return sorted(p.stem for p in (cache_dir / "batchfit" / "entries").glob("*.json"))


def events(cache_dir: Path) -> list[dict]:
    path = cache_dir / "batchfit" / "stats.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def temporary_files(root: Path) -> list[Path]:
    """Leftovers of non-atomic writes: batchfit's ``.name.pid.x.tmp.ext`` and numba's ``name.tmp.uid``."""
    return [p for p in root.rglob("*") if p.is_file() and ".tmp" in p.name]


@pytest.fixture
def isolated_pytensor_dirs(monkeypatch):
    """Undo what ``open_cache`` does to this process (PYTENSOR_FLAGS, PyTensor's numba cache path)."""
    monkeypatch.setenv("PYTENSOR_FLAGS", os.environ.get("PYTENSOR_FLAGS", ""))
    import pytensor.link.numba.cache as pytensor_numba_cache

    monkeypatch.setattr(pytensor_numba_cache, "NUMBA_CACHE_PATH", pytensor_numba_cache.NUMBA_CACHE_PATH)


# A fresh process that builds a model, gets its callbacks from the cache and samples, counting
# every numba compilation: numba's "numba:compile" events (jit dispatchers) and every run of
# numba's compiler pipeline (which cfuncs, too, go through). Both counters are checked to work
# at the end by compiling a jit function and a cfunc.
WARM_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import numba
    from numba.core import compiler, event

    counts = {"events": 0, "pipelines": 0}
    compiled_names = []

    class Counter(event.Listener):
        def on_start(self, ev):
            counts["events"] += 1
            func = ev.data["dispatcher"].py_func
            compiled_names.append(f"{func.__module__}:{func.__qualname__}")
        def on_end(self, ev):
            pass

    event.register("numba:compile", Counter())
    _core = compiler.CompilerBase._compile_core
    def counting_core(self):
        counts["pipelines"] += 1
        return _core(self)
    compiler.CompilerBase._compile_core = counting_core

    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model
    from batchfit.data.dataset import load_dataset
    from batchfit.compile.worker_pool import ModelSource
    from batchfit.model.model_file import build_model, load_model_file
    import nutpie

    cache_dir, model_file, data_file = map(Path, sys.argv[1:4])
    cache = open_cache(cache_dir)
    dataset = load_dataset(data_file.stem, data_file)
    model = build_model(load_model_file(model_file), dataset)
    stages = {"start": dict(counts)}
    compiled = compile_model(model, cache, source=ModelSource(model_file, dataset))
    stages["compile_model"] = dict(counts)
    sampler = compiled.sampler_for(model)
    stages["sampler_for"] = dict(counts)
    stages["names_before_sample"] = list(compiled_names)
    trace = nutpie.sample(sampler, draws=30, tune=30, chains=1, seed=3, progress_bar=False)
    stages["sample"] = dict(counts)
    stages["names_in_sample"] = compiled_names[len(stages["names_before_sample"]):]
    draws = {name: var.values.size for name, var in trace["posterior"].ds.data_vars.items()}

    numba.njit(lambda x: x + 1)(1)
    numba.cfunc("float64(float64)")(lambda x: 2.0 * x)
    stages["control"] = dict(counts)
    print(json.dumps({"hit": compiled.report.hit, "key": compiled.key, "stages": stages, "draws": draws}))
""")


# PyTensor's LAPACK/BLAS bindings look up scipy's function pointers at run time, once per
# process, in a small ``numba.objmode`` block (``get_potrf_pointer`` and the like; a pointer
# cannot be cached). numba compiles each such block in object mode the first time the cached
# machine code calls it. These are the only compilations a warm process may do, and only while
# sampling a model that calls LAPACK/BLAS.
POINTER_LOOKUP = re.compile(r"pytensor\.link\.numba\.dispatch\.linalg\._(LAPACK|BLAS):"
                            r"_(LAPACK|BLAS)\.numba_x\w+\.<locals>\.get_\w+_pointer")


def warm_process_compiles_nothing(model_file: Path, data_file: Path, cache_dir: Path, *,
                                  pointer_lookups: bool = False) -> dict:
    result = last_json(run_script(WARM_SCRIPT, cache_dir, model_file, data_file, cache_dir=cache_dir))
    assert result["hit"], "a warm cache must be a hit in a fresh process"
    stages = result["stages"]
    assert stages["start"] == {"events": 0, "pipelines": 0}
    for stage in ("compile_model", "sampler_for"):
        assert stages[stage] == {"events": 0, "pipelines": 0}, f"numba compiled during {stage}: {stages}"
    if pointer_lookups:
        names = stages["names_in_sample"]
        others = [name for name in names if not POINTER_LOOKUP.fullmatch(name)]
        assert others == [], f"numba compiled more than LAPACK/BLAS pointer look-ups while sampling: {others}"
        # each look-up is a jit dispatcher, so every pipeline run is one of them
        assert stages["sample"] == {"events": len(names), "pipelines": len(names)}, stages
        assert len(names) <= 12, names  # a handful per process, not per draw or per chain
    else:
        assert stages["sample"] == {"events": 0, "pipelines": 0}, f"numba compiled during sample: {stages}"
    # The counters do see compilations: one jit event, and a pipeline run for each function.
    assert stages["control"]["events"] >= 1 and stages["control"]["pipelines"] >= 2, stages
    assert result["draws"] and all(n > 0 for n in result["draws"].values())
    return result


def prime(model_file: Path, data_file: Path, cache_dir: Path) -> str:
    """Make sure the cache holds the model's entry (compiled in a worker if absent); its key."""
    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model
    from batchfit.compile.worker_pool import ModelSource
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    dataset = load_dataset(data_file.stem, data_file)
    model = build_model(load_model_file(model_file), dataset)
    compiled = compile_model(model, open_cache(cache_dir), source=ModelSource(model_file, dataset))
    return compiled.key


# --- 1. a warm load compiles nothing ------------------------------------------------------------

def test_warm_load_in_fresh_process_compiles_nothing(session_cache, tmp_path):
    small, large = simulate(HIERARCHICAL, tmp_path / "data", [0, 5])  # 3 groups/40 rows, 8 groups/225 rows
    key = prime(HIERARCHICAL, small, session_cache)
    result = warm_process_compiles_nothing(HIERARCHICAL, large, session_cache)
    assert result["key"] == key, "the same model must get the same key in another process and dataset"


# fit_batch in a fresh process; prints the compile line, outcomes and every warning. With a
# fourth argument it first waits for that file to exist (a start line for concurrent runs).
FIT_SCRIPT = textwrap.dedent("""
    import json, sys, time, warnings
    from pathlib import Path
    from batchfit.config import config_from_dict
    from batchfit.fitting.batch import fit_batch

    config = config_from_dict(json.loads(Path(sys.argv[1]).read_text()))
    ids = sys.argv[2].split(",")
    if len(sys.argv) > 4:
        Path(sys.argv[4] + ".ready").touch()
        while not Path(sys.argv[4]).exists():
            time.sleep(0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit_batch(config, ids, batch_id=sys.argv[3])
    print(json.dumps({"compile": report.compile, "outcomes": [o.__dict__ for o in report.outcomes],
                      "warnings": [str(w.message) for w in caught]}))
""")


# --- 2 and 4. eight processes on an empty cache; warm draws equal the cold process's draws -------

@pytest.fixture(scope="module")
def concurrent_run(tmp_path_factory):
    """Eight processes started at once on an EMPTY cache each fit the same dataset.

    Each imports everything, then waits at a start line, so all of them reach the cache together.
    """
    root = tmp_path_factory.mktemp("concurrent")
    [data] = simulate(HIERARCHICAL, root / "data", [3])
    cache_dir = root / "cache"
    go = root / "go"
    procs = []
    for i in range(8):
        config = sweep_file(root / f"c{i}.json", data_glob=str(root / "data" / "*.csv"),
                            cache_dir=cache_dir, results_dir=root / f"results{i}")
        procs.append(subprocess.Popen([sys.executable, "-c", FIT_SCRIPT, str(config), data.stem, f"p{i}", f"{go}{i}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env_for(cache_dir)))
    try:
        deadline = time.monotonic() + 240
        while not all(Path(f"{go}{i}.ready").exists() for i in range(8)):
            assert all(p.poll() is None for p in procs), "a process died before the start line"
            assert time.monotonic() < deadline, "processes did not get ready"
            time.sleep(0.05)
        assert not list((cache_dir / "batchfit" / "entries").glob("*")), "the cache must start empty"
        for i in range(8):  # everyone is imported and waiting: release them together
            Path(f"{go}{i}").touch()
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, f"exit code {p.returncode}\n{err[-4000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["outcomes"][0]["status"] == "ok" for r in results), results
    fits = [root / f"results{i}" / "fits" / f"{data.stem}.nc" for i in range(8)]
    return {"root": root, "data": data, "cache": cache_dir, "results": results, "events": events(cache_dir),
            "draws": [posterior(f) for f in fits]}


@pytest.mark.slow
def test_concurrent_processes_on_an_empty_cache_compile_once(concurrent_run):
    cache_dir = concurrent_run["cache"]
    compiles = [r["compile"] for r in concurrent_run["results"]]
    assert sum(c.startswith("cache miss") for c in compiles) == 1, compiles
    assert sum(c.startswith("cache hit") for c in compiles) == 7, compiles
    kinds = [e["event"] for e in concurrent_run["events"]]
    assert kinds.count("miss") == 1 and kinds.count("hit") == 7 and len(kinds) == 8, kinds

    [key] = entry_keys(cache_dir)
    assert read_entry(CacheDir(cache_dir), key)["key"] == key
    verify = cli("cache", "verify", "--cache-dir", cache_dir)
    assert verify.returncode == 0 and "intact" in verify.stdout, verify.stdout + verify.stderr
    draws = concurrent_run["draws"]
    for other in draws[1:]:
        assert_same_draws(other, draws[0])


@pytest.mark.slow
def test_warm_process_draws_equal_cold_process_draws(concurrent_run):
    """A later process (B) loading the entry draws bit for bit what the compiling process (A) drew."""
    root, cache_dir = concurrent_run["root"], concurrent_run["cache"]
    [cold] = [i for i, r in enumerate(concurrent_run["results"]) if r["compile"].startswith("cache miss")]
    config = sweep_file(root / "b.json", data_glob=str(root / "data" / "*.csv"), cache_dir=cache_dir,
                        results_dir=root / "results-b")
    result = last_json(run_script(FIT_SCRIPT, config, concurrent_run["data"].stem, "b", cache_dir=cache_dir))
    assert result["compile"].startswith("cache hit"), result
    assert_same_draws(posterior(root / "results-b" / "fits" / f"{concurrent_run['data'].stem}.nc"),
                      concurrent_run["draws"][cold])


@pytest.mark.slow
def test_compile_leaves_one_valid_entry_and_no_temporary_files(concurrent_run):
    cache = CacheDir(concurrent_run["cache"])
    [key] = entry_keys(cache.root)
    entry = read_entry(cache, key)
    assert entry["key"] == key and entry["compile_seconds"] > 0
    assert {name.split(".")[0] for name in entry["files"]} == {"batchfit_logp", "batchfit_expand"}
    assert list((cache.root / "pytensor").rglob("*.nbi")), "PyTensor's numba code belongs in the cache too"
    assert temporary_files(cache.root) == []


# --- 3. keys are content addresses ---------------------------------------------------------------

KEY_MODEL = textwrap.dedent("""
    import pymc as pm

    def build_model(data):
        with pm.Model() as model:
            x = pm.Data("x", data["x"])
            mu = pm.Normal("mu", 0.0, {scale})
            pm.Normal("obs", mu, 1.0, observed=x)
        return model
""")


def _dataset(name: str, **arrays: np.ndarray):
    from batchfit.data.dataset import Dataset

    return Dataset(id=name, path=Path(f"{name}.csv"), arrays=dict(arrays), coords={})


def test_keys_ignore_sizes_but_not_structure_or_types(tmp_path):
    from batchfit.compile.graphs import sampler_key
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    small, large = simulate(HIERARCHICAL, tmp_path / "data", [0, 5])
    hierarchical = load_model_file(HIERARCHICAL)
    m_small = build_model(hierarchical, load_dataset("small", small))
    m_large = build_model(hierarchical, load_dataset("large", large))
    assert len(m_small.coords["groups"]) != len(m_large.coords["groups"])
    assert m_small["x"].get_value().shape != m_large["x"].get_value().shape
    assert sampler_key(m_small) == sampler_key(m_large)

    (tmp_path / "prior2.py").write_text(KEY_MODEL.format(scale="2.0"))
    (tmp_path / "prior3.py").write_text(KEY_MODEL.format(scale="3.0"))
    prior2, prior3 = load_model_file(tmp_path / "prior2.py"), load_model_file(tmp_path / "prior3.py")
    floats = _dataset("floats", x=np.linspace(0, 1, 7))
    keys = {
        "reference": sampler_key(build_model(prior2, floats)),
        "more rows": sampler_key(build_model(prior2, _dataset("long", x=np.linspace(0, 1, 30)))),
        "other prior": sampler_key(build_model(prior3, floats)),
        "int column": sampler_key(build_model(prior2, _dataset("ints", x=np.arange(7, dtype=np.int64)))),
        "2-d column": sampler_key(build_model(prior2, _dataset("matrix", x=np.ones((7, 2))))),
    }
    assert keys["more rows"] == keys["reference"]
    for what in ("other prior", "int column", "2-d column"):
        assert keys[what] != keys["reference"], what
    assert len({keys["other prior"], keys["int column"], keys["2-d column"]}) == 3


def test_library_upgrade_changes_the_key(monkeypatch, session_cache, tmp_path):
    import batchfit.compile.fingerprint as fp
    from batchfit.compile.graphs import sampler_key
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    [data] = simulate(HIERARCHICAL, tmp_path / "data", [2])
    model = build_model(load_model_file(HIERARCHICAL), load_dataset("d", data))
    fp.environment_fingerprint.cache_clear()
    before_env, before_key = fp.environment_fingerprint(), sampler_key(model)
    real_version = fp.version
    for library in ("numba", "pytensor", "nutpie"):
        monkeypatch.setattr(
            fp, "version", lambda name, lib=library: real_version(name) + (".post1" if name == lib else ""))
        fp.environment_fingerprint.cache_clear()
        try:
            assert fp.environment_fingerprint() != before_env, library
            upgraded = sampler_key(model)
        finally:
            monkeypatch.setattr(fp, "version", real_version)
            fp.environment_fingerprint.cache_clear()
        assert upgraded != before_key, library
        assert not (session_cache / "batchfit" / "entries" / f"{upgraded}.json").exists()
    assert fp.environment_fingerprint() == before_env and sampler_key(model) == before_key


# --- 4. the lock ------------------------------------------------------------------------------

HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from batchfit.cache.store import compile_lock, open_cache
    cache = open_cache(sys.argv[1])
    with compile_lock(cache, sys.argv[2], 5.0) as locked:
        print("locked" if locked else "not locked", flush=True)
        time.sleep(120)
""")


def test_killed_lock_holder_does_not_block_the_next_process(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    key = "ab" * 20
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(cache.root), key], stdout=subprocess.PIPE,
                              text=True, env=env_for(cache.root))
    try:
        assert holder.stdout.readline().strip() == "locked"
        # While the holder lives, the lock is really held: a short wait times out.
        with pytest.warns(UserWarning, match="waited"):
            with compile_lock(cache, key, 0.3) as locked:
                assert locked is False
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        start = time.monotonic()
        with compile_lock(cache, key, 30.0) as locked:
            waited = time.monotonic() - start
            assert locked is True
        assert waited < 2.0, f"acquiring the dead holder's lock took {waited:.1f} s"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# --- 5. integrity ----------------------------------------------------------------------------------

def _numba_file(cache: CacheDir, key: str) -> Path:
    [nbc] = sorted(cache.numba_dir.glob(f"batchfit_logp*-{key}.*.nbc"))
    return nbc


def _truncate(cache: CacheDir, key: str) -> str:
    nbc = _numba_file(cache, key)
    nbc.write_bytes(nbc.read_bytes()[: nbc.stat().st_size // 2])
    return f"file {nbc.name} is truncated or modified"


def _garbage(cache: CacheDir, key: str) -> str:
    nbc = _numba_file(cache, key)
    nbc.write_bytes(np.random.default_rng(0).bytes(nbc.stat().st_size))
    return f"file {nbc.name} is truncated or modified"


def _foreign_manifest(cache: CacheDir, key: str) -> str:
    record = json.loads(cache.entry_path(key).read_text())
    record["key"] = "0" * 40
    cache.entry_path(key).write_text(json.dumps(record))
    return "does not belong to this entry"


def _bad_json(cache: CacheDir, key: str) -> str:
    cache.entry_path(key).write_text('{"format": 1, "key": ')
    return "is unreadable"


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate, _garbage, _foreign_manifest, _bad_json],
                         ids=["truncated-numba-file", "garbage-numba-file", "foreign-manifest", "bad-json-manifest"])
def test_damaged_entry_is_reported_and_rebuilt(concurrent_run, tmp_path, damage):
    cache = CacheDir(tmp_path / "cache")
    shutil.copytree(concurrent_run["cache"], cache.root, symlinks=True)
    [key] = entry_keys(cache.root)
    expected = damage(cache, key)
    misses_before = [e["event"] for e in events(cache.root)].count("miss")

    config = sweep_file(tmp_path / "c.json", data_glob=str(concurrent_run["data"].parent / "*.csv"),
                        cache_dir=cache.root, results_dir=tmp_path / "results")
    result = last_json(run_script(FIT_SCRIPT, config, concurrent_run["data"].stem, "r", cache_dir=cache.root))
    damaged = [w for w in result["warnings"] if "damaged" in w]
    assert damaged, result["warnings"]
    assert key[:12] in damaged[0] and expected in damaged[0] and "rebuilding" in damaged[0], damaged
    assert result["compile"].startswith("cache miss"), result["compile"]
    assert [e["event"] for e in events(cache.root)].count("miss") == misses_before + 1

    assert entry_keys(cache.root) == [key]
    assert read_entry(cache, key)["key"] == key  # rebuilt and intact
    assert temporary_files(cache.root) == []
    [cold] = [i for i, r in enumerate(concurrent_run["results"]) if r["compile"].startswith("cache miss")]
    assert_same_draws(posterior(tmp_path / "results" / "fits" / f"{concurrent_run['data'].stem}.nc"),
                      concurrent_run["draws"][cold])


# --- 6. trust ------------------------------------------------------------------------------------

def test_foreign_world_writable_cache_is_refused_unless_trusted(tmp_path, isolated_pytensor_dirs):
    from batchfit.cache.store import open_cache

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    shared.chmod(0o777)
    with pytest.raises(CacheError, match="trust_shared") as info:
        open_cache(shared)
    assert str(shared) in str(info.value) and "65534" in str(info.value)
    assert list(shared.iterdir()) == [], "a refused directory must not be written to"

    cache = open_cache(shared, trust_shared=True)
    assert cache.root == shared.resolve()
    assert cache.entries_dir.is_dir() and cache.numba_dir.is_dir() and cache.pytensor_dir.is_dir()


def test_world_writable_cache_of_our_own_warns(tmp_path, isolated_pytensor_dirs):
    from batchfit.cache.store import open_cache

    private = tmp_path / "private"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_cache(private)  # created 0o700: no warning
    assert private.stat().st_mode & 0o077 == 0

    ours = tmp_path / "ours"
    ours.mkdir()
    ours.chmod(0o777)
    with pytest.warns(UserWarning, match="world-writable") as caught:
        cache = open_cache(ours)
    assert str(ours) in str(caught[0].message) and "chmod o-w" in str(caught[0].message)
    assert cache.entries_dir.is_dir()


def test_opening_another_cache_moves_pytensor_numba_code_back(tmp_path, session_cache, isolated_pytensor_dirs):
    """A process that opens two caches in turn compiles PyTensor code into the one opened last."""
    import pytensor.link.numba.cache as pytensor_numba_cache

    from batchfit.cache.store import open_cache

    open_cache(tmp_path / "other")
    numba_dir = (tmp_path / "other" / "pytensor" / "numba").resolve()
    assert Path(pytensor_numba_cache.NUMBA_CACHE_PATH).resolve() == numba_dir
    open_cache(session_cache)
    assert Path(pytensor_numba_cache.NUMBA_CACHE_PATH).resolve() == (session_cache / "pytensor" / "numba").resolve()


# --- 7. the cache command ------------------------------------------------------------------------

@pytest.fixture
def cache_copy(concurrent_run, tmp_path) -> CacheDir:
    """A copy of the cold run's cache (one hierarchical entry plus PyTensor's numba code)."""
    cache = CacheDir(tmp_path / "cache")
    shutil.copytree(concurrent_run["cache"], cache.root, symlinks=True)
    return cache


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_cache_info(cache_copy):
    stats = [{"t": 1.0, "event": "miss", "key": "k", "seconds": 20.0, "saved": 0.0},
             {"t": 2.0, "event": "hit", "key": "k", "seconds": 0.5, "saved": 10.0},
             {"t": 3.0, "event": "hit", "key": "k", "seconds": 0.5, "saved": 5.5}]
    cache_copy.stats_path.write_text("".join(json.dumps(s) + "\n" for s in stats))
    proc = cli("cache", "info", "--cache-dir", cache_copy.root)
    assert proc.returncode == 0, proc.stderr
    files = _files(cache_copy.root)
    mib = sum(p.stat().st_size for p in files) / 1024**2
    out = proc.stdout
    assert f"location: {cache_copy.root}" in out
    assert f"entries: 1 compiled models, {len(files)} files, {mib:.1f} MiB" in out
    assert "hits: 2, misses: 1" in out
    assert "compile seconds saved by hits: 15.5" in out


@pytest.mark.slow
def test_cache_verify_and_repair(cache_copy):
    clean = cli("cache", "verify", "--cache-dir", cache_copy.root)
    assert clean.returncode == 0 and "intact" in clean.stdout, clean.stdout + clean.stderr

    [key] = entry_keys(cache_copy.root)
    problem = _truncate(cache_copy, key)
    damaged = cli("cache", "verify", "--cache-dir", cache_copy.root)
    assert damaged.returncode == 1
    assert f"entry {key[:12]}" in damaged.stdout and problem in damaged.stdout
    assert entry_keys(cache_copy.root) == [key], "verify without --repair must not change the cache"

    repaired = cli("cache", "verify", "--repair", "--cache-dir", cache_copy.root)
    assert repaired.returncode == 0 and f"entry {key[:12]}" in repaired.stdout
    assert entry_keys(cache_copy.root) == []
    assert list(cache_copy.numba_dir.glob(f"*-{key}.*")) == []
    again = cli("cache", "verify", "--cache-dir", cache_copy.root)
    assert again.returncode == 0 and "intact" in again.stdout


@pytest.mark.slow
def test_cache_verify_reports_unreadable_pytensor_index(cache_copy):
    index = sorted((cache_copy.pytensor_dir).rglob("*.nbi"))[0]
    index.write_bytes(b"not a pickle")
    proc = cli("cache", "verify", "--cache-dir", cache_copy.root)
    assert proc.returncode == 1 and index.name in proc.stdout


@pytest.mark.slow
def test_cache_prune_by_size(cache_copy):
    assert entry_keys(cache_copy.root)
    proc = cli("cache", "prune", "--max-size", "1K", "--cache-dir", cache_copy.root)
    assert proc.returncode == 0, proc.stderr
    assert entry_keys(cache_copy.root) == []
    assert list(cache_copy.numba_dir.iterdir()) == []
    assert sum(p.stat().st_size for p in _files(cache_copy.pytensor_dir)) <= 1024
    assert "removed" in proc.stdout and "removed 0 " not in proc.stdout


@pytest.mark.slow
def test_cache_prune_by_age(cache_copy):
    now = time.time()
    for path in _files(cache_copy.root):
        os.utime(path, (now, now))
    kept = cli("cache", "prune", "--older-than", "1h", "--cache-dir", cache_copy.root)
    assert kept.returncode == 0 and "removed 0 item(s)" in kept.stdout
    assert len(entry_keys(cache_copy.root)) == 1
    time.sleep(1.5)
    pruned = cli("cache", "prune", "--older-than", "1s", "--cache-dir", cache_copy.root)
    assert pruned.returncode == 0, pruned.stderr
    assert entry_keys(cache_copy.root) == []
    assert list(cache_copy.numba_dir.iterdir()) == []


@pytest.mark.slow
def test_cache_prune_needs_a_limit_and_clear_empties(cache_copy):
    proc = cli("cache", "prune", "--cache-dir", cache_copy.root)
    assert proc.returncode == 2 and "--max-size" in proc.stderr
    assert entry_keys(cache_copy.root)
    cleared = cli("cache", "clear", "--cache-dir", cache_copy.root)
    assert cleared.returncode == 0, cleared.stderr
    assert cache_copy.root.is_dir() and list(cache_copy.root.iterdir()) == []


# --- 8. a Blockwise model is cached like any other -------------------------------------------------

def test_blockwise_model_loads_without_compiling(session_cache, tmp_path):
    first, second = simulate(GROUPED, tmp_path / "data", [0, 2])  # 3 and 5 groups
    key = prime(GROUPED, first, session_cache)
    result = warm_process_compiles_nothing(GROUPED, second, session_cache, pointer_lookups=True)
    assert result["key"] == key
    assert {"mu", "sd", "corr"} <= set(result["draws"])


# --- 9. ahead-of-time compile ----------------------------------------------------------------------

@pytest.mark.slow
def test_compile_command_fills_an_empty_cache_for_the_fit_jobs(tmp_path):
    """One worker or two (the log density's callback beside the rest) build the same entry, and a
    fit job then only loads it; its draws do not depend on how the entry was built."""
    simulate(HIERARCHICAL, tmp_path / "data", [4, 6])
    draws = {}
    for threads in (1, 2):
        cache_dir = tmp_path / f"cache{threads}"
        config = tmp_path / f"config{threads}.yaml"
        config.write_text(json.dumps({"model": str(HIERARCHICAL), "datasets": ["data/*.csv"], "sampler": SAMPLER,
                                      "cache_dir": cache_dir.name, "results_dir": f"results{threads}"}))  # JSON is YAML
        compiled = cli("compile", "--config", config, "--threads", str(threads), cwd=tmp_path, cache_dir=cache_dir)
        assert compiled.returncode == 0, compiled.stderr[-4000:]
        assert "cache miss" in compiled.stdout
        parts = set(re.findall(r"compile worker \((\w+)\)", compiled.stderr))
        assert parts == ({"all"} if threads == 1 else {"logp", "rest"}), compiled.stderr[-4000:]
        [key] = entry_keys(cache_dir)
        entry = read_entry(CacheDir(cache_dir), key)
        assert entry["key"] == key
        assert {name.split(".")[0] for name in entry["files"]} == {"batchfit_logp", "batchfit_expand"}, entry

        fitted = cli("fit", "--config", config, "d6", cwd=tmp_path, cache_dir=cache_dir)
        assert fitted.returncode == 0, fitted.stderr[-4000:]
        log = fitted.stdout + fitted.stderr
        assert f"cache hit {key[:12]}" in log and "cache miss" not in log
        draws[threads] = posterior(tmp_path / f"results{threads}" / "fits" / "d6.nc")
        assert [e["event"] for e in events(cache_dir)] == ["miss", "hit"]
    assert_same_draws(draws[2], draws[1])
