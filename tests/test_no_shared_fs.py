"""A sweep whose jobs do not share the cache: the compiled bundle is the only way the compile job's
work reaches the fit jobs (issue #46).

Each job runs as a cluster job (Snakemake's cluster-generic executor) in a mount namespace of its
own, where ``cache_dir`` is an empty tmpfs and only ``cache_dir/batchfit/compiled/`` (the compile
rule's outputs, the stamp and the bundle: what a storage plugin would move) shows through. So every
job starts on an empty cache, as on Kubernetes or a cloud batch system, and nothing a job compiles
outlives it. The results directory is still shared here.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from testkit import SNAKEFILE, SNAKEMAKE, posterior_arrays, snakemake, sweep_settings, write_config

SUBMIT = """#!/bin/sh
# A cluster job ($1: Snakemake's jobscript) in its own mount namespace: an empty cache but for compiled/.
cache={cache}
hold={hold}
unshare --mount sh -c '
  mount --bind "$0/batchfit/compiled" "$1" &&
  mount -t tmpfs -o mode=700 tmpfs "$0" &&
  mkdir -p "$0/batchfit/compiled" &&
  mount --bind "$1" "$0/batchfit/compiled" &&
  exec sh "$2"' "$cache" "$hold" "$1" >> {log} 2>&1 < /dev/null &
echo $!
"""


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def sweep(root: Path, cache: Path) -> Path:
    """Six datasets of the hierarchical model in three batches of two; the config file."""
    from batchfit.model.simulate import simulate_datasets

    simulate_datasets(Path(sweep_settings(cache)["model"]), root / "data", 6, seed=21, prefix="far")
    return write_config(root / "sweep.yaml", sweep_settings(
        cache, batch_size=2, sampler={"draws": 100, "tune": 100, "chains": 2, "seed": 8},
        columns={"group": {"scope": "dataset"}}))


def fits(results: Path) -> dict[str, dict]:
    return {p.stem: posterior_arrays(p) for p in sorted((results / "fits").glob("*.nc"))}


@pytest.mark.slow
def test_jobs_without_the_shared_cache_install_the_bundle_and_fit_the_same_draws(tmp_path, session_cache):
    if not can_unshare():
        pytest.fail("this test needs `unshare --mount` (root, or a user namespace): run it as CI does, as root")
    shared = tmp_path / "shared"
    reference = snakemake(shared, sweep(shared, session_cache))
    assert reference.returncode == 0, reference.stderr[-3000:]

    apart = tmp_path / "apart"
    cache = apart / "cache"
    (cache / "batchfit" / "compiled").mkdir(parents=True)
    (apart / "hold").mkdir()
    submit = apart / "submit.sh"
    submit.write_text(SUBMIT.format(cache=cache, hold=apart / "hold", log=apart / "jobs.log"))
    submit.chmod(submit.stat().st_mode | stat.S_IXUSR)
    config = sweep(apart, cache)
    run = subprocess.run([str(SNAKEMAKE), "--snakefile", str(SNAKEFILE), "--directory", str(apart),
                          "--configfile", str(config), "--executor", "cluster-generic",
                          "--cluster-generic-submit-cmd", str(submit), "--jobs", "4", "--latency-wait", "5"],
                         cwd=apart, capture_output=True, text=True, timeout=1200)
    jobs_log = (apart / "jobs.log").read_text() if (apart / "jobs.log").exists() else ""
    assert run.returncode == 0, f"{run.stderr[-3000:]}\n--- jobs\n{jobs_log[-3000:]}"

    compile_log = (apart / "results" / "logs" / "compile.log").read_text()
    assert "cache miss" in compile_log, compile_log
    fit_logs = sorted((apart / "results" / "logs" / "fit").glob("*.log"))
    assert len(fit_logs) == 3
    for log in fit_logs:
        text = log.read_text()
        assert "installed from the compiled bundle" in text and "cache miss" not in text, f"{log.name}:\n{text}"
    # Nothing but the compile rule's outputs reached the submitting side's cache: the jobs' caches were their own.
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()) == sorted(
        p.relative_to(cache).as_posix() for p in (cache / "batchfit" / "compiled").iterdir())

    expected, actual = fits(shared / "results"), fits(apart / "results")
    assert sorted(actual) == sorted(expected) == [f"far_{i:03d}" for i in range(6)]
    for dataset, draws in expected.items():
        assert actual[dataset].keys() == draws.keys()
        for name, values in draws.items():
            assert actual[dataset][name].tobytes() == values.tobytes(), f"{dataset}: {name} differs"
