"""The sweep report: forest data and views against arviz-stats, and the real report opened in headless Chromium."""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import textwrap
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import arviz_stats as azs
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import snakemake, write_config, write_sweep

from batchfit.config import Config, config_from_dict
from batchfit.errors import ConfigError
from batchfit.fitting.batch import fit_batch
from batchfit.model.variables import DETERMINISTIC, FREE, ROLE_ATTR
from batchfit.outputs.collect import collect
from batchfit.outputs.combined import SweepLayout, fit_layout, stacked_writer
from batchfit.outputs.compare import K_COLUMN
from batchfit.outputs.health import DATASET_COLUMNS
from batchfit.outputs.plots import (
    ForestRows,
    forest_figure,
    forest_rows,
    health_figure,
    plot_health,
    read_health,
    write_plots,
)
from batchfit.outputs.report import COUNTED, first_rows_by_status, fit_records, summary_page, write_report_pages
from batchfit.settings import ReportSettings, SummarySettings

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def write_posteriors(path: Path, n_datasets: int, seed: int = 0, without_a: int = 0,
                     attrs: Sequence[dict[str, str]] = (), deterministic: bool = True) -> dict[str, xr.Dataset]:
    """A posteriors.nc as collect writes it (stacked along `dataset`, roles as attributes); returns each dataset's.

    The first `without_a` datasets have no variable `a`; ``attrs``: each dataset's recorded attributes;
    ``deterministic``: with the scalar deterministic `twice_mu`."""
    attrs = list(attrs) or [{}] * n_datasets
    rng = np.random.default_rng(seed)
    groups = {}
    for i in range(n_datasets):
        n_groups = 2 + i % 3  # datasets differ in their coordinates
        ds = xr.Dataset({
            "mu": (("chain", "draw"), rng.normal(i, 1.0, (2, 50)), {ROLE_ATTR: FREE}),
            "a": (("chain", "draw", "groups"), rng.normal(size=(2, 50, n_groups)), {ROLE_ATTR: FREE}),
            "twice_mu": (("chain", "draw"), rng.normal(size=(2, 50)), {ROLE_ATTR: DETERMINISTIC}),
        }, coords={"groups": [f"g{j}" for j in range(n_groups)]})
        ds = ds if deterministic else ds.drop_vars("twice_mu")
        groups[f"ds_{i:02d}"] = ds.drop_vars(["a", "groups"]) if i < without_a else ds
    layout = SweepLayout()
    for (dataset_id, ds), recorded in zip(groups.items(), attrs, strict=True):
        layout.add(fit_layout(ds), list(recorded), dataset_id)
    with stacked_writer(path, layout, list(groups)) as writer:
        for i, (ds, recorded) in enumerate(zip(groups.values(), attrs, strict=True)):
            writer.put(i, {name: var.values for name, var in ds.data_vars.items()}, fit_layout(ds)["coords"])
            writer.describe(i, fit_layout(ds), recorded, "", 0)
    return groups


def arviz_rows(draws: dict[str, xr.DataArray], summary: SummarySettings) -> dict[str, np.ndarray]:
    """Each row's mean and intervals by arviz-stats, from its draws (label -> (chain, draw) DataArray)."""
    interval = getattr(azs, summary.interval_kind)
    stacked = xr.concat(list(draws.values()), dim="row")
    return {"mean": stacked.mean(["chain", "draw"]).values,
            "outer": interval(stacked, prob=summary.interval_prob, dim=["chain", "draw"]).values,
            "inner": interval(stacked, prob=0.5, dim=["chain", "draw"]).values}


@pytest.mark.parametrize("ci_kind", ["hdi", "eti"])
def test_forest_rows_default_to_scalar_free_parameters_a_row_per_dataset_as_arviz_summarises_them(tmp_path, ci_kind):
    """A model without a named deterministic: its scalar free parameters."""
    groups = write_posteriors(tmp_path / "posteriors.nc", 4, deterministic=False)
    summary = SummarySettings(ci_kind=ci_kind)
    rows = forest_rows(tmp_path / "posteriors.nc", ReportSettings(), summary)
    assert list(rows) == ["mu"] and rows["mu"].name == "mu"
    assert rows["mu"].labels == list(groups)
    expected = arviz_rows({d: ds["mu"] for d, ds in groups.items()}, summary)
    for field, values in expected.items():
        np.testing.assert_allclose(getattr(rows["mu"], field), values, rtol=1e-12, err_msg=field)


def test_forest_rows_default_to_the_models_scalar_deterministics_and_report_var_names_overrides(tmp_path):
    groups = write_posteriors(tmp_path / "posteriors.nc", 3)
    rows = forest_rows(tmp_path / "posteriors.nc", ReportSettings(), SummarySettings())
    assert list(rows) == ["twice_mu"] and rows["twice_mu"].labels == list(groups)
    expected = arviz_rows({d: ds["twice_mu"] for d, ds in groups.items()}, SummarySettings())
    for field, values in expected.items():
        np.testing.assert_allclose(getattr(rows["twice_mu"], field), values, rtol=1e-12, err_msg=field)
    chosen = forest_rows(tmp_path / "posteriors.nc", ReportSettings(var_names=("mu", "a")), SummarySettings())
    assert list(chosen) == ["mu", "a"]


