"""The compile worker (a child process) reports to the job: its warnings and log lines reach the
job's log; a model it cannot take is the model's failure, and its crash the job's error with the
worker's last words."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from testkit import OBJECT_MODE_MODEL

WARNING_MODEL = textwrap.dedent("""\
    import warnings
    import pymc as pm

    def build_model(data):
        warnings.warn("build_model says: check the priors of {tag}")
        with pm.Model() as model:
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", {centre}, 1.0)
            pm.Normal("obs", mu, 1.0, observed=y, shape=y.shape)
        return model
""")


def compile_in_child(tmp_path: Path, source: str, cache_dir: Path, workers: int = 1):
    from batchfit.cache.store import open_cache
    from batchfit.compile.build import compile_model
    from batchfit.compile.worker_pool import ModelSource
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    (tmp_path / "model.py").write_text(source)
    pd.DataFrame({"y": np.linspace(0.0, 1.0, 5)}).to_csv(tmp_path / "d.csv", index=False)
    dataset = load_dataset("d", tmp_path / "d.csv")
    model = build_model(load_model_file(tmp_path / "model.py"), dataset)
    source = ModelSource(tmp_path / "model.py", dataset)
    return compile_model(model, open_cache(cache_dir), source=source, workers=workers)


def test_worker_warnings_reach_the_jobs_log(tmp_path, session_cache, caplog):
    with caplog.at_level(logging.INFO, logger="batchfit"), pytest.warns(UserWarning, match="says"):
        compiled = compile_in_child(tmp_path, WARNING_MODEL.format(tag="worker-test", centre="0.25"), session_cache)
    assert not compiled.report.hit
    worker_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile worker (all):")]
    assert any("build_model says: check the priors of worker-test" in line for line in worker_lines), worker_lines


def test_a_model_the_worker_builds_otherwise_is_one_the_cached_path_cannot_take(tmp_path, session_cache):
    """A ``build_model`` that builds another model in the worker (here its centre is the process id)
    is the model's failure: the structure goes through nutpie's own compile, which compiles in-process."""
    from batchfit.errors import CachedPathUnsupported

    source = WARNING_MODEL.format(tag="x", centre="__import__('os').getpid() * 1e-9")
    with pytest.raises(CachedPathUnsupported, match="same model from the same dataset"), pytest.warns(UserWarning):
        compile_in_child(tmp_path, source, session_cache)


def test_an_object_mode_model_is_refused_by_the_job_before_its_second_worker_has_work(tmp_path, session_cache,
                                                                                      monkeypatch):
    """The structure goes to nutpie's own compile, which the job then waits for: the job finds the
    object-mode op itself, before giving the second worker its work, and stops both."""
    from batchfit.common.standby import Standby
    from batchfit.errors import CachedPathUnsupported

    taken, take = [], Standby.take
    monkeypatch.setattr(Standby, "take", lambda self, n: taken.extend(take(self, n)) or taken[-n:])
    with pytest.raises(CachedPathUnsupported, match=r"PythonSoftplus.*object mode"), pytest.warns(UserWarning):
        compile_in_child(tmp_path, OBJECT_MODE_MODEL, session_cache, workers=2)
    # killed, the second before it could read its work (a worker refusing the model exits with 4)
    assert len(taken) == 2 and taken[0].returncode != 0 and taken[1].returncode == -signal.SIGKILL, \
        [p.returncode for p in taken]


def test_the_jobs_own_object_mode_check_rewrites_no_graph_of_a_model_with_numba_implementations(tmp_path,
                                                                                                  monkeypatch):
    """The check runs on every cold compile, before the second worker starts: for a model whose ops
    all have numba implementations, only a walk over its graphs."""
    import batchfit.compile.entry
    from batchfit.compile.graphs import SamplerGraphs
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    (tmp_path / "model.py").write_text(WARNING_MODEL.format(tag="check", centre="0.5"))
    pd.DataFrame({"y": np.linspace(0.0, 1.0, 5)}).to_csv(tmp_path / "d.csv", index=False)
    with pytest.warns(UserWarning, match="says"):
        model = build_model(load_model_file(tmp_path / "model.py"), load_dataset("d", tmp_path / "d.csv"))
    monkeypatch.setattr(batchfit.compile.entry, "compile_sampler_functions", lambda *a: pytest.fail("rewrote"))
    batchfit.compile.entry.refuse_object_mode_early(model, SamplerGraphs.of(model))


def test_a_worker_that_dies_is_batchfits_failure_with_its_last_words(tmp_path, session_cache):
    """A worker that crashes (here it exits while importing the model file) is not the model's doing:
    the job's error, not a fallback, and it carries what the worker printed."""
    from batchfit.errors import BatchfitError

    source = WARNING_MODEL.format(tag="x", centre="0.5") + textwrap.dedent("""
        import os, sys
        if sys.argv[0].endswith(os.path.join("compile", "worker_process.py")):
            print("the worker's last words", file=sys.stderr, flush=True)
            os._exit(7)
    """)
    with pytest.raises(RuntimeError, match="compile worker") as failure, pytest.warns(UserWarning):
        compile_in_child(tmp_path, source, session_cache)
    assert not isinstance(failure.value, BatchfitError)
    assert "the worker's last words" in "".join(failure.value.__notes__)


