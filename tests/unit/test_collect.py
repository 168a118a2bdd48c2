"""Collect stage: fake fits (no sampling) in, posteriors.nc / summary.csv / failures.csv out."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import arviz
import arviz_stats
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st

import batchfit
from batchfit.common.atomic import atomic_path, remove_stale_temporaries
from batchfit.config import Config, config_from_dict, config_to_dict
from batchfit.errors import BatchfitError, DatasetError
from batchfit.fitting.outcome import record_failure
from batchfit.layout import ResultsLayout
from batchfit.model.variables import DETERMINISTIC, ROLE_ATTR
from batchfit.outputs.collect import collect, collect_fits
from batchfit.outputs.combined import dataset_posterior
from batchfit.outputs.health import DATASET_COLUMNS
from batchfit.outputs.summary_cache import dataset_health
from batchfit.records import fit_attributes
from batchfit.records.manifest import Outcome

CHAINS, DRAWS = 2, 50


@dataclass(frozen=True)
class Health:
    max_r_hat: float = 1.1
    min_ess_bulk: float = 20.0
    max_divergences: int = 0
    var_names: tuple[str, ...] | None = None
    filter_vars: str | None = None
    min_ess_tail: float = 20.0
    max_treedepth_fraction: float = 0.0
    min_bfmi: float = 0.3
    min_rows: int | None = None


def sweep_config(results_dir: Path) -> Config:
    """A real Config whose results go to ``results_dir``, with the thresholds of ``Health()``."""
    health = Health()
    return config_from_dict({
        "model": "model.py",
        "datasets": ["*.csv"],
        "results_dir": str(results_dir),
        "health": {name: getattr(health, name) for name in ("max_r_hat", "min_ess_bulk", "min_ess_tail",
                                                               "max_divergences", "max_treedepth_fraction",
                                                               "min_bfmi")},
    })


def write_fit(
    config: Config, dataset_id: str, n_groups: int, *, seed: int, divergent: int = 0, shift_chain: bool = False,
    stuck_deterministic: bool = False,
) -> Path:
    """Write a fit file in the fit stage's format with random draws (no sampling).

    With `stuck_deterministic`, a deterministic ``d`` whose chains disagree is added.
    """
    rng = np.random.default_rng(seed)
    groups = [f"g{i + 1}" for i in range(n_groups)]
    sample = {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
    sigma = np.abs(rng.normal(1.0, 0.1, size=(CHAINS, DRAWS)))
    if shift_chain:
        sigma[1] += 5.0  # chains disagree: r_hat far above 1
    posterior = xr.Dataset(
        {
            "a": (("chain", "draw", "group"), rng.normal(size=(CHAINS, DRAWS, n_groups))),
            "sigma": (("chain", "draw"), sigma),
            "L": (("chain", "draw", "group", "k"), rng.normal(size=(CHAINS, DRAWS, n_groups, 2))),
        },
        coords={**sample, "group": groups, "k": [0, 1]},
        attrs={"inference_library": "nutpie"},
    )
    if stuck_deterministic:
        stuck = rng.normal(size=(CHAINS, DRAWS)) + np.array([[0.0], [5.0]])
        posterior["d"] = xr.Variable(("chain", "draw"), stuck, attrs={ROLE_ATTR: DETERMINISTIC})
    diverging = np.zeros((CHAINS, DRAWS), dtype=bool)
    diverging.flat[:divergent] = True
    sample_stats = xr.Dataset(
        {"diverging": (("chain", "draw"), diverging), "lp": (("chain", "draw"), rng.normal(size=(CHAINS, DRAWS)))},
        coords=sample,
    )
    observed = xr.Dataset({"y": ("obs", rng.normal(size=10))}, coords={"obs": np.arange(10)})
    constant = xr.Dataset({"group_idx": ("obs", rng.integers(0, n_groups, size=10))}, coords={"obs": np.arange(10)})
    tree = xr.DataTree.from_dict(
        {"posterior": posterior, "sample_stats": sample_stats, "observed_data": observed, "constant_data": constant}
    )
    tree.attrs = {
        fit_attributes.FORMAT: fit_attributes.VERSION,
        "batchfit_version": batchfit.__version__,
        "dataset": dataset_id,
        "source": f"data/{dataset_id}.csv",
        "model_file": "model.py",
        "model_hash": "abc123",
        "seed": seed,
        "sampler": json.dumps({"draws": DRAWS, "chains": CHAINS}),
    }
    path = config.layout.fit(dataset_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree.to_netcdf(path, engine="h5netcdf")
    return path


def write_failure(config: Config, dataset_id: str, message: str) -> Path:
    outcome = Outcome(dataset_id, "failed", 0.0, stage="check", error_type="DatasetError", message=message)
    record_failure(config, outcome, Path(f"data/{dataset_id}.csv"))
    return config.layout.failure(dataset_id)


IDS = ["store_01", "store_02", "store_03", "store_04", "store_07"]
FAILURE_COLUMNS = ["dataset", "path", "stage", "error_type", "message", "reason", "traceback"]
FAILURE_MESSAGE = "dataset error (dataset 'store_04', column 'y'): 3 missing values, first in row 7"


@pytest.fixture
def sweep(tmp_path: Path) -> Config:
    """Five datasets: two ok, one divergent, one with a stuck chain, one failed."""
    config = sweep_config(tmp_path / "results")
    write_fit(config, "store_01", 3, seed=1)
    write_fit(config, "store_02", 5, seed=2, divergent=4)
    write_fit(config, "store_03", 3, seed=3, shift_chain=True)
    write_failure(config, "store_04", FAILURE_MESSAGE)
    write_fit(config, "store_07", 5, seed=7)
    return config


def test_collect_report(sweep: Config) -> None:
    report = collect(sweep, IDS)
    assert (report.n_ok, report.n_warning, report.n_failed) == (2, 2, 1)
    assert report.warning_ids == ["store_02", "store_03"]
    assert report.failed_ids == ["store_04"]
    assert report.one_line() == (
        f"collect: 2 ok, 2 warning, 1 failed of 5 datasets (see {sweep.results_dir / 'failures.csv'})"
    )
    assert {report.posteriors_path, report.summary_path, report.failures_path} == {
        sweep.layout.posteriors,
        sweep.layout.summary,
        sweep.layout.failures_csv,
    }
    leftovers = [p.name for p in sweep.results_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_posteriors_stack_datasets_along_a_dimension(sweep: Config) -> None:
    collect(sweep, IDS)
    fitted = ["store_01", "store_02", "store_03", "store_07"]
    with xr.open_datatree(sweep.layout.posteriors) as tree:
        assert tree.attrs["n_datasets"] == 4
        posterior, info = tree["posterior"].ds, tree["datasets"].ds
        assert list(posterior["dataset"].values) == fitted
        assert set(posterior.data_vars) == {"a", "sigma", "L"}
        assert posterior["a"].dims == ("dataset", "chain", "draw", "group")
        assert list(posterior["group"].values) == ["g1", "g2", "g3", "g4", "g5"]  # the union of the labels
        assert info["group_present"].sel(dataset="store_01").values.tolist() == [True] * 3 + [False] * 2
        assert np.isnan(posterior["a"].sel(dataset="store_01", group="g4")).all()  # padding
        assert info["model_hash"].sel(dataset="store_01").item() == "abc123"
        assert info["divergences"].sel(dataset="store_02").item() == 4
        for dataset_id in fitted:
            with xr.open_datatree(sweep.layout.fit(dataset_id)) as fit:
                xr.testing.assert_equal(dataset_posterior(posterior, info, dataset_id), fit["posterior"].to_dataset())


def test_variables_differing_between_datasets_follow_the_padding_rule(tmp_path: Path) -> None:
    """A variable some fits lack is NaN there; one whose dims differ is left out; an int padded comes back int."""
    config = sweep_config(tmp_path / "results")
    write_fit(config, "s1", 2, seed=1, stuck_deterministic=True)
    write_fit(config, "s2", 3, seed=2)
    with xr.open_datatree(config.layout.fit("s1")) as tree:
        odd = tree.to_dict()
    odd["/posterior"] = odd["/posterior"].assign(
        L=(("chain", "draw", "k", "group"), odd["/posterior"]["L"].transpose("chain", "draw", "k", "group").values),
        n=(("chain", "draw", "group"), np.arange(CHAINS * DRAWS * 2).reshape(CHAINS, DRAWS, 2)))
    config.layout.fit("s1").unlink()
    xr.DataTree.from_dict(odd).to_netcdf(config.layout.fit("s1"), engine="netcdf4")
    collect(config, ["s1", "s2"])
    with xr.open_datatree(config.layout.posteriors) as tree:
        posterior, info = tree["posterior"].ds, tree["datasets"].ds
        assert "L" not in posterior and "L" in json.loads(tree.attrs["excluded_variables"])
        assert np.isnan(posterior["d"].sel(dataset="s2")).all()
        ours = dataset_posterior(posterior, info, "s1")
        with xr.open_datatree(config.layout.fit("s1")) as fit:
            xr.testing.assert_equal(ours, fit["posterior"].to_dataset().drop_dims("k"))
        assert ours["n"].dtype == fit["posterior"]["n"].dtype
        assert "d" not in dataset_posterior(posterior, info, "s2")


def test_outputs_open_with_arviz(sweep: Config) -> None:
    collect(sweep, IDS)
    fit = arviz.from_netcdf(sweep.layout.fit("store_01"))
    assert {"posterior", "sample_stats", "observed_data", "constant_data"} <= set(fit.children)
    combined = arviz.from_netcdf(sweep.layout.posteriors)
    table = arviz.summary(combined, round_to="none")  # every dataset at once
    assert "a[store_07, g5]" in table.index and table.loc["a[store_01, g5]"].isna().all()
    one = arviz.summary(combined["posterior"].ds.sel(dataset="store_07"), round_to="none")
    reference = arviz.summary(arviz.from_netcdf(sweep.layout.fit("store_07")), round_to="none")
    pd.testing.assert_frame_equal(one, reference)


def test_summary_csv(sweep: Config) -> None:
    collect(sweep, IDS)
    summary = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    reference = arviz.summary(arviz.from_netcdf(sweep.layout.fit("store_01")), round_to="none")
    assert list(reference.columns) == ["mean", "sd", "eti89_lb", "eti89_ub", "ess_bulk", "ess_tail", "r_hat",
                                       "mcse_mean", "mcse_sd"]  # ArviZ's default interval: 89% ETI
    assert list(summary.columns) == ["dataset", "parameter", *reference.columns]  # the dataset's own: datasets.csv

    # a[g], sigma, L[g, k] per dataset: 3+1+6, 5+1+10, 3+1+6, 5+1+10; the failed one has none
    assert summary.groupby("dataset", sort=False).size().to_dict() == {
        "store_01": 10,
        "store_02": 16,
        "store_03": 10,
        "store_07": 16,
    }
    store_01 = summary[summary["dataset"] == "store_01"]
    assert list(store_01["parameter"]) == [
        "a[g1]", "a[g2]", "a[g3]", "sigma",
        "L[g1, 0]", "L[g1, 1]", "L[g2, 0]", "L[g2, 1]", "L[g3, 0]", "L[g3, 1]",
    ]  # fmt: skip
    np.testing.assert_allclose(store_01[reference.columns], reference.loc[store_01["parameter"]], rtol=1e-10)


def test_datasets_csv_has_a_row_per_dataset_with_its_health(sweep: Config) -> None:
    """datasets.csv (#45): a dataset's own columns once, in the sweep's order, failed datasets included."""
    collect(sweep, IDS)
    summary = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    datasets = pd.read_csv(sweep.layout.datasets_csv, keep_default_na=False, na_values=[""])
    assert list(datasets.columns) == DATASET_COLUMNS and list(datasets["dataset"]) == IDS
    datasets = datasets.set_index("dataset")
    assert datasets["status"].to_dict() == {"store_01": "ok", "store_02": "warning", "store_03": "warning",
                                            "store_04": "failed", "store_07": "ok"}
    assert pd.isna(datasets.loc["store_01", "message"])
    assert datasets.loc["store_01", "divergences"] == 0 and datasets.loc["store_02", "divergences"] == 4
    store_02 = summary[summary["dataset"] == "store_02"]  # every variable of these fits is a free parameter
    assert datasets.loc["store_02", "max_r_hat"] == pytest.approx(store_02["r_hat"].max())
    assert datasets.loc["store_02", "min_ess_bulk"] == pytest.approx(store_02["ess_bulk"].min())
    assert datasets.loc["store_02", "min_ess_tail"] == pytest.approx(store_02["ess_tail"].min())
    assert datasets.loc["store_02", "max_r_hat"] <= Health().max_r_hat  # warned for divergences only
    assert datasets.loc["store_02", "message"] == f"4 divergences > {Health().max_divergences}"
    assert datasets.loc["store_03", "max_r_hat"] > 1.5
    with xr.open_datatree(sweep.layout.fit("store_01")) as fit:
        assert datasets.loc["store_01", "seed"] == int(fit.attrs["seed"])
    failed = datasets.loc["store_04"]
    assert failed["message"] == FAILURE_MESSAGE and failed["stage"] == "check"
    assert failed["path"] == "data/store_04.csv" and pd.isna(failed["divergences"])


def test_health_min_rows_makes_a_fit_of_fewer_rows_a_warning(sweep: Config) -> None:
    """health.min_rows (#45), against the rows each fit recorded of its dataset."""
    for dataset_id, rows in (("store_01", 3), ("store_07", 12)):
        with xr.open_datatree(sweep.layout.fit(dataset_id)) as fit:
            tree = fit.load()
        tree.attrs["rows"] = rows
        sweep.layout.fit(dataset_id).unlink()
        tree.to_netcdf(sweep.layout.fit(dataset_id), engine="h5netcdf")
    strict = config_from_dict({**config_to_dict(sweep), "health": {**config_to_dict(sweep)["health"], "min_rows": 10}})
    report = collect(strict, IDS)
    datasets = pd.read_csv(strict.layout.datasets_csv).set_index("dataset")
    assert datasets.loc["store_01", "status"] == "warning" and report.warning_ids[0] == "store_01"
    assert datasets.loc["store_01", "message"] == "3 rows < 10 (health.min_rows)"
    assert datasets.loc["store_07", "status"] == "ok" and datasets.loc["store_07", "rows"] == 12
    assert collect(sweep, IDS).warning_ids == ["store_02", "store_03"]  # unset: not checked


def test_failures_csv(sweep: Config) -> None:
    collect(sweep, IDS)
    failures = pd.read_csv(sweep.layout.failures_csv, keep_default_na=False)
    assert list(failures.columns) == FAILURE_COLUMNS
    assert failures.to_dict("records") == [
        {
            "dataset": "store_04",
            "path": "data/store_04.csv",
            "stage": "check",
            "error_type": "DatasetError",
            "message": FAILURE_MESSAGE,
            "reason": FAILURE_MESSAGE,  # the record has none: its message
            "traceback": "",  # an expected error: no bug to report
        }
    ]


def test_no_failures_writes_header_only(sweep: Config) -> None:
    report = collect(sweep, ["store_01", "store_07"])
    assert sweep.layout.failures_csv.read_text() == ",".join(FAILURE_COLUMNS) + "\n"
    assert report.one_line() == "collect: 2 ok, 0 warning, 0 failed of 2 datasets"


def test_missing_dataset_is_an_error(sweep: Config) -> None:
    with pytest.raises(BatchfitError, match=r"'store_09'.*run the fit stage"):
        collect(sweep, [*IDS, "store_09"])
    assert not sweep.layout.posteriors.exists()
    assert not sweep.layout.summary.exists()


def test_fit_and_failure_both_present_is_an_error(sweep: Config) -> None:
    write_failure(sweep, "store_01", "stale")
    with pytest.raises(BatchfitError, match=r"both a fit and a failure record.*'store_01'"):
        collect(sweep, IDS)


def test_unreadable_fit_names_dataset_and_file(sweep: Config) -> None:
    sweep.layout.fit("store_07").write_bytes(b"not netcdf")
    with pytest.raises(DatasetError, match=r"store_07.*store_07\.nc"):
        collect(sweep, IDS)
    assert not sweep.layout.posteriors.exists()
    assert [p.name for p in sweep.results_dir.iterdir() if p.name.startswith(".")] == []


def test_collect_fits_explicit_arguments(sweep: Config, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    report = collect_fits(["store_03"], fits=sweep.layout, out=ResultsLayout(out),
                          thresholds=Health(max_r_hat=100.0, min_ess_bulk=1.0, min_ess_tail=1.0))
    assert (report.n_ok, report.n_warning, report.n_failed) == (1, 0, 0)
    assert {p.name for p in out.iterdir()} == {"posteriors.nc", "summary.csv", "datasets.csv", "failures.csv",
                                               "summaries"}
    assert not sweep.layout.summary.exists()


def test_health_is_scored_on_free_parameters_by_default(tmp_path: Path) -> None:
    config = sweep_config(tmp_path / "results")
    write_fit(config, "s", 3, seed=1, stuck_deterministic=True)
    summary = pd.read_csv(collect(config, ["s"]).summary_path).set_index("parameter")
    assert summary.loc["d", "r_hat"] > 1.5  # summarised, but a deterministic
    [row] = pd.read_csv(config.layout.datasets_csv).to_dict("records")
    assert row["status"] == "ok" and row["max_r_hat"] < 1.5

    scored = config_from_dict({**config_to_dict(config), "health": {"var_names": ["d", "sigma"]}})
    assert collect(scored, ["s"]).warning_ids == ["s"]
    assert dataset_health(config.layout.fit("s"), Health(var_names=("d",)))["reasons"][0].startswith("max r_hat")


def test_dataset_health(sweep: Config) -> None:
    health = dataset_health(sweep.layout.fit("store_02"), Health())
    assert health["divergences"] == 4
    assert health["status"] == "warning"
    assert health["reasons"] == ["4 divergences > 0"]
    assert 0.9 < health["max_r_hat"] < 1.1
    assert health["min_ess_bulk"] > 20

    ok = dataset_health(sweep.layout.fit("store_01"), Health())
    assert (ok["status"], ok["divergences"], ok["reasons"]) == ("ok", 0, [])
    stuck = dataset_health(sweep.layout.fit("store_03"), Health())
    assert stuck["status"] == "warning" and stuck["reasons"][0].startswith("max r_hat")
    low_ess = dataset_health(sweep.layout.fit("store_01"), Health(min_ess_bulk=1e6))
    assert low_ess["status"] == "warning" and low_ess["reasons"][0].startswith("min ess_bulk")


def test_a_health_reason_shows_why_the_value_crossed() -> None:
    from batchfit.outputs.health import score_health

    thresholds = Health(max_r_hat=1.01, min_ess_bulk=400, min_ess_tail=400)
    sampler = {"divergences": 3, "max_treedepth_fraction": 0.0, "min_bfmi": 0.8}
    health = score_health(np.array([1.0104, 1.002]), np.array([399.6, 1200.0]), np.array([500.0, 399.96]), sampler,
                          thresholds)
    assert health["reasons"] == ["3 divergences > 0", "max r_hat 1.0104 > 1.01", "min ess_bulk 399.6 < 400",
                                 "min ess_tail 399.96 < 400"]
    health = score_health(np.array([1.05]), np.array([12.4]), np.array([410.0]), {**sampler, "divergences": 0},
                          Health(max_r_hat=1.01, min_ess_bulk=400, min_ess_tail=400))
    assert health["reasons"] == ["max r_hat 1.050 > 1.01", "min ess_bulk 12 < 400"]  # as short as before


def test_tree_depth_and_bfmi_are_scored_and_named_and_nan_crosses_nothing() -> None:
    from batchfit.outputs.health import DIAGNOSTICS, score_health

    good = (np.array([1.0]), np.array([900.0]), np.array([900.0]))
    thresholds = Health(max_treedepth_fraction=0.0, min_bfmi=0.3)
    health = score_health(*good, {"divergences": 0, "max_treedepth_fraction": 0.00025, "min_bfmi": 0.2999},
                          thresholds)
    assert health["status"] == "warning"
    assert health["reasons"] == ["max_treedepth_fraction 0.0003 > 0", "min_bfmi 0.2999 < 0.3"]
    assert (health["max_treedepth_fraction"], health["min_bfmi"]) == (0.00025, 0.2999)
    assert list(health) == [*DIAGNOSTICS, "status", "reasons"]
    at = score_health(*good, {"divergences": 0, "max_treedepth_fraction": 0.1, "min_bfmi": 0.3},
                      Health(max_treedepth_fraction=0.1, min_bfmi=0.3))
    assert at["status"] == "ok"  # at the threshold is not past it
    # no tree depth or energy recorded (pm.sample's step methods without NUTS), no diagnostics at all
    none = score_health(*(np.array([np.nan]),) * 3, {"divergences": 0, "max_treedepth_fraction": np.nan,
                                                     "min_bfmi": np.nan}, thresholds)
    assert none["status"] == "ok" and none["reasons"] == []


@st.composite
def value_and_threshold(draw: st.DrawFn) -> tuple[float, float]:
    """Any two distinct numbers, often a hair apart (where too few digits would print them alike)."""
    threshold = draw(st.floats(allow_nan=False))
    value = draw(st.one_of(
        st.floats(allow_nan=False),
        st.integers(-3, 3).map(lambda ulps: float(threshold + ulps * np.spacing(threshold))),
        st.floats(-1e-3, 1e-3).map(lambda step: threshold + step * max(abs(threshold), 1.0)),
    ))
    return value, threshold


@given(value_and_threshold(), st.integers(0, 6))
def test_a_shown_value_reads_on_its_own_side_of_the_shown_threshold(pair: tuple[float, float], decimals: int) -> None:
    from batchfit.fitting.sampler_health import number_text, shown_against

    value, threshold = pair
    shown, shown_threshold = float(shown_against(value, threshold, decimals)), float(number_text(threshold))
    assert shown_threshold == threshold
    if value > threshold:
        assert shown > shown_threshold
    elif value < threshold:
        assert shown < shown_threshold


def test_atomic_path_replaces_on_success(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.csv"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.suffix == ".csv"
        tmp.write_text("new")
        assert not target.exists()
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["out.csv"]


def test_atomic_path_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(target) as tmp:
            tmp.write_text("half writ")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]

    fresh = tmp_path / "fresh.nc"
    with pytest.raises(RuntimeError):
        with atomic_path(fresh) as tmp:
            xr.Dataset({"x": ("i", [1, 2])}).to_netcdf(tmp, engine="h5netcdf")
            raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_atomic_path_requires_the_block_to_write(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="did not create"):
        with atomic_path(tmp_path / "out.csv"):
            pass
    assert list(tmp_path.iterdir()) == []


def test_stale_temporaries_of_the_given_files_only_are_removed(tmp_path: Path) -> None:
    """What a SIGKILL mid-write leaves behind; a neighbour's (``a.b`` beside ``a``) is kept."""
    fits = tmp_path / "fits"
    fits.mkdir()
    names = {
        "a": fits / ".a.4242.0123abcd.tmp.nc",
        "a.b": fits / ".a.b.4242.89abcdef.tmp.nc",
        "a json": fits / ".a.77.deadbeef.tmp.json",
        "unrelated": fits / ".a.nc.swp",
    }
    for path in names.values():
        path.write_text("half-written")
    (fits / "a.nc").write_text("complete")

    removed = remove_stale_temporaries([fits / "a.nc", tmp_path / "missing-dir" / "x.nc"])
    assert removed == [names["a"]]
    assert sorted(p.name for p in fits.iterdir()) == sorted(
        ["a.nc", names["a.b"].name, names["a json"].name, names["unrelated"].name])
    with pytest.raises(FileNotFoundError), atomic_path(fits / "a.b.nc") as tmp:
        tmp.write_text("new")
        # atomic_path's own temporaries match: hence only for the process that owns the file
        assert sorted(remove_stale_temporaries([fits / "a.b.nc"])) == sorted([names["a.b"], tmp])


# --- incremental collect ---------------------------------------------------------------------------

def fresh_collect_summary(config: Config, ids: list[str], tmp_path: Path) -> pd.DataFrame:
    """summary.csv of a collect of the same fits with an empty summary cache, as the reference."""
    out = ResultsLayout(tmp_path / "from-scratch")
    collect_fits(ids, fits=config.layout, out=out, thresholds=config.health, summary=config.summary)
    return pd.read_csv(out.summary, keep_default_na=False, na_values=[""])


def test_adding_datasets_summarises_and_reads_only_those(sweep: Config, tmp_path: Path) -> None:
    first = collect(sweep, IDS)
    assert first.summarised_ids == first.posterior_read_ids == ["store_01", "store_02", "store_03", "store_07"]
    write_fit(sweep, "store_08", 5, seed=8)
    write_fit(sweep, "store_09", 3, seed=9)
    ids = [*IDS, "store_08", "store_09"]
    again = collect(sweep, ids)
    assert again.summarised_ids == again.posterior_read_ids == ["store_08", "store_09"]
    ours = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(ours, fresh_collect_summary(sweep, ids, tmp_path))
    with xr.open_datatree(sweep.layout.posteriors) as tree:
        for dataset_id in ["store_01", "store_09"]:  # copied from the previous file, read from its fit
            with xr.open_datatree(sweep.layout.fit(dataset_id)) as fit:
                xr.testing.assert_equal(dataset_posterior(tree["posterior"].ds, tree["datasets"].ds, dataset_id),
                                        fit["posterior"].to_dataset())
    assert collect(sweep, ids).summarised_ids == []


def test_a_changed_fit_or_summary_setting_is_summarised_again(sweep: Config, tmp_path: Path) -> None:
    collect(sweep, IDS)
    write_fit(sweep, "store_07", 5, seed=70)  # refitted: new draws
    report = collect(sweep, IDS)
    assert report.summarised_ids == report.posterior_read_ids == ["store_07"]
    ours = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(ours, fresh_collect_summary(sweep, IDS, tmp_path))

    narrower = config_from_dict({**config_to_dict(sweep), "summary": {"ci_prob": 0.5, "ci_kind": "eti"}})
    assert collect(narrower, IDS).summarised_ids == ["store_01", "store_02", "store_03", "store_07"]
    assert "eti50_lb" in pd.read_csv(narrower.layout.summary).columns
    scored = config_from_dict({**config_to_dict(narrower), "health": {"var_names": ["sigma"]}})
    assert collect(scored, IDS).summarised_ids == ["store_01", "store_02", "store_03", "store_07"]
    stricter = config_from_dict({**config_to_dict(scored), "health": {"var_names": ["sigma"], "min_ess_bulk": 1e6}})
    report = collect(stricter, IDS)  # thresholds are applied to the cached table: nothing summarised again
    assert report.summarised_ids == [] and report.n_warning == 4


def test_cached_summary_rows_equal_arviz_stats_summary(sweep: Config) -> None:
    """summary.csv after a collect that took every row from the cache, against arviz_stats on the fits."""
    collect(sweep, IDS)
    assert collect(sweep, IDS).summarised_ids == []
    summary = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    for dataset_id in ["store_01", "store_02", "store_03", "store_07"]:
        ours = summary[summary["dataset"] == dataset_id].set_index("parameter")
        with xr.open_datatree(sweep.layout.fit(dataset_id)) as fit:
            reference = arviz_stats.summary(fit, round_to="none")  # ArviZ's defaults are summary's
        assert list(ours.index) == list(reference.index)
        np.testing.assert_allclose(ours[reference.columns].to_numpy(float), reference.to_numpy(float), rtol=1e-10)


def test_a_damaged_cache_entry_is_recomputed(sweep: Config) -> None:
    collect(sweep, IDS)
    store = sweep.results_dir / "summaries" / "entries.jsonl"
    lines = store.read_text().splitlines(keepends=True)
    lines[2] = "{not json" + " " * (len(lines[2]) - 10) + "\n"  # the third fit's entry, same length: offsets stay
    store.write_text("".join(lines))
    assert collect(sweep, IDS).summarised_ids == [IDS[2]]


def assert_posteriors_equal_fits(config: Config, ids: list[str]) -> None:
    with xr.open_datatree(config.layout.posteriors) as tree:
        for dataset_id in ids:
            with xr.open_datatree(config.layout.fit(dataset_id)) as fit:
                xr.testing.assert_equal(dataset_posterior(tree["posterior"].ds, tree["datasets"].ds, dataset_id),
                                        fit["posterior"].to_dataset())


def test_a_new_fit_is_read_once_its_draws_staged_between_the_passes(sweep: Config, monkeypatch) -> None:
    import batchfit.outputs.collect as collect_module
    from batchfit.outputs import summary_cache

    def not_again(path):
        raise AssertionError(f"{path} was read a second time")

    monkeypatch.setattr(collect_module, "read_posterior", not_again)
    report = collect(sweep, IDS)
    assert report.posterior_read_ids == ["store_01", "store_02", "store_03", "store_07"]
    assert_posteriors_equal_fits(sweep, report.posterior_read_ids)
    assert not (sweep.results_dir / "summaries" / summary_cache.STAGED).exists()  # nothing left behind


def test_draws_too_large_to_stage_are_read_again(sweep: Config, monkeypatch) -> None:
    import batchfit.outputs.collect as collect_module
    from batchfit.outputs import summary_cache
    from batchfit.outputs.combined import read_posterior

    read = []

    def noted(path: Path) -> xr.Dataset:
        read.append(path.stem)
        return read_posterior(path)

    monkeypatch.setattr(summary_cache, "STAGE_MAX_BYTES", 0)
    monkeypatch.setattr(collect_module, "read_posterior", noted)
    report = collect(sweep, IDS)
    assert read == report.posterior_read_ids == ["store_01", "store_02", "store_03", "store_07"]
    assert_posteriors_equal_fits(sweep, read)


def test_staged_draws_serve_only_the_fit_they_were_read_from(sweep: Config) -> None:
    """Draws staged for a fit since refitted are not used, nor are damaged ones: the fit is read."""
    from batchfit.outputs.summary_cache import STAGED, SummaryCache

    cache = SummaryCache(sweep.results_dir / "summaries", sweep.summary, sweep.health)
    cache.entry("store_07", sweep.layout.fit("store_07"))  # staged, then a collect stopped before posteriors.nc
    cache.entry("store_01", sweep.layout.fit("store_01"))
    [damaged] = (cache.directory / STAGED).glob(f"{cache.entry('store_01', sweep.layout.fit('store_01'))['key']}.npz")
    damaged.write_bytes(b"PK\x03\x04 not a zip file")
    write_fit(sweep, "store_07", 5, seed=70)  # refitted: new draws, a new key
    report = collect(sweep, IDS)
    assert report.summarised_ids == ["store_02", "store_03", "store_07"]
    assert_posteriors_equal_fits(sweep, ["store_01", "store_02", "store_03", "store_07"])
    assert not (cache.directory / STAGED).exists()


# --- summarising in worker processes -----------------------------------------------------------------

def test_helper_processes_share_the_new_fits(sweep: Config, tmp_path: Path, monkeypatch, caplog) -> None:
    """With workers, the new fits are shared out between this process and helper processes (some
    summarised here, the others in helpers), and collect's outputs equal a collect without workers."""
    from batchfit.outputs import summary_pool
    from batchfit.outputs.summary_cache import SummaryCache

    write_fit(sweep, "store 08", 5, seed=8)  # a helper reports ids a line each: a space is part of one
    ids = [*IDS, "store 08"]
    monkeypatch.setattr(summary_pool, "FITS_PER_PROCESS", 2)  # a process per 2 fits, not per 25
    here = []
    compute = SummaryCache._compute

    def recorded(self, dataset_id, path):
        here.append(dataset_id)
        return compute(self, dataset_id, path)

    monkeypatch.setattr(SummaryCache, "_compute", recorded)
    with caplog.at_level("INFO", logger="batchfit"):
        report = collect(sweep, ids, workers=2)
    assert "summarised 5 fits in 2 processes" in caplog.text
    assert report.summarised_ids == ["store_01", "store_02", "store_03", "store_07", "store 08"]
    assert here == ["store_01", "store_03", "store 08"]  # every other one; the helper wrote the rest
    monkeypatch.undo()
    ours = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(ours, fresh_collect_summary(sweep, ids, tmp_path))


def test_helpers_that_die_leave_their_share_to_collect(sweep: Config, tmp_path: Path, monkeypatch) -> None:
    """A helper that exits at once (here every helper: a "Python" that is /bin/false) writes nothing;
    collect summarises its share itself and its outputs are those of a collect without helpers."""
    from batchfit.outputs import summary_pool

    monkeypatch.setattr(summary_pool, "FITS_PER_PROCESS", 1)
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # every helper dies at once
    report = collect(sweep, IDS, workers=3)
    assert report.summarised_ids == ["store_01", "store_02", "store_03", "store_07"]
    monkeypatch.undo()
    ours = pd.read_csv(sweep.layout.summary, keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(ours, fresh_collect_summary(sweep, IDS, tmp_path))
    assert_posteriors_equal_fits(sweep, ["store_01", "store_02", "store_03", "store_07"])


def test_a_fit_no_process_can_summarise_fails_collect_as_without_helpers(sweep: Config, monkeypatch) -> None:
    from batchfit.outputs import summary_pool

    monkeypatch.setattr(summary_pool, "FITS_PER_PROCESS", 1)
    sweep.layout.fit("store_02").write_bytes(b"not netcdf")
    with pytest.raises(DatasetError, match=r"store_02.*store_02\.nc"):
        collect(sweep, IDS, workers=2)
    assert not sweep.layout.posteriors.exists()
    # the workers wrote the summaries of the others, which the next collect finds
    sweep.layout.fit("store_02").unlink()
    write_failure(sweep, "store_02", "refitted and failed")
    assert collect(sweep, IDS).summarised_ids == []


# --- open_results ---------------------------------------------------------------------------------

def test_open_results_hands_arviz_one_dataset_or_all(sweep: Config, tmp_path: Path) -> None:
    import arviz_plots

    collect(sweep, IDS)
    config_file, model = tmp_path / "sweep.yaml", tmp_path / "model.py"
    model.write_text("def build_model(data):\n    pass\n")
    config_file.write_text(json.dumps({**config_to_dict(sweep), "model": str(model)}))
    for source in (sweep, sweep.results_dir, config_file):
        with batchfit.open_results(source) as results:
            assert results.dataset_ids == ["store_01", "store_02", "store_03", "store_07"]
            assert list(results.failures["dataset"]) == ["store_04"]
            assert set(results.summary["dataset"]) == set(IDS) - {"store_04"}  # a row per parameter
            assert list(results.datasets["dataset"]) == IDS  # a row per dataset
            assert results.datasets.set_index("dataset").loc["store_04", "status"] == "failed"
    with batchfit.open_results(sweep) as results:
        for dataset_id in results.dataset_ids:
            ours = arviz.summary(results.dataset(dataset_id), round_to="none")
            pd.testing.assert_frame_equal(ours, arviz.summary(arviz.from_netcdf(sweep.layout.fit(dataset_id)),
                                                              round_to="none"))
        assert results.dataset("store_01").attrs["model_hash"] == "abc123"
        plot = arviz_plots.plot_forest(results.tree, backend="matplotlib")
        assert plot.viz["figure"].item() is not None
        with pytest.raises(KeyError, match="store_04"):
            results.dataset("store_04")


def test_open_results_before_collect_says_what_to_run(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    with pytest.raises(FileNotFoundError, match="run collect first"):
        batchfit.open_results(tmp_path / "results")