def test_forest_rows_of_a_vector_are_a_row_per_dataset_and_element(tmp_path):
    groups = write_posteriors(tmp_path / "posteriors.nc", 3)
    rows = forest_rows(tmp_path / "posteriors.nc", ReportSettings(var_names=("a",)), SummarySettings())["a"]
    draws = {f"{d} a[{g}]": ds["a"].sel(groups=g) for d, ds in groups.items() for g in ds["groups"].values}
    assert rows.labels == list(draws)
    np.testing.assert_allclose(rows.outer, arviz_rows(draws, SummarySettings())["outer"], rtol=1e-12)


def test_forest_rows_are_the_same_whatever_block_of_datasets_is_read_at_once(tmp_path):
    """Also when the first blocks lack a variable: rows and variables keep their order."""
    groups = write_posteriors(tmp_path / "posteriors.nc", 9, seed=2, without_a=3)
    settings = ReportSettings(var_names=("a", "mu"))
    whole = forest_rows(tmp_path / "posteriors.nc", settings, SummarySettings(), block=100)
    assert whole["a"].labels == [f"{d} a[{g}]" for d, ds in groups.items() if "a" in ds for g in ds["groups"].values]
    for block in (1, 2, 4):
        parts = forest_rows(tmp_path / "posteriors.nc", settings, SummarySettings(), block=block)
        assert list(parts) == list(whole) == ["mu", "a"]  # posteriors.nc's order, as select_vars keeps it
        for name, rows in parts.items():
            assert rows.labels == whole[name].labels
            for field in ("mean", "outer", "inner"):
                np.testing.assert_array_equal(getattr(rows, field), getattr(whole[name], field))


def test_an_unknown_report_variable_is_a_config_error_naming_the_key(tmp_path):
    write_posteriors(tmp_path / "posteriors.nc", 2)
    with pytest.raises(ConfigError, match="report.var_names") as info:
        forest_rows(tmp_path / "posteriors.nc", ReportSettings(var_names=("sigma",)), SummarySettings())
    assert "'sigma'" in str(info.value)


@pytest.mark.parametrize("ci_kind", ["hdi", "eti"])
@pytest.mark.parametrize("max_rows", [30, 10], ids=["a-row-each", "summary-view"])
def test_forest_figure_draws_each_rows_arviz_intervals_and_mean(tmp_path, ci_kind, max_rows):
    """Up to `max_rows` rows: every row labelled, the first dataset on top; past it, sorted by mean
    with a few labels. Each row, found by its label, shows that dataset's arviz-stats interval
    at `ci_prob` and at 50% and its mean."""
    groups = write_posteriors(tmp_path / "posteriors.nc", 30, seed=3)
    summary = SummarySettings(ci_prob=0.9, ci_kind=ci_kind)
    fig = forest_figure(forest_rows(tmp_path / "posteriors.nc", ReportSettings(var_names=("mu",)), summary)["mu"],
                        max_rows=max_rows, summary=summary)
    ax = fig.axes[0]
    labels = {round(tick): label.get_text() for tick, label in zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)}
    if max_rows >= 30:
        assert [labels[row] for row in sorted(labels, reverse=True)] == list(groups)
    else:
        assert len(labels) <= 11
    outer, inner = (np.array(c.get_segments()) for c in ax.collections[:2])  # one segment per row, bottom to top
    [means] = ax.lines
    expected = arviz_rows({d: ds["mu"] for d, ds in groups.items()}, summary)
    for row, label in labels.items():
        i = list(groups).index(label)
        np.testing.assert_allclose(outer[row, :, 0], expected["outer"][i])
        np.testing.assert_allclose(inner[row, :, 0], expected["inner"][i])
        np.testing.assert_allclose(outer[row, :, 1], row)
        np.testing.assert_allclose(means.get_xydata()[row], [expected["mean"][i], row])
    if max_rows < 30:
        assert np.all(np.diff(means.get_xydata()[:, 0]) >= 0)  # sorted by mean, bottom to top


def test_health_of_a_sweep_without_warnings_or_failures_is_plotted(tmp_path):
    """datasets.csv as collect writes it when every dataset is ok: its message column is empty."""
    rows = [{"dataset": f"ds_{i}", "status": "ok", "message": "", "divergences": 0, "max_r_hat": 1.0,
             "min_ess_bulk": 900.0, "min_ess_tail": 800.0, "max_treedepth_fraction": 0.0, "min_bfmi": 0.9,
             "structure": "s", "sampler_path": "cached"} for i in range(3)]
    pd.DataFrame(rows, columns=DATASET_COLUMNS).to_csv(tmp_path / "datasets.csv", index=False)
    plot_health(read_health(tmp_path / "datasets.csv", max_rows=0), tmp_path / "health.png")
    assert (tmp_path / "health.png").stat().st_size > 0


