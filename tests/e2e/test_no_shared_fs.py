"""A sweep without a shared filesystem (issue #46): Snakemake's ``--shared-fs-usage none`` with a real
storage plugin (``snakemake-storage-plugin-fs``, its prefix another directory), each fit job in an
empty working directory of its own.

Each fit job runs as a cluster job (Snakemake's cluster-generic executor) in a mount namespace where
the project directory is an empty tmpfs holding only the project's git-tracked files, what a cloud
executor deploys as the workflow's sources: no data, no results directory, no cache. Everything else
a job reads comes through the storage plugin (the compiled bundle, the staged inputs) and everything
it writes goes back through it (its own output directory, its log). So one compile runs in the whole
sweep, each fit job installs the compiled bundle into its empty cache, and the posteriors equal a
shared-filesystem sweep's bit for bit.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from testkit import HIERARCHICAL, SNAKEFILE, SNAKEMAKE, posterior_arrays, snakemake, sweep_settings, write_config

# A cluster job ($1: Snakemake's jobscript) in its own mount namespace, working in an empty project
# directory with the project's sources; it refuses to run if the data or results show through.
SUBMIT = """#!/bin/sh
id=$(date +%s%N)
cp "$1" {hold}/$id.sh
git -C {project} archive --format=tar HEAD > {hold}/$id.tar
( unshare --mount sh -c '
    mount -t tmpfs tmpfs {project} && tar -xf "$1" -C {project} && cd {project} && test ! -e data &&
    test ! -e tables && test ! -e results && test ! -e cache && exec sh "$0"' {hold}/$id.sh {hold}/$id.tar \
  >> {hold}/jobs.log 2>&1 < /dev/null; echo $? > {hold}/$id.rc ) > /dev/null 2>&1 &
echo $id
"""
STATUS = """#!/bin/sh
if [ ! -f {hold}/$1.rc ]; then echo running; elif [ "$(cat {hold}/$1.rc)" = 0 ]; then echo success; else echo failed; fi
"""


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def project(root: Path, cache: Path) -> Path:
    """A user's project: model.py and its config under git, six simulated datasets (not tracked): three files,
    and three as the groups of one table (a fit job gets their rows, staged); the new inputs of every dataset's
    predictions in one table too (a predict job gets its datasets' rows, staged)."""
    from batchfit.model.simulate import simulate_datasets

    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HIERARCHICAL, root / "model.py")
    files = simulate_datasets(root / "model.py", root / "data", 6, seed=21, prefix="far")
    (root / "tables").mkdir()
    pd.concat([pd.read_csv(f).assign(shop=f.stem) for f in files[3:]]).to_csv(root / "tables" / "shops.csv",
                                                                               index=False)
    for moved in files[3:]:
        moved.unlink()
    new = [pd.DataFrame({"shop": f.stem, "group": ["g00", "g01"] * 3, "x": np.linspace(-1.0, 1.0, 6) + i})
           for i, f in enumerate(files)]
    pd.concat(new).to_csv(root / "tables" / "new.csv", index=False)
    config = write_config(root / "sweep.yaml", sweep_settings(
        cache, model="model.py", batch_size=2, sampler={"draws": 100, "tune": 100, "chains": 2, "seed": 8},
        columns={"group": {"scope": "dataset"}}, datasets=["data/*.csv", {"table": "tables/shops.csv", "by": "shop"}],
        predict={"data": {"table": "tables/new.csv", "by": "shop"}}))
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "model.py", "sweep.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "the project"], check=True)
    return config


def script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fits(results: Path) -> dict[str, dict]:
    return {p.stem: posterior_arrays(p) for p in sorted((results / "fits").glob("*.nc"))}


def predictions(results: Path) -> dict[str, dict]:
    return {p.stem: posterior_arrays(p, group="predictions") for p in sorted((results / "predictions").glob("*.nc"))}


@pytest.mark.slow
def test_a_sweep_through_a_storage_plugin_fits_the_same_draws_in_jobs_that_see_only_their_inputs(tmp_path):
    if not can_unshare():
        pytest.fail("this test needs `unshare --mount` (root, or a user namespace): run it as CI does, as root")
    if shutil.which("rsync") is None:
        pytest.fail("snakemake-storage-plugin-fs needs rsync (apt-get install rsync; .ci/run installs it)")
    shared = tmp_path / "shared"
    reference = snakemake(shared, project(shared, shared / "cache"))
    assert reference.returncode == 0, reference.stderr[-3000:]

    apart, storage, hold = tmp_path / "apart", tmp_path / "storage", tmp_path / "hold"
    storage.mkdir()
    hold.mkdir()
    config = project(apart, apart / "cache")
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}{os.pathsep}{os.environ['PATH']}"}  # the jobs' `python`
    run = subprocess.run(
        [str(SNAKEMAKE), "--snakefile", str(SNAKEFILE), "--directory", str(apart), "--configfile", config.name,
         "--executor", "cluster-generic", "--jobs", "4", "--latency-wait", "5",
         "--cluster-generic-submit-cmd", script(hold / "submit.sh", SUBMIT.format(hold=hold, project=apart)),
         "--cluster-generic-status-cmd", script(hold / "status.sh", STATUS.format(hold=hold)),
         "--shared-fs-usage", "none", "--default-storage-provider", "fs", "--default-storage-prefix", str(storage)],
        cwd=apart, capture_output=True, text=True, timeout=1200, env=env)
    jobs_log = (hold / "jobs.log").read_text() if (hold / "jobs.log").exists() else ""
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n--- jobs\n{jobs_log[-4000:]}"

    # Three fit jobs and three predict jobs ran as cluster jobs, each in its empty directory (the submit script
    # checks it).
    assert len(list(hold.glob("*.rc"))) == 6 and all(p.read_text().strip() == "0" for p in hold.glob("*.rc"))
    compile_logs = sorted((apart / "results" / "logs" / "compile").glob("*.log"))
    assert len(compile_logs) == 1, compile_logs  # one compile in the whole sweep, on the submitting machine
    assert "cache miss" in compile_logs[0].read_text()
    fit_logs = sorted((storage / "results" / "logs" / "fit").glob("*.log"))  # came back through storage
    assert len(fit_logs) == 3, fit_logs
    for log in fit_logs:
        text = log.read_text()
        assert "installed from the compiled bundle" in text and "cache miss" not in text, f"{log.name}:\n{text}"

    # Each predict job installed the forward function the compile job compiled from the bundle, and compiled none.
    predict_logs = sorted((storage / "results" / "logs" / "predict").glob("*.log"))
    assert len(predict_logs) == 3, predict_logs
    for log in predict_logs:
        text = log.read_text()
        assert "forward function" in text and "installed from the compiled bundle" in text, f"{log.name}:\n{text}"
        assert "compiled in" not in text and "cache miss" not in text, f"{log.name}:\n{text}"
    expected, actual = predictions(shared / "results"), predictions(apart / "results")
    assert sorted(actual) == sorted(expected) == [f"far_{i:03d}" for i in range(6)]
    for dataset, draws in expected.items():
        assert actual[dataset]["y_obs"].tobytes() == draws["y_obs"].tobytes(), f"{dataset}: predictions differ"
    assert (apart / "results" / "predictions.csv").read_text() == (shared / "results" / "predictions.csv").read_text()
    table = pd.read_csv(apart / "results" / "predictions.csv")  # each dataset's own rows of the new-data table
    np.testing.assert_allclose(table[table["dataset"] == "far_004"]["x"], np.linspace(-1.0, 1.0, 6) + 4)

    expected, actual = fits(shared / "results"), fits(apart / "results")
    assert sorted(actual) == sorted(expected) == [f"far_{i:03d}" for i in range(6)]
    for dataset, draws in expected.items():
        assert actual[dataset].keys() == draws.keys()
        for name, values in draws.items():
            assert actual[dataset][name].tobytes() == values.tobytes(), f"{dataset}: {name} differs"
    summary = (apart / "results" / "summary.csv").read_text()
    assert summary == (shared / "results" / "summary.csv").read_text()
    # datasets.csv names each dataset's own file, not the copy staged for its job
    paths = [pd.read_csv(r / "results" / "datasets.csv", index_col="dataset")["path"] for r in (shared, apart)]
    assert paths[1].to_dict() == paths[0].to_dict() == {d: f"data/{d}.csv" if d < "far_003" else "tables/shops.csv"
                                                         for d in expected}