def test_the_worker_imports_without_the_garbage_collector_and_compiles_with_it(tmp_path):
    """A compile worker pauses Python's garbage collector for its imports and the model (they live to its end)
    and compiles with it on, that start frozen out of it (`batchfit.common.collector`): its model file, run in
    the worker, records the collector's state there and where the compile (``build_entry``) begins. Cold, in a
    cache of its own: a hit compiles nothing."""
    source = WARNING_MODEL.format(tag="collector", centre="0.125") + textwrap.dedent(f"""
        import gc, os, sys
        if sys.argv[0].endswith(os.path.join("compile", "worker_process.py")):
            worker = sys.modules["__main__"]  # the worker's module: build_entry is looked up when the compile begins
            compile_entry = worker.build_entry
            def recorded(*args, **kwargs):
                with open({str(tmp_path / "collector.txt")!r}, "a") as out:
                    out.write(f"compile {{gc.isenabled()}} {{gc.get_freeze_count() > frozen}}\\n")
                return compile_entry(*args, **kwargs)
            worker.build_entry = recorded
            frozen = gc.get_freeze_count()  # at the model's import: the imports so far are frozen only by resume
            with open({str(tmp_path / "collector.txt")!r}, "a") as out:
                out.write(f"model {{gc.isenabled()}}\\n")
    """)
    with pytest.warns(UserWarning, match="says"):
        compiled = compile_in_child(tmp_path, source, tmp_path / "cache")
    assert not compiled.report.hit
    assert (tmp_path / "collector.txt").read_text().splitlines() == ["model False", "compile True True"]