@pytest.mark.parametrize("max_rows", [1, 100])
@pytest.mark.parametrize("rows_at_once", [1, 4, 5, 100])
def test_the_health_read_in_parts_is_the_whole_tables(tmp_path, rows_at_once, max_rows):
    """The counts and first warnings of datasets.csv read in parts are what pandas makes of the whole file."""
    rows = [{"dataset": f"ds_{i}", "status": ("warning", "ok", "failed")[i % 3] if i != 4 else "failed",
             "message": ("r_hat 1.2 > 1.01", "", "sampling failed")[i % 3] + ("; divergences 3 > 0" if i == 3 else "")
             + ("; min ess_tail 380 < 400; max_treedepth_fraction 0.25 > 0; min_bfmi 0.21 < 0.3" if i == 6 else "")
             + ("; 3 rows < 10 (health.min_rows)" if i == 6 else ""),
             "divergences": i, "max_r_hat": 1.0 + i / 10, "min_ess_bulk": 900.0 - i, "min_ess_tail": 800.0 - i,
             "max_treedepth_fraction": i / 20, "min_bfmi": 1.0 - i / 10, "structure": "s",
             "sampler_path": "cached"} for i in range(8)]
    pd.DataFrame(rows, columns=DATASET_COLUMNS).to_csv(tmp_path / "datasets.csv", index=False)
    datasets = pd.read_csv(tmp_path / "datasets.csv")
    warned = datasets[datasets["status"] == "warning"]

    health = read_health(tmp_path / "datasets.csv", max_rows, rows_at_once)
    assert health.n_datasets == len(datasets) == 8
    assert health.counts == {s: int((datasets["status"] == s).sum()) for s in ("ok", "warning", "failed")}
    assert health.reasons == {r: int(warned["message"].str.contains(r).sum())
                              for r in ("r_hat", "ess_bulk", "ess_tail", "divergences", "max_treedepth_fraction",
                                        "min_bfmi", "rows")}
    assert health.reasons["divergences"] == 1 and health.reasons["rows"] == 1
    assert health.n_warnings == len(warned) == 3
    assert health.reasons["ess_tail"] == health.reasons["max_treedepth_fraction"] == health.reasons["min_bfmi"] == 1
    assert {"min_ess_tail", "max_treedepth_fraction", "min_bfmi"} <= set(health.warnings.columns)
    pd.testing.assert_frame_equal(health.warnings, warned[DATASET_COLUMNS].head(max_rows).reset_index(drop=True),
                                  check_dtype=False)


def test_the_health_page_shows_every_threshold_and_each_warnings_diagnostics(tmp_path):
    """The health page names each threshold with its value, counts the warnings per threshold crossed
    and shows each warning's diagnostics, the tail ESS, tree-depth and E-BFMI ones included."""
    from batchfit.outputs.report import health_page

    config = config_from_dict({"model": "m.py", "datasets": ["d"], "health": {"min_ess_tail": 321,
                                                                               "max_treedepth_fraction": 0.05,
                                                                               "min_bfmi": 0.25}})
    diagnostics = {"divergences": 0, "max_r_hat": 1.001, "min_ess_bulk": 900.0, "min_ess_tail": 111.0,
                   "max_treedepth_fraction": 0.375, "min_bfmi": 0.125}
    message = "min ess_tail 111 < 321; max_treedepth_fraction 0.375 > 0.05; min_bfmi 0.12 < 0.25"
    rows = [{"dataset": "bad", "status": "warning", "message": message, **diagnostics, "structure": "s",
             "sampler_path": "cached"},
            {"dataset": "good", "status": "ok", "message": "", **diagnostics, "structure": "s",
             "sampler_path": "cached"}]
    pd.DataFrame(rows, columns=DATASET_COLUMNS).to_csv(tmp_path / "datasets.csv", index=False)
    page = health_page(read_health(tmp_path / "datasets.csv", max_rows=10), pd.DataFrame(), config)
    for text in ("any ess_tail &lt; 321.0", "more than a share of 0.05", "below 0.25 (min_bfmi)"):
        assert text in page, text
    for column in ("min_ess_tail", "max_treedepth_fraction", "min_bfmi"):
        assert f"<th>{column}</th>" in page, column
    warned = page.split("<h2>Warnings (1)</h2>")[1]
    assert "<td>bad</td>" in warned and "<td>good</td>" not in warned
    for value in ("111", "0.375", "0.125"):  # the bad dataset's row, as table() prints numbers
        assert f"<td>{value}</td>" in warned, value
    counts = page.split("<h2>Warnings by threshold crossed</h2>")[1].split("<h2>")[0]
    assert "<th>ess_tail</th>" in counts and "<th>ess_bulk</th>" in counts
    # tail, depth, bfmi crossed; r_hat, ess_bulk, divergences, rows not
    assert counts.count("<td>1</td>") == 3 and counts.count("<td>0</td>") == 4


