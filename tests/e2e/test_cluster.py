"""Cluster behaviour without a cluster: one plan for every job of a sweep, job resources, CPU targets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from testkit import HIERARCHICAL as MODEL
from testkit import REPO, manifests, snakemake, sweep_settings, write_config

from batchfit.config import config_from_dict
from batchfit.records.compile_stamp import CompileStamp, ReferenceFit
from batchfit.sweep.resources import fit_resources


def sweep_with_a_broken_dataset(root: Path, cache: Path) -> Path:
    """Four good datasets and one whose `y` column is missing, in batches of two; its config file."""
    from batchfit.model.simulate import simulate_datasets

    paths = simulate_datasets(MODEL, root / "data", 4, seed=3, prefix="shop")
    pd.read_csv(paths[0]).drop(columns="y").to_csv(root / "data" / "shop_broken.csv", index=False)
    return write_config(root / "sweep.yaml", sweep_settings(
        cache, batch_size=2, sampler={"draws": 50, "tune": 50, "chains": 2, "seed": 5},
        columns={"group": {"scope": "dataset"}}))


@pytest.mark.slow
def test_a_job_run_after_a_failed_sweep_uses_the_sweeps_plan(tmp_path, session_cache):
    """A cluster job re-parses the Snakefile after datasets failed: collect must find its inputs.

    Then a plain re-run still retries the failed dataset (and only it), in a batch of its own.
    """
    config = sweep_with_a_broken_dataset(tmp_path, session_cache)
    first = snakemake(tmp_path, config)
    assert first.returncode != 0
    assert "batchfit: 1 of 5 dataset(s) failed" in first.stderr and "  1 dataset (shop_broken): " in first.stderr
    assert "results/failures.csv" in first.stderr.splitlines()[-1]
    planned = json.loads((tmp_path / "results" / "plan.json").read_text())["batches"]
    assert sorted(d for members in planned.values() for d in members) == [
        "shop_000", "shop_001", "shop_002", "shop_003", "shop_broken"]

    summary = tmp_path / "results" / "datasets.csv"
    summary.unlink()
    job = snakemake(tmp_path, config, "--target-jobs", "collect:", "--allowed-rules", "collect", "--force",
                    cores=1)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "MissingInputException" not in job.stderr
    status = pd.read_csv(summary).set_index("dataset")["status"]
    assert sorted(status.index) == ["shop_000", "shop_001", "shop_002", "shop_003", "shop_broken"]
    assert status["shop_broken"] == "failed" and "failed" not in set(status.drop("shop_broken"))

    retry = snakemake(tmp_path, config, "--dry-run")
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert re.search(r"^fit\s+1$", retry.stdout, re.MULTILINE), retry.stdout  # one fit job: the failed dataset
    again = snakemake(tmp_path, config)
    assert "batchfit: 1 of 5 dataset(s) failed" in again.stderr and "  1 dataset (shop_broken): " in again.stderr
    batches = manifests(tmp_path / "results").values()
    assert sorted(list(m["datasets"]) for m in batches)[-1] == ["shop_broken"]
    assert sum(list(m["datasets"]) == ["shop_broken"] for m in batches) == 2


def test_a_batch_that_ran_is_retried_under_a_new_name(tmp_path):
    """Its datasets are still pending (they failed): Snakemake must see a job not yet done."""
    from batchfit.sweep.plan import batch_id, untried_batch_id

    config = config_from_dict({"model": str(MODEL), "datasets": [str(MODEL)], "results_dir": str(tmp_path)})
    first = untried_batch_id(config, ["a", "b"], ["1", "2"])
    assert first == batch_id(["a", "b"], ["1", "2"])
    config.layout.batch_manifest(first).parent.mkdir(parents=True)
    config.layout.batch_manifest(first).write_text("{}")
    second = untried_batch_id(config, ["a", "b"], ["1", "2"])
    assert second != first
    config.layout.batch_manifest(second).write_text("{}")
    assert untried_batch_id(config, ["a", "b"], ["1", "2"]) not in (first, second)


def test_fit_resources_follow_the_measurement_the_batch_and_the_attempt(tmp_path):
    config = config_from_dict({"model": str(MODEL), "datasets": [str(MODEL)],
                               "sampler": {"draws": 1000, "tune": 1000, "chains": 4}})
    stamp = tmp_path / "stamp.json"
    CompileStamp(key="k", structure="s", path="cached", reference_dataset="d", line="compiled",
                 reference_fit=ReferenceFit(seconds=2.0, peak_rss_mb=400, draws=2000, chains=4),
                 forward_key=None).write(stamp)
    one, many = fit_resources(config.sampler, 10, stamp), fit_resources(config.sampler, 1000, stamp)
    assert one["mem_mb"] == many["mem_mb"] >= 400  # memory does not grow with the batch
    assert many["runtime"] * 60 >= 1000 * 2.0  # at least the measured time of every dataset
    assert one["runtime"] < many["runtime"]
    again = fit_resources(config.sampler, 1000, stamp, attempt=2)
    assert again["mem_mb"] == 2 * many["mem_mb"] and again["runtime"] == 2 * many["runtime"]
    half = config_from_dict({"model": str(MODEL), "datasets": [str(MODEL)],
                             "sampler": {"draws": 500, "tune": 500, "chains": 4}})
    assert fit_resources(half.sampler, 1000, stamp)["runtime"] < many["runtime"]  # less sampling, less time
    assert fit_resources(config.sampler, 10, tmp_path / "missing.json")["mem_mb"] > 0  # unmeasured: defaults
    # 12 threads and 4 chains: three lanes, each a process of its own, fitting a third of the batch
    lanes = fit_resources(config.sampler, 1000, stamp, threads=12)
    assert lanes["mem_mb"] == 3 * many["mem_mb"] and lanes["runtime"] < many["runtime"] / 2
    assert fit_resources(config.sampler, 1000, stamp, threads=7) == many  # one lane: threads beyond the chains idle


def _target_in_child(env: dict[str, str], cpu_target: str) -> list:
    """The CPU target of the cache key, as a fresh process that applies ``cpu_target`` sees it."""
    code = ("import json, sys; from batchfit.numba_ops.cputarget import apply_cpu_target;"
            "apply_cpu_target(sys.argv[1]);"
            "import numba, llvmlite.binding as llvm; from batchfit.compile import fingerprint as fp;"
            "print(json.dumps([fp.environment_fingerprint(), numba.config.CPU_NAME, numba.config.CPU_FEATURES,"
            "llvm.get_host_cpu_name()]))")
    proc = subprocess.run([sys.executable, "-c", code, cpu_target], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_generic_cpu_target_gives_numba_a_portable_cpu_and_its_own_cache_key():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    host_key, host_name, host_features, cpu = _target_in_child(env, "host")
    generic_key, generic_name, generic_features, _ = _target_in_child(env, "generic")
    assert (host_name, host_features) == (None, None)  # numba's default: the host CPU, all its features
    assert (generic_name, generic_features) == ("generic", "")
    assert generic_key != host_key
    # The same as numba configured by hand: the key follows what numba compiles for.
    assert _target_in_child({**env, "NUMBA_CPU_NAME": "generic"}, "generic")[0] == generic_key
    # "host" is the host even where the environment names another CPU: the config decides.
    assert _target_in_child({**env, "NUMBA_CPU_NAME": cpu}, "host")[0] == host_key


def test_cpu_target_cannot_change_once_numba_is_loaded():
    import numba  # noqa: F401 - loaded for the host CPU, as in every test process

    from batchfit.errors import BatchfitError
    from batchfit.numba_ops.cputarget import apply_cpu_target

    with pytest.raises(BatchfitError, match="cache.cpu_target 'generic' .* must be set before numba is loaded"):
        apply_cpu_target("generic", "sweep.yaml")


def test_the_compile_stage_times_a_short_fit_which_the_resources_scale_to_the_sweep(tmp_path, hierarchical_entry):
    """The compile job's measured fit is at most REFERENCE_ITERATIONS warm-up and draws per chain: short
    beside the sweep's own fits, which wait for it; a fit job's time is scaled from it to the sweep's."""
    from batchfit.sweep.stages import REFERENCE_ITERATIONS, run_compile

    def measured(sampler: dict) -> tuple[dict, Path]:
        config = config_from_dict({"model": str(MODEL), "datasets": [str(REPO / "data" / "example" / "*.csv")],
                                   "columns": {"group": {"scope": "dataset"}}, "cache_dir": str(hierarchical_entry),
                                   "results_dir": str(tmp_path / "results"), "sampler": sampler})
        stamp = tmp_path / "stamp.json"
        run_compile(config).write(stamp)
        return config, stamp

    config, stamp = measured({"draws": 1000, "tune": 1000, "chains": 2, "seed": 1})
    fit = CompileStamp.read(stamp).reference_fit
    assert fit is not None and (fit.draws, fit.chains) == (2 * REFERENCE_ITERATIONS, 2), fit
    assert fit.seconds > 0 and fit.peak_rss_mb > 0
    # a dataset's time, in the runtime of a job of 100: ten times the measured iterations, with the margin
    runtime = fit_resources(config.sampler, 100, stamp)["runtime"]
    assert runtime * 60 >= 100 * fit.seconds * (2000 / (2 * REFERENCE_ITERATIONS))
    # a sweep with fewer iterations than that is measured with its own
    _, stamp = measured({"draws": 40, "tune": 30, "chains": 2, "seed": 1})
    assert CompileStamp.read(stamp).reference_fit.draws == 70