def test_the_job_imports_nutpie_and_builds_its_functions_while_the_worker_compiles(tmp_path):
    """A cold compile job imports nutpie and builds the per-process functions while the worker
    compiles, not after it, in its main thread (in a fresh process, since the test session has
    long imported nutpie, and an empty cache of its own, so the compile is cold)."""
    script = textwrap.dedent(f"""
        import sys, threading
        from pathlib import Path
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]  # the module, testkit
        import batchfit.compile.sampler
        from test_compile_worker import WARNING_MODEL, compile_in_child

        built_in, init = [], batchfit.compile.sampler.SamplerFunctions.__init__
        def recorded(self, template):
            built_in.append(threading.current_thread().name)
            init(self, template)
        batchfit.compile.sampler.SamplerFunctions.__init__ = recorded
        compiled = compile_in_child(Path({str(tmp_path)!r}), WARNING_MODEL.format(tag="prefetch", centre="0.375"),
                                    Path({str(tmp_path / "cache")!r}))
        assert not compiled.report.hit, "expected a cold compile"
        assert compiled.functions.free_names == ["mu"]
        print("nutpie" in sys.modules, [t.name for t in threading.enumerate() if t.name.startswith("batchfit-")],
              built_in)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "True [] ['MainThread']", out.stdout


def test_the_early_worker_compiles_for_the_cpu_target_the_config_sets_after_it_started(tmp_path):
    """The rule script starts a compile worker before reading its config, whose CPU target
    (generic here; the worker started with numba's default, the host's) numba reads once, on
    import: the worker imports numba only once told it. Were it the host's, the worker's key
    would differ from the job's and the compile fail."""
    (tmp_path / "model.py").write_text(WARNING_MODEL.format(tag="a generic target", centre="0.25"))
    (tmp_path / "data").mkdir()
    pd.DataFrame({"y": np.linspace(0.0, 1.0, 5)}).to_csv(tmp_path / "data" / "d.csv", index=False)
    config = {"model": str(tmp_path / "model.py"), "datasets": [str(tmp_path / "data" / "*.csv")],
              "cache_dir": str(tmp_path / "cache"), "results_dir": str(tmp_path / "results"),
              "cache": {"cpu_target": "generic"}}
    job = textwrap.dedent(f"""\
        from batchfit.compile.worker_pool import compile_workers

        with compile_workers(2) as workers:
            from batchfit.sweep.stages import run_compile
            from batchfit.sweep.snakemake_job import snakemake_config

            print(run_compile(snakemake_config({config!r}, "the test"), workers=workers).line)
    """)
    env = {name: value for name, value in os.environ.items() if name != "NUMBA_CPU_NAME"}
    out = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith("cache miss"), out.stdout


@pytest.mark.filterwarnings("ignore:build_model says")
def test_the_compile_job_starts_its_logp_worker_before_it_knows_the_key(tmp_path, monkeypatch):
    """On two cores the compile job starts one compile worker before it has read its config, built
    the model and its key; on a miss that worker compiles the log density's callback (the
    longest part) and a second one the rest; on a hit the early worker is killed unused. Every
    worker has exited when the job ends."""
    import batchfit.compile.build as build_module
    from batchfit.compile import worker_pool
    from batchfit.compile.worker_pool import compile_workers
    from batchfit.config import config_from_dict
    from batchfit.sweep.stages import run_compile

    events: list[tuple[str, subprocess.Popen | None]] = []

    class Recorded(subprocess.Popen):
        def __init__(self, args, **kwargs):
            super().__init__(args, **kwargs)
            if args[-2:] == ["-m", "batchfit.compile.worker_process"]:
                events.append(("started", self))

    key, run_worker = build_module.sampler_key, worker_pool._run_worker
    monkeypatch.setattr(subprocess, "Popen", Recorded)
    monkeypatch.setattr(build_module, "sampler_key", lambda *a: (events.append(("key", None)), key(*a))[1])
    monkeypatch.setattr(worker_pool, "_run_worker",
                        lambda proc, argv, part: (events.append((part, proc)), run_worker(proc, argv, part))[1])
    (tmp_path / "model.py").write_text(WARNING_MODEL.format(tag="an early worker", centre="0.125"))
    (tmp_path / "data").mkdir()
    pd.DataFrame({"y": np.linspace(0.0, 1.0, 5)}).to_csv(tmp_path / "data" / "d.csv", index=False)
    cache = tmp_path / "cache"
    with compile_workers(2) as workers:  # as the rule script does, before reading the config
        config = config_from_dict({"model": str(tmp_path / "model.py"), "datasets": [str(tmp_path / "data" / "*.csv")],
                                   "cache_dir": str(cache), "results_dir": str(tmp_path / "results")})
        assert run_compile(config, workers=workers).line.startswith("cache miss")
    names = [name for name, _ in events]
    assert names[:2] == ["started", "key"], names
    early = events[0][1]
    assert dict((name, proc) for name, proc in events if name != "started")["logp"] is early
    assert sorted(names) == ["key", "logp", "rest", "started", "started"], names
    assert all(proc.returncode == 0 for name, proc in events if name == "started")

    events.clear()
    with compile_workers(2) as workers:
        assert run_compile(config, workers=workers).line.startswith("cache hit")
    assert [name for name, _ in events] == ["started", "key"]
    assert events[0][1].returncode is not None and events[0][1].returncode < 0  # killed, never given work