@pytest.mark.parametrize(("rows_at_once", "max_rows"), [(1, 4), (3, 4), (5, 100), (100, 7), (100, 1)])
def test_the_summary_page_shows_the_first_rows_of_the_whole_table_by_status(tmp_path, rows_at_once, max_rows):
    """Read in parts, the page holds the rows pandas' stable sort of the whole datasets.csv puts first
    (failed, warning, ok, then any other status), and says how many it leaves out; then summary.csv's
    first rows."""
    statuses = ["ok", "warning", "failed", "ok", "mystery", "warning", "ok", "failed", "ok"]
    rows = [{"dataset": f"ds_{i}", "divergences": i if status != "failed" else None, "status": status,
             "message": "r_hat 1.2 > 1.01" if status == "warning" else ""} for i, status in enumerate(statuses)]
    pd.DataFrame(rows, columns=DATASET_COLUMNS).to_csv(tmp_path / "datasets.csv", index=False)
    parameters = [{"dataset": f"ds_{i}", "parameter": p, "mean": i + j / 10}
                  for i, status in enumerate(statuses) if status != "failed" for j, p in enumerate(("mu", "sigma"))]
    pd.DataFrame(parameters).to_csv(tmp_path / "summary.csv", index=False)
    whole = pd.read_csv(tmp_path / "datasets.csv")
    rank = {"failed": 0, "warning": 1, "ok": 2}
    expected = whole.sort_values("status", key=lambda s: s.map(rank).fillna(3), kind="stable").head(max_rows)

    first, total = first_rows_by_status(tmp_path / "datasets.csv", max_rows, rows_at_once)
    assert total == len(whole) == 9
    pd.testing.assert_frame_equal(first, expected.reset_index(drop=True), check_dtype=False)
    text = summary_page(tmp_path / "datasets.csv", tmp_path / "summary.csv", max_rows=max_rows,
                        rows_at_once=rows_at_once)
    assert (f"Showing the first {max_rows} of 9 rows" in text) == (max_rows < 9)
    assert (f"Showing the first {max_rows} of 14 rows" in text) == (max_rows < 14)
    assert text.count("<tr class=") == min(max_rows, 9)
    assert text.count("<td>mu</td>") == min(7, (max_rows + 1) // 2)


@pytest.mark.parametrize("block", [1, 2, 4096])
def test_fit_records_read_in_blocks_count_what_xarray_reads(tmp_path, block):
    attrs = [{"created_at": f"2026-12-0{1 + i % 4}T10:00:0{i}+00:00", "versions": f'{{"pymc": "6.{i % 2}"}}',
              "model_hash": "m1" if i < 4 else "m2", "compile_key": f"k{i % 3}", "structure": "s",
              "sampler_path": "cached" if i % 3 else "nutpie"} for i in range(7)]
    attrs[5].pop("created_at")  # a fit without a date (recorded as '')
    write_posteriors(tmp_path / "posteriors.nc", 7, attrs=attrs)
    with xr.open_datatree(tmp_path / "posteriors.nc") as tree:
        info = tree["datasets"].to_dataset().load()

    records = fit_records(tmp_path / "posteriors.nc", block)
    dates = sorted(d for d in info["created_at"].values.astype(str) if d)
    assert (records.first_sampled, records.last_sampled) == (dates[0], dates[-1])
    for keys in COUNTED:
        expected = Counter(zip(*(info[key].values.astype(str) for key in keys), strict=True))
        assert records.counts[keys] == expected
        assert list(records.counts[keys].most_common()) == list(expected.most_common())  # ties in dataset order


# --- plots and pages of every kind of model and sweep, on real fits -----------------------------------

# No scalar free parameter: a vector over the dataset's groups and a matrix; a vector and a scalar
# deterministic; `mu` an observation-sized one. LogNormal: a dataset with y <= 0 fails to sample.
VECTOR_MODEL = textwrap.dedent("""
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"], "k": ["level", "spread"]}) as model:
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            a = pm.Normal("a", 0.0, 2.0, dims="groups")
            L = pm.Normal("L", 0.0, 1.0, dims=("groups", "k"))
            pm.Deterministic("a_centered", a - a.mean(), dims="groups")
            pm.Deterministic("a_range", a.max() - a.min())
            mu = pm.Deterministic("mu", a[group] + 0.5 * L[group, 0])
            pm.LogNormal("y_obs", mu, 1.0, observed=y, shape=y.shape)
        return model
""")
# Each dataset's groups: their number and labels differ between datasets.
VECTOR_GROUPS = {"s1": ["g0", "g1"], "s2": ["g0", "g1", "g2"], "s3": ["g1", "g2", "g3", "g4"]}
VECTOR_SAMPLER = {"draws": 100, "tune": 100, "chains": 2, "seed": 5}


def write_vector_data(directory: Path, groups: dict[str, list[str]], *, failing: bool = False) -> None:
    """A dataset per entry, 12 rows over its groups; `failing`: a y <= 0, which the model rules out."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    for dataset_id, labels in groups.items():
        y = np.exp(rng.normal(size=12)).round(4)
        if failing:
            y[1] = -1.0
        pd.DataFrame({"group": [labels[i % len(labels)] for i in range(12)], "y": y}).to_csv(
            directory / f"{dataset_id}.csv", index=False)


def vector_settings(root: Path, cache: Path, **overrides: Any) -> dict[str, Any]:
    """The config of a sweep of ``root/model.py`` (VECTOR_MODEL) over ``root/data``, results in ``root/results``."""
    return {"model": str(root / "model.py"), "datasets": [str(root / "data" / "*.csv")], "sampler": VECTOR_SAMPLER,
            "cache_dir": str(cache), "results_dir": str(root / "results"),
            "columns": {"group": {"scope": "dataset"}}, **overrides}


@pytest.fixture(scope="module")
def vector_fits(tmp_path_factory, session_cache) -> Config:
    """VECTOR_MODEL fitted once to the datasets of VECTOR_GROUPS; each test collects them in a sweep of its own."""
    root = tmp_path_factory.mktemp("vector")
    (root / "model.py").write_text(VECTOR_MODEL)
    write_vector_data(root / "data", VECTOR_GROUPS)
    config = config_from_dict(vector_settings(root, session_cache))
    report = fit_batch(config, list(VECTOR_GROUPS), batch_id="all")
    assert report.n_failed == 0, report.outcomes
    return config


def vector_sweep(fits: Config, root: Path, ids: Sequence[str], *, refit: bool = False, **overrides: Any) -> Config:
    """A sweep of the datasets `ids` with its results in ``root/results``, collected with the config keys
    `overrides`. Its fits are copies of those of `fits`, or with `refit` fitted again (for `outputs:`
    settings, which shape a fit)."""
    config = config_from_dict(vector_settings(fits.model.parent, fits.cache_dir, results_dir=str(root / "results"),
                                              **overrides))
    if refit:
        report = fit_batch(config, list(ids), batch_id="refit")
        assert report.n_failed == 0, report.outcomes
    else:
        for dataset_id in ids:
            config.layout.fit(dataset_id).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fits.layout.fit(dataset_id), config.layout.fit(dataset_id))
    collect(config, list(ids))
    return config


def fit_elements(config: Config, ids: Sequence[str], name: str) -> dict[str, xr.DataArray]:
    """Each dataset's draws of each element of `name`, read from its fit and labelled as forest rows are."""
    draws = {}
    for dataset_id in ids:
        with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
            var = tree["posterior"][name].load()
        dims = [d for d in var.dims if d not in ("chain", "draw")]
        if not dims:
            draws[dataset_id] = var
            continue
        for labels in itertools.product(*(var[d].values for d in dims)):
            where = dict(zip(dims, labels, strict=True))
            draws[f"{dataset_id} {name}[{', '.join(map(str, labels))}]"] = var.sel(where).drop_vars(dims)
    return draws


def assert_rows_are_arviz(rows: ForestRows, draws: dict[str, xr.DataArray], summary: SummarySettings) -> None:
    """A forest plot's rows are the fits' elements, in order, with arviz-stats' mean and intervals."""
    assert rows.labels == list(draws)
    for field, values in arviz_rows(draws, summary).items():
        np.testing.assert_allclose(getattr(rows, field), values, rtol=1e-12, err_msg=f"{rows.name} {field}")


def forest_files(config: Config) -> list[str]:
    return sorted(p.name for p in (config.results_dir / "plots" / "forest").iterdir())


def health_cells(config: Config, n_datasets: int) -> str:
    """The health table's row the page must show, as pandas counts datasets.csv's datasets: ok, warning,
    failed, total (checked to be `n_datasets`)."""
    datasets = pd.read_csv(config.layout.datasets_csv)
    assert len(datasets) == n_datasets
    counts = [int((datasets["status"] == status).sum()) for status in ("ok", "warning", "failed")]
    return "".join(f"<td>{n}</td>" for n in [*counts, n_datasets])


def health_page(config: Config) -> str:
    return (config.results_dir / "report" / "health.html").read_text()


def test_a_model_without_a_scalar_parameter_gets_forest_plots_of_its_vector_and_matrix_parameters(vector_fits,
                                                                                                  tmp_path):
    """No scalar free parameter (nor a scalar deterministic in posteriors.nc): the default forest plots are the
    free parameters there are, a row per dataset and element (the plots rule crashed on ``Dimensions
    {'dataset'} do not exist``)."""
    config = vector_sweep(vector_fits, tmp_path, list(VECTOR_GROUPS), summary={"var_names": ["a", "L", "a_centered"]})
    write_plots(config)
    assert forest_files(config) == ["L.png", "a.png"]
    rows = forest_rows(config.layout.posteriors, config.report, config.summary)
    assert list(rows) == ["a", "L"]
    for name, variable_rows in rows.items():
        assert_rows_are_arviz(variable_rows, fit_elements(config, list(VECTOR_GROUPS), name), config.summary)
    pages = write_report_pages(config)
    assert [p.name for p in pages] == ["health.html", "summary.html", "failures.html", "provenance.html"]
    assert health_cells(config, 3) in health_page(config)


def test_a_model_with_a_named_scalar_deterministic_gets_forest_plots_of_it(vector_fits, tmp_path):
    """VECTOR_MODEL's ``a_range`` (a pm.Deterministic), not its free parameters, unless report.var_names says."""
    config = vector_sweep(vector_fits, tmp_path / "default", list(VECTOR_GROUPS))
    write_plots(config)
    assert forest_files(config) == ["a_range.png"]
    assert_rows_are_arviz(forest_rows(config.layout.posteriors, config.report, config.summary)["a_range"],
                          fit_elements(config, list(VECTOR_GROUPS), "a_range"), config.summary)
    chosen = vector_sweep(vector_fits, tmp_path / "chosen", list(VECTOR_GROUPS), report={"var_names": ["a"]})
    write_plots(chosen)
    assert forest_files(chosen) == ["a.png"]


@pytest.mark.parametrize(("settings", "refit", "drawn"), [
    ({"outputs": {"var_names": ["a_centered", "a_range"]}}, True, ["a_range"]),
    ({"summary": {"var_names": ["a_centered"]}}, False, ["a_centered"]),
    ({"outputs": {"var_names": ["mu"]}}, True, []),
], ids=["outputs-keep-deterministics", "summary-selects-a-deterministic", "outputs-keep-an-observation-sized-one"])
def test_a_sweep_keeping_only_deterministics_gets_its_plots_and_pages(vector_fits, tmp_path, caplog, settings, refit,
                                                                      drawn):
    """Only deterministics in posteriors.nc: forest plots of those (scalar ones first, as for free parameters).
    Kept only an observation-sized one, which summary.csv does not summarise: each dataset still has its
    row in datasets.csv, with its health, and the plots log says there is nothing to draw."""
    config = vector_sweep(vector_fits, tmp_path, list(VECTOR_GROUPS), refit=refit, **settings)
    with caplog.at_level(logging.WARNING, logger="batchfit"):
        write_plots(config)
    assert forest_files(config) == [f"{name}.png" for name in drawn]
    rows = forest_rows(config.layout.posteriors, config.report, config.summary)
    assert list(rows) == drawn
    for name in drawn:
        assert_rows_are_arviz(rows[name], fit_elements(config, list(VECTOR_GROUPS), name), config.summary)
    if not drawn:
        assert "no forest plot: posteriors.nc holds no variable" in caplog.text
    assert pd.read_csv(config.layout.datasets_csv)["dataset"].tolist() == list(VECTOR_GROUPS)
    write_report_pages(config)
    assert health_cells(config, 3) in health_page(config)


def test_a_sweep_of_a_single_dataset_gets_its_plots_and_pages(vector_fits, tmp_path):
    config = vector_sweep(vector_fits, tmp_path, ["s3"], report={"var_names": ["a", "L"]})
    write_plots(config)
    assert forest_files(config) == ["L.png", "a.png"]
    rows = forest_rows(config.layout.posteriors, config.report, config.summary)
    for name in ("a", "L"):
        assert_rows_are_arviz(rows[name], fit_elements(config, ["s3"], name), config.summary)
    write_report_pages(config)
    assert health_cells(config, 1) in health_page(config)
    report = config.results_dir / "report"
    with xr.open_datatree(config.layout.fit("s3")) as tree:
        sampled = tree.attrs["created_at"]
    assert f"<td>first fit sampled</td><td>{sampled}</td>" in (report / "provenance.html").read_text()
    assert f"<td>last fit sampled</td><td>{sampled}</td>" in (report / "provenance.html").read_text()
    summary, summary_html = pd.read_csv(config.layout.summary), (report / "summary.html").read_text()
    assert summary_html.count("<tr class=") == 1  # datasets.csv's one dataset, coloured by its status
    assert len(summary) == 4 + 8 + 4 + 1  # a, L, a_centered, a_range
    assert all(f"<td>s3</td><td>{parameter}</td>" in summary_html for parameter in summary["parameter"])


def test_variables_whose_dims_differ_between_datasets_are_drawn_at_each_datasets_own_labels(vector_fits, tmp_path,
                                                                                             caplog):
    """`a` and `L` have other groups in each dataset (padded to their union in posteriors.nc): each dataset's
    rows are its own elements. A variable whose dims are *named* otherwise in one fit (here s1's
    ``a_centered`` rewritten over ``levels``) is left out of posteriors.nc by collect: named in
    `report.var_names`, it is not drawn and the plots log says why; the others are."""
    ids = list(VECTOR_GROUPS)
    config = vector_sweep(vector_fits, tmp_path, ids, report={"var_names": ["a", "a_centered", "L"]})
    with xr.open_datatree(config.layout.fit("s1")) as tree:
        odd = tree.load().to_dict()
    odd["/posterior"]["a_centered"] = odd["/posterior"]["a_centered"].rename(groups="levels")
    config.layout.fit("s1").unlink()
    xr.DataTree.from_dict(odd).to_netcdf(config.layout.fit("s1"), engine="netcdf4")
    collect(config, ids)
    with xr.open_datatree(config.layout.posteriors) as tree:
        assert "a_centered" in json.loads(tree.attrs["excluded_variables"])
        assert tree["posterior"]["groups"].values.tolist() == ["g0", "g1", "g2", "g3", "g4"]
    with caplog.at_level(logging.WARNING, logger="batchfit"):
        write_plots(config)
    assert forest_files(config) == ["L.png", "a.png"]
    assert "no forest plot of a_centered" in caplog.text
    rows = forest_rows(config.layout.posteriors, config.report, config.summary)
    assert list(rows) == ["a", "L"]
    for name in rows:
        assert_rows_are_arviz(rows[name], fit_elements(config, ids, name), config.summary)
    assert len(rows["a"].labels) == sum(map(len, VECTOR_GROUPS.values()))  # no row for a padded label
    write_report_pages(config)
    assert health_cells(config, 3) in health_page(config)


@pytest.mark.slow
def test_a_sweep_in_which_every_dataset_failed_still_has_its_plots_and_report(tmp_path, session_cache):
    """Through the real rules: the run exits non-zero with batchfit's verdict, the plots and pages are
    written (health: all failed, no forest plot, also with report.var_names set) and `snakemake --report`
    makes the report."""
    (tmp_path / "model.py").write_text(VECTOR_MODEL)
    write_vector_data(tmp_path / "data", {"b1": ["g0", "g1"], "b2": ["g0"]}, failing=True)
    config = write_config(tmp_path / "sweep.yaml", vector_settings(tmp_path, session_cache, results_dir="results",
                                                                  datasets=["data/*.csv"], report={"var_names": ["a"]}))
    run = snakemake(tmp_path, config)
    assert run.returncode != 0 and "2 of 2 dataset(s) failed" in run.stderr, run.stderr[-3000:]
    assert "Error in rule" not in run.stderr, run.stderr[-3000:]
    results = tmp_path / "results"
    assert (results / "plots" / "forest").is_dir() and not list((results / "plots" / "forest").glob("*.png"))
    assert "no forest plot: no dataset was fitted" in (results / "logs" / "plots.log").read_text()
    health = read_health(results / "datasets.csv", max_rows=0)
    assert health.counts == {"ok": 0, "warning": 0, "failed": 2}
    bars = health_figure(health).axes[0].patches  # the figure plots/health.png is
    assert [bar.get_width() for bar in bars] == [0, 0, 2]
    pages = results / "report"
    assert "<td>0</td><td>0</td><td>2</td><td>2</td>" in (pages / "health.html").read_text()
    failures = pd.read_csv(results / "failures.csv")
    assert failures["dataset"].tolist() == ["b1", "b2"] and set(failures["stage"]) == {"sample"}
    failures_html = (pages / "failures.html").read_text()
    assert all(html.escape(message) in failures_html for message in failures["message"])
    made = snakemake(tmp_path, config, "--report", "report.zip")
    assert made.returncode == 0, made.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "report.zip") as archive:
        names = {Path(n).name for n in archive.namelist()}
    assert {"health.png", "health.html", "summary.html", "failures.html", "provenance.html"} <= names


