"""A fit job killed in the middle of its batch leaves no half-written output, and a re-run fits
only the missing datasets, to the same posteriors as a run that was never interrupted.

The real ``snakemake`` on the repository's Snakefile (tests/testkit/), in temporary projects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import (
    manifests,
    output_of,
    posterior_arrays,
    snakemake,
    snakemake_command,
    sweep_settings,
    table,
    write_config,
)


def _descendants_in_group(pgid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every live process in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def _assert_every_output_readable(results: Path) -> None:
    for path in results.rglob("*"):
        if not path.is_file() or path.name.startswith("."):
            continue  # temporary files of atomic writes are never read as outputs
        if path.suffix == ".nc":
            with xr.open_datatree(path, engine="h5netcdf") as tree:
                if path.parent.name == "fits":
                    assert tree["posterior"].to_dataset().load().sizes["draw"] == 100
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".csv":
            pd.read_csv(path)


@pytest.mark.slow
def test_killed_fit_job_leaves_nothing_half_written_and_a_rerun_gives_the_same_posteriors(
    tmp_path: Path, session_cache: Path
) -> None:
    ids = [f"s_{i}" for i in range(6)]
    runs = {}
    for name in ("killed", "reference"):
        project = tmp_path / name
        for i, dataset_id in enumerate(ids):
            (project / "data").mkdir(parents=True, exist_ok=True)
            table(100 + i, 3000, 6).to_csv(project / "data" / f"{dataset_id}.csv", index=False)
        runs[name] = (project, write_config(project / "sweep.yaml", sweep_settings(session_cache, batch_size=6)))

    # The uninterrupted reference run, in the background meanwhile.
    ref_project, ref_config = runs["reference"]
    reference = subprocess.Popen(snakemake_command(ref_project, ref_config), cwd=ref_project, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)

    project, config = runs["killed"]
    fits = project / "results" / "fits"
    job = subprocess.Popen(snakemake_command(project, config), cwd=project, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(fits.glob("s_*.nc")):
            assert job.poll() is None, "snakemake ended before writing a fit"
            assert time.monotonic() < deadline, "no fit written in time"
            time.sleep(0.02)
        # Aim for the moment the next fit is being written (its temporary file exists).
        deadline = time.monotonic() + 10
        while not any(fits.glob(".*.tmp*")) and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.001)
        fit_jobs = [pid for pid, argv in _descendants_in_group(job.pid)
                    if argv and "python" in Path(argv[0]).name and any(a.endswith(".fit.py") for a in argv)]
        assert fit_jobs, _descendants_in_group(job.pid)
        for pid in fit_jobs:
            os.kill(pid, signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)  # and the whole job, as a cluster kill would
    finally:
        job.wait(timeout=60)
    written = sorted(p.stem for p in fits.glob("s_*.nc"))
    print("killed after", written, "leaving", sorted(p.name for p in fits.glob(".*")))
    assert 1 <= len(written) < len(ids), f"not killed in the middle of the batch: {written}"
    assert not (project / "results" / "batches").exists() or not any((project / "results" / "batches").iterdir())
    _assert_every_output_readable(project / "results")

    # Re-run (Snakemake's lock is stale after the kill): completes, fits only what is missing.
    snakemake(project, config, "--unlock")
    run = snakemake(project, config, "--rerun-incomplete")
    assert run.returncode == 0, output_of(run)
    [manifest] = manifests(project / "results").values()
    assert sorted(manifest["datasets"]) == [d for d in ids if d not in written]
    _assert_every_output_readable(project / "results")
    assert not list(fits.glob(".*.tmp*")), "the re-run removes what the killed job left half-written"

    out, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, out
    for dataset_id in ids:
        resumed = posterior_arrays(fits / f"{dataset_id}.nc")
        uninterrupted = posterior_arrays(ref_project / "results" / "fits" / f"{dataset_id}.nc")
        assert resumed.keys() == uninterrupted.keys()
        for name in resumed:
            assert np.array_equal(resumed[name], uninterrupted[name]), (dataset_id, name)
