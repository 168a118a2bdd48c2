"""End to end: a NONMEM-style table swept by the real snakemake, against the same rows as a file per subject.

The table (``ID, TIME, DV, AMT, EVID, MDV, WT``: each subject's dosing record, then its observations)
is split by ``ID``; the dosing records are skipped by a row rule and the dose comes from a side table
of them, the weight from the subject's rows, both as ``data.scalar`` (models/pk_oral.py).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import REPO, output_of, planned_jobs, snakemake, write_config

PK_MODEL = REPO / "models" / "pk_oral.py"
SAMPLER = {"draws": 100, "tune": 150, "chains": 2, "target_accept": 0.9, "seed": 2026}


def pk_table(n_subjects: int = 5):
    """A NONMEM-style table drawn by the bundled PK model's ``simulate``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pk_oral", PK_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.simulate(np.random.default_rng(11), n_subjects)


def sweep_config(tmp_path, cache, datasets, name):
    return write_config(tmp_path / f"{name}.yaml", {
        "model": str(PK_MODEL), "datasets": datasets, "values": {"table": "doses.csv", "by": "ID"},
        "rows": {"where": "EVID == 0"}, "columns": {"TIME": {"min": 0}}, "sampler": SAMPLER, "batch_size": 3,
        "cache_dir": str(cache), "results_dir": f"results-{name}"})


def posterior(results, dataset_id):
    with xr.open_datatree(results / "fits" / f"{dataset_id}.nc") as tree:
        return tree["posterior"].to_dataset().load()


@pytest.mark.slow
def test_a_nonmem_table_sweeps_with_one_compile_as_the_same_rows_as_files_and_refits_only_what_changed(
        tmp_path, session_cache):
    table = pk_table()
    table.to_csv(tmp_path / "pk.csv", index=False)
    doses = table[table.EVID == 1][["ID", "AMT"]].rename(columns={"AMT": "dose"})
    doses.to_csv(tmp_path / "doses.csv", index=False)
    (tmp_path / "files").mkdir()
    for subject, rows in table.groupby("ID"):
        rows.to_csv(tmp_path / "files" / f"{subject}.csv", index=False)
    by_table = sweep_config(tmp_path, session_cache, [{"table": "pk.csv", "by": "ID"}], "table")
    by_files = sweep_config(tmp_path, session_cache, ["files/*.csv"], "files")

    for config in (by_table, by_files):
        run = snakemake(tmp_path, config)
        assert run.returncode == 0, output_of(run)[-3000:]
    ids = [str(i) for i in sorted(table.ID.unique())]
    table_results, file_results = tmp_path / "results-table", tmp_path / "results-files"
    rows = pd.read_csv(table_results / "datasets.csv", dtype={"dataset": str})
    assert rows["dataset"].tolist() == ids and set(rows["status"]) <= {"ok", "warning"}
    assert rows["structure"].nunique() == 1  # every dose and weight shares one structure, one compile
    assert (rows["dropped_where"] == 1).all() and (rows["dropped_missing"] == 0).all()
    assert (rows["rows"] == table[table.EVID == 0].groupby("ID").size().to_numpy()).all()
    logs = "".join(log.read_text() for log in (table_results / "logs" / "fit").glob("*.log"))
    assert "cache hit" in logs and "cache miss" not in logs
    for dataset_id in ids:  # bit for bit: the same data, ids and seeds give the same draws
        a, b = posterior(table_results, dataset_id), posterior(file_results, dataset_id)
        assert set(a.data_vars) == set(b.data_vars) == {"log_CL", "log_V", "log_ka", "sigma", "CL", "t_half"}
        for name in a.data_vars:
            np.testing.assert_array_equal(a[name].values, b[name].values)

    changed = table.copy()
    changed.loc[(changed.ID == 3) & (changed.EVID == 0), "DV"] *= 1.1  # one subject's observations change
    changed.to_csv(tmp_path / "pk.csv", index=False)
    dry = snakemake(tmp_path, by_table, "--dry-run")
    assert dry.returncode == 0, output_of(dry)[-3000:]
    assert planned_jobs(dry)["fit"] == 1
    assert re.search(r"fit batch-\w+: 1 dataset\(s\)", output_of(dry)), output_of(dry)[-2000:]

    round_robin = table.assign(k=table.groupby("ID").cumcount()).sort_values(["k", "ID"], kind="stable")
    round_robin.drop(columns="k")[list(reversed(table.columns))].to_csv(tmp_path / "pk.csv", index=False)
    dry = snakemake(tmp_path, by_table, "--dry-run")  # the same rows, another order between subjects
    assert dry.returncode == 0, output_of(dry)[-3000:]
    assert "fit" not in planned_jobs(dry), output_of(dry)[-2000:]

    # A subject leaves the table and a new one comes: the new one is fitted alone, the other's fit moves out.
    before = {p.name: p.stat().st_mtime_ns for p in (table_results / "fits").glob("*.nc")}
    newcomer = pk_table(6)
    newcomer = newcomer[newcomer.ID == 6]
    pd.concat([table[table.ID != 5], newcomer]).to_csv(tmp_path / "pk.csv", index=False)
    pd.concat([doses, newcomer[newcomer.EVID == 1][["ID", "AMT"]].rename(columns={"AMT": "dose"})]).to_csv(
        tmp_path / "doses.csv", index=False)
    run = snakemake(tmp_path, by_table)
    assert run.returncode == 0, output_of(run)[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in (table_results / "fits").glob("*.nc")}
    assert set(after) == set(before) - {"5.nc"} | {"6.nc"}
    assert all(after[name] == before[name] for name in after if name != "6.nc")  # nothing else refitted
    assert (table_results / "orphaned" / "fits" / "5.nc").is_file()
    assert pd.read_csv(table_results / "datasets.csv", dtype={"dataset": str})["dataset"].tolist() == \
        ["1", "2", "3", "4", "6"]