def missing(message: str) -> None:
    """The browser test cannot run: a failure in CI (it must run there), a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def chromium() -> str:
    """Debian's chromium, installed when missing and we are root (as in CI)."""
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0:
        subprocess.run("apt-get update -q && apt-get install -y -q chromium", shell=True, capture_output=True,
                       timeout=900)
        path = shutil.which("chromium")
    if path is None:
        missing("chromium is not installed and could not be (apt-get install chromium)")
    return path


@contextlib.contextmanager
def chromium_page(tmp_path: Path) -> Iterator[tuple[Any, list[str]]]:
    """A page of the system chromium (headless, driven by playwright, which downloads no browser),
    and the list its page errors and console errors are appended to."""
    browser_path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    errors: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=browser_path, args=CHROMIUM_FLAGS[1:],
            headless=True, viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        try:
            yield page, errors
        finally:
            context.close()


@pytest.mark.slow
def test_report_opens_in_chromium_with_plots_and_tables(tmp_path, session_cache):
    config = write_sweep(tmp_path, session_cache, 3)
    bad = pd.read_csv(tmp_path / "data" / "shop_000.csv")
    bad.loc[0, "y"] = np.nan
    bad.to_csv(tmp_path / "data" / "shop_bad.csv", index=False)  # fails to load: a failure to report

    run = snakemake(tmp_path, config)
    assert run.returncode != 0 and "1 of 4 dataset(s) failed" in run.stderr, run.stderr[-3000:]
    results = tmp_path / "results"
    forest = sorted(p.name for p in (results / "plots" / "forest").glob("*.png"))
    assert forest == ["b.png", "mu_a.png", "sigma.png", "sigma_a.png"]  # the scalar free parameters

    # An SBC run's plots, where it leaves them (results_dir/sbc/**/*.png): the next run copies them for the report.
    (results / "sbc" / "mu_a").mkdir(parents=True)
    fig = plt.figure(figsize=(4, 3))
    fig.gca().hist(np.random.default_rng(0).integers(0, 100, 500), bins=20)
    fig.savefig(results / "sbc" / "mu_a" / "ranks.png")
    plt.close(fig)
    run = snakemake(tmp_path, config)
    assert run.returncode != 0 and "1 of 4 dataset(s) failed" in run.stderr, run.stderr[-3000:]
    assert (results / "plots" / "sbc" / "mu_a" / "ranks.png").read_bytes() == \
        (results / "sbc" / "mu_a" / "ranks.png").read_bytes()
    for kind in ("html", "zip"):
        made = snakemake(tmp_path, config, "--report", f"report.{kind}")
        assert made.returncode == 0, made.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "report.zip") as archive:
        names = {Path(n).name for n in archive.namelist()}
    assert {"report.html", "health.png", *forest, "ranks.png", "health.html", "summary.html", "failures.html",
            "provenance.html"} <= names

    summary = pd.read_csv(results / "summary.csv")
    per_dataset = pd.read_csv(results / "datasets.csv").set_index("dataset")
    compile_key = xr.open_datatree(results / "fits" / "shop_001.nc").attrs["compile_key"]
    artifacts = Path(os.environ.get("BATCHFIT_TEST_ARTIFACTS", tmp_path / "screenshots"))
    artifacts.mkdir(parents=True, exist_ok=True)
    print(f"report screenshots: {artifacts}")

    with chromium_page(tmp_path) as (page, errors):
        page.goto((tmp_path / "report.html").as_uri())
        assert "batchfit fitted the model" in page.inner_text("body")
        page.screenshot(path=artifacts / "report-start.png")

        def open_result(category: str, name: str) -> None:
            """Open the report afresh, then a category, then one result (by its label) in it."""
            page.goto((tmp_path / "report.html").as_uri())
            page.get_by_role("link", name=category).click()
            page.locator("tr", has_text=name).locator("a").first.click()
            page.wait_for_timeout(300)
            page.screenshot(path=artifacts / f"report-{name.replace('/', '_')}.png")

        def shown_png() -> list[int]:
            """Natural widths of the PNG results on view (0 if one did not decode)."""
            return page.eval_on_selector_all(
                "img[src^='data:image/png']", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")

        def shown_page() -> str:
            frames = [f for f in page.frames if f.url.startswith("data:text/html")]
            assert len(frames) == 1, [f.url[:60] for f in page.frames]
            return frames[0].inner_text("body")

        shown = [("1. Health", "bar charts"), *[("2. Forest plots", f[:-4]) for f in forest],
                 ("4. Simulation-based calibration", "mu_a/ranks")]
        for category, name in shown:
            open_result(category, name)
            widths = shown_png()
            assert len(widths) == 1 and widths[0] > 100, (name, widths)

        open_result("1. Health", "warnings and failures")
        text = shown_page()
        counts = per_dataset["status"].value_counts()
        assert f"{counts.get('ok', 0)}\t{counts.get('warning', 0)}\t1\t4" in text  # ok, warning, failed, total
        for dataset_id, row in per_dataset[per_dataset["status"] != "ok"].iterrows():
            assert dataset_id in text and str(row["message"]).split(";")[0] in text

        open_result("3. Tables", "datasets and diagnostics (datasets.csv, summary.csv)")
        text = shown_page()
        assert all(f"{d}\t{p}" in text for d, p in per_dataset["path"].items())
        assert all(f"{d}\t{p}" in text for d, p in summary[["dataset", "parameter"]].dropna().itertuples(index=False))

        open_result("3. Tables", "failures (failures.csv)")
        assert "shop_bad" in shown_page()

        open_result("5. Provenance", "versions")
        text = shown_page()
        assert compile_key in text and "models/hierarchical.py" in text and "pymc" in text
        sampled = sorted(xr.open_datatree(f).attrs["created_at"] for f in (results / "fits").glob("*.nc"))
        assert f"first fit sampled\t{sampled[0]}" in text and f"last fit sampled\t{sampled[-1]}" in text
    assert errors == []


def test_the_comparison_page_of_a_sweep_of_variants_opens_in_chromium(variant_sweep, tmp_path):
    """The compare rule's page in Snakemake's report (#48): wins per variant and the unreliable comparisons."""
    shutil.copytree(variant_sweep.parent, tmp_path, dirs_exist_ok=True)  # the report's run leaves the fixture as it is
    made = snakemake(tmp_path, tmp_path / variant_sweep.name, "--report", "report.html")
    assert made.returncode == 0, made.stderr[-3000:]
    comparison = pd.read_csv(tmp_path / "results" / "comparison.csv")
    winners = comparison[comparison["rank"] == 0]["variant"].value_counts()
    # compared by PSIS-LOO alone although PSIS flags an observation: the exact methods refitted the others
    unreliable = sorted(set(comparison[(comparison[K_COLUMN] > 0) & (comparison["method"] == "psis")]["dataset"]))
    methods = comparison.groupby("method")["n_refits"].agg(["size", "sum"])

    with chromium_page(tmp_path) as (page, errors):
        page.goto((tmp_path / "report.html").as_uri())
        page.get_by_role("link", name="0. Variants").click()
        page.locator("tr", has_text="variants compared per dataset").locator("a").first.click()
        page.wait_for_timeout(300)
        frames = [f for f in page.frames if f.url.startswith("data:text/html")]
        assert len(frames) == 1, [f.url[:60] for f in page.frames]
        text = frames[0].inner_text("body")
    assert errors == []
    assert "Wins per variant" in text and f"Unreliable comparisons ({len(unreliable)} dataset(s))" in text
    assert "Where each elpd comes from" in text
    for method, (fits, refits) in methods.iterrows():  # method, fits, datasets, refits
        assert re.search(rf"^{method}\t{fits}\t\d+\t{refits}$", text, re.M), (method, text)
    for variant in comparison["variant"].unique():  # variant, datasets compared, wins
        assert f"{variant}\t{(comparison['variant'] == variant).sum()}\t{winners.get(variant, 0)}\t" in text
    assert all(f"{d}\t" in text for d in comparison["dataset"])
