"""Combine the per-dataset fits of a sweep into posteriors.nc, summary.csv and failures.csv.

Each dataset has either a fit (``fits/{id}.nc``, an ArviZ DataTree) or a failure record
(``failures/{id}.json``). Collect reads them one at a time, so memory stays flat however many
datasets the sweep has, and writes every output atomically.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import netCDF4
import numpy as np
import pandas as pd
import xarray as xr
from arviz_base import rcParams
from arviz_stats.base import array_stats

from batchfit import __version__
from batchfit.atomic import atomic_path
from batchfit.config import SummarySettings
from batchfit.errors import BatchfitError, ConfigError, DatasetError
from batchfit.provenance import fit_digest
from batchfit.variables import FREE, OBSERVATION_SIZED, ROLE_ATTR, select_vars

ENGINE = "netcdf4"
SAMPLE_DIMS = ["chain", "draw"]
# summary.csv columns around the statistics (`stat_columns`, named and ordered as arviz_stats.summary's)
ROW_COLUMNS = ["dataset", "parameter"]
HEALTH_COLUMNS = ["divergences", "max_r_hat", "min_ess_bulk", "status", "message", "structure", "sampler_path"]
FAILURE_COLUMNS = ["dataset", "path", "stage", "error_type", "message"]
_MAX_IDS_IN_MESSAGE = 20


class HealthThresholds(Protocol):
    """What makes a fit a warning, checked on which variables; `Config.health` (HealthSettings) satisfies this."""

    max_r_hat: float
    min_ess_bulk: float
    max_divergences: int
    var_names: tuple[str, ...] | None
    filter_vars: str | None


class CollectConfig(Protocol):
    """The parts of `batchfit.config.Config` that `collect` reads."""

    health: HealthThresholds
    summary: SummarySettings

    def fit_path(self, dataset_id: str) -> Path: ...

    def failure_path(self, dataset_id: str) -> Path: ...

    @property
    def posteriors_path(self) -> Path: ...

    @property
    def summary_path(self) -> Path: ...

    @property
    def failures_csv_path(self) -> Path: ...


@dataclass(frozen=True)
class CollectReport:
    """Outcome of a collect run: counts per status and the files written."""

    n_ok: int
    n_warning: int
    n_failed: int
    posteriors_path: Path
    summary_path: Path
    failures_path: Path
    warning_ids: list[str] = field(default_factory=list)
    failed_ids: list[str] = field(default_factory=list)

    @property
    def n_datasets(self) -> int:
        return self.n_ok + self.n_warning + self.n_failed

    def one_line(self) -> str:
        """E.g. ``collect: 18 ok, 1 warning, 1 failed of 20 datasets (see results/failures.csv)``."""
        line = (
            f"collect: {self.n_ok} ok, {self.n_warning} warning, {self.n_failed} failed "
            f"of {self.n_datasets} datasets"
        )
        if self.n_failed:
            return f"{line} (see {self.failures_path})"
        if self.n_warning:
            return f"{line} (see {self.summary_path})"
        return line


def collect(
    config: CollectConfig, dataset_ids: Sequence[str], *, expected_provenance: Mapping[str, str] | None = None
) -> CollectReport:
    """Collect the sweep's fits using the paths and health thresholds of a `Config`.

    ``expected_provenance`` (dataset id -> digest, `batchfit.provenance.expected_digests`) is
    what the current config gives; a fit that recorded another digest is an error (see
    `collect_fits`). The sweep (`batchfit.pipeline.run_collect`) always passes it.
    """
    return collect_fits(
        dataset_ids,
        fit_path=config.fit_path,
        failure_path=config.failure_path,
        posteriors_path=config.posteriors_path,
        summary_path=config.summary_path,
        failures_csv_path=config.failures_csv_path,
        thresholds=config.health,
        summary=config.summary,
        expected_provenance=expected_provenance,
    )


def collect_fits(
    dataset_ids: Sequence[str],
    *,
    fit_path: Callable[[str], Path],
    failure_path: Callable[[str], Path],
    posteriors_path: Path,
    summary_path: Path,
    failures_csv_path: Path,
    thresholds: HealthThresholds,
    summary: SummarySettings | None = None,
    expected_provenance: Mapping[str, str] | None = None,
) -> CollectReport:
    """Write posteriors.nc, summary.csv and failures.csv for `dataset_ids`, in that order.

    posteriors.nc and summary.csv hold the variables `summary` selects; the status is scored on
    those `thresholds` selects (see `batchfit.variables`).

    Raises BatchfitError before writing anything if a dataset has neither a fit nor a failure
    record (the fit stage has not run for it), has both (one of them is stale), or, given
    ``expected_provenance``, has a fit whose recorded provenance digest differs (it was made
    with other settings, another model or other data, and must not be mixed in).
    """
    fitted, failed = _classify(dataset_ids, fit_path, failure_path)
    if expected_provenance is not None:
        _check_provenance(fitted, fit_path, expected_provenance)
    failures = [read_failure(dataset_id, failure_path(dataset_id)) for dataset_id in failed]

    summary = summary or SummarySettings()
    columns = summary_columns(summary)
    rows: dict[str, pd.DataFrame] = {record["dataset"]: _failure_rows(record, columns) for record in failures}
    statuses: dict[str, str] = {}
    root_attrs = {
        "batchfit_version": __version__,
        "n_datasets": len(fitted),
        "datasets": json.dumps(fitted),
    }
    with atomic_path(posteriors_path) as tmp, _netcdf_groups(tmp, root_attrs) as add_group:
        for dataset_id in fitted:
            path = Path(fit_path(dataset_id))
            posterior, divergences = read_fit(dataset_id, path)
            summarised = _selected(posterior, summary, "summary", dataset_id, path)
            scored = _selected(posterior, thresholds, "health", dataset_id, path)
            add_group(dataset_id, posterior[summarised])
            table = summarise_posterior(posterior, dataset_id, path, summary, [*summarised, *scored])
            health = _health(table[table["variable"].isin(scored)], divergences, thresholds)
            statuses[dataset_id] = health["status"]
            rows[dataset_id] = _summary_rows(dataset_id, table[table["variable"].isin(summarised)], health, columns,
                                             posterior.attrs)

    _write_csv(_concat([rows[dataset_id] for dataset_id in dataset_ids], columns), summary_path)
    _write_csv(pd.DataFrame(failures, columns=FAILURE_COLUMNS), failures_csv_path)

    return CollectReport(
        n_ok=sum(status == "ok" for status in statuses.values()),
        n_warning=sum(status == "warning" for status in statuses.values()),
        n_failed=len(failures),
        posteriors_path=Path(posteriors_path),
        summary_path=Path(summary_path),
        failures_path=Path(failures_csv_path),
        warning_ids=[d for d, status in statuses.items() if status == "warning"],
        failed_ids=list(failed),
    )


def dataset_health(fit_path: Path, thresholds: HealthThresholds) -> dict[str, Any]:
    """Health of one written fit: divergences, max_r_hat, min_ess_bulk, status, reasons.

    `status` is "warning" if any threshold is crossed, else "ok"; `reasons` says which, in
    words, for log lines. NaN diagnostics (e.g. a constant variable) are ignored.
    """
    fit_path = Path(fit_path)
    dataset_id = fit_path.stem
    posterior, divergences = read_fit(dataset_id, fit_path)
    scored = _selected(posterior, thresholds, "health", dataset_id, fit_path)
    return _health(summarise_posterior(posterior, dataset_id, fit_path, names=scored), divergences, thresholds)


def summary_columns(summary: SummarySettings) -> list[str]:
    """summary.csv's columns; the interval's are named as ArviZ names them (``hdi89_lb``, ``hdi89_ub``)."""
    return [*ROW_COLUMNS, *stat_columns(summary), *HEALTH_COLUMNS]


def stat_columns(summary: SummarySettings) -> list[str]:
    """The statistics of `summarise_posterior`, in the order of ``arviz_stats.summary(kind="all")``."""
    prefix = f"{summary.ci_kind}{int(_ci_prob(summary) * 100)}"  # ArviZ truncates: 0.945 -> 94
    return ["mean", "sd", f"{prefix}_lb", f"{prefix}_ub", "ess_bulk", "ess_tail", "r_hat", "mcse_mean", "mcse_sd"]


def _ci_prob(summary: SummarySettings) -> float:
    return rcParams["stats.ci_prob"] if summary.ci_prob is None else summary.ci_prob


def summarise_posterior(
    posterior: xr.Dataset, dataset_id: str, path: Path, summary: SummarySettings | None = None,
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """ArviZ's summary of every element of the variables `names` (default all), indexed by label (``a[store_3]``).

    Columns: `stat_columns` (unrounded, as ``arviz_stats.summary(kind="all")`` computes them with
    ``ci_kind``/``ci_prob`` from `summary`; ess_tail at ArviZ's ``stats.ci_prob``, as there), and
    ``variable``, the variable each row belongs to. All elements are stacked and summarised
    in one vectorised pass with arviz_stats' array functions, instead of one pass per variable.
    """
    summary = summary or SummarySettings()
    wanted = set(posterior.data_vars if names is None else names)
    names = [name for name in posterior.data_vars if name in wanted]
    if not names:
        return pd.DataFrame(columns=[*stat_columns(summary), "variable"], dtype=float)
    try:
        labels, owners, draws = _stack_elements(posterior[names])
        flat = draws.reshape(draws.shape[0], -1)
        interval = array_stats.eti if summary.ci_kind == "eti" else array_stats.hdi
        with np.errstate(divide="ignore", invalid="ignore"):  # constant variables give NaN r_hat
            bounds = interval(flat, _ci_prob(summary), axis=-1)
            values = [
                flat.mean(axis=-1), flat.std(axis=-1, ddof=1), bounds[..., 0], bounds[..., 1],
                array_stats.ess(draws, method="bulk"),
                array_stats.ess(draws, method="tail", prob=rcParams["stats.ci_prob"]),
                array_stats.rhat(draws),
                array_stats.mcse(draws, method="mean"),
                array_stats.mcse(draws, method="sd"),
            ]
        table = pd.DataFrame(dict(zip(stat_columns(summary), values, strict=True)), index=labels)
    except Exception as exc:
        raise DatasetError(f"cannot summarise the posterior: {exc}", dataset=dataset_id, path=path) from exc
    table["variable"] = owners
    return table


def _stack_elements(posterior: xr.Dataset) -> tuple[list[str], list[str], np.ndarray]:
    """Every scalar element of every variable: labels, variable names and draws shaped (element, chain, draw)."""
    labels: list[str] = []
    owners: list[str] = []
    blocks = []
    for name, var in posterior.data_vars.items():
        dims = [d for d in var.dims if d not in SAMPLE_DIMS]
        values = var.transpose(*SAMPLE_DIMS, *dims).values
        blocks.append(np.moveaxis(values.reshape(*values.shape[:2], -1), -1, 0).astype(float))
        owners += [str(name)] * blocks[-1].shape[0]
        if not dims:
            labels.append(str(name))
            continue
        coords = [posterior[d].values if d in posterior.coords else range(posterior.sizes[d]) for d in dims]
        labels += [f"{name}[{', '.join(map(str, combo))}]" for combo in itertools.product(*coords)]
    return labels, owners, np.concatenate(blocks, axis=0)


def _selected(
    posterior: xr.Dataset, settings: HealthThresholds | SummarySettings, key: str, dataset_id: str, path: Path
) -> list[str]:
    """The variables of a fit that the `summary` or `health` settings select.

    Default (no `var_names`): for `summary` all but observation-sized deterministics, for
    `health` the free parameters, by the role each fit records (a variable without one, from a
    fit not written by batchfit, counts as a free parameter).
    """
    if settings.var_names is None:
        roles = {name: var.attrs.get(ROLE_ATTR, FREE) for name, var in posterior.data_vars.items()}
        if key == "health":
            return [name for name, role in roles.items() if role == FREE]
        return [name for name, role in roles.items() if role != OBSERVATION_SIZED]
    try:
        return select_vars([str(name) for name in posterior.data_vars], settings.var_names, settings.filter_vars)
    except ValueError as exc:
        raise ConfigError(f"{exc}, in the fit of dataset '{dataset_id}' ({path})", key=f"{key}.var_names") from None


def read_failure(dataset_id: str, path: Path) -> dict[str, str]:
    """Read one failure record, checking it has the fields failures.csv needs."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read failure record: {exc}", dataset=dataset_id, path=path) from exc
    if not isinstance(record, dict):
        raise DatasetError("failure record is not a JSON object", dataset=dataset_id, path=path)
    missing = [key for key in FAILURE_COLUMNS if key not in record]
    if missing:
        raise DatasetError(f"failure record lacks {', '.join(missing)}", dataset=dataset_id, path=path)
    if record["dataset"] != dataset_id:
        raise DatasetError(
            f"failure record is for dataset '{record['dataset']}'", dataset=dataset_id, path=path
        )
    return {key: str(record[key]) for key in FAILURE_COLUMNS}


def _classify(
    dataset_ids: Sequence[str],
    fit_path: Callable[[str], Path],
    failure_path: Callable[[str], Path],
) -> tuple[list[str], list[str]]:
    """Split ids into fitted and failed; raise if any is missing, duplicated or ambiguous."""
    duplicates = sorted(d for d, n in Counter(dataset_ids).items() if n > 1)
    if duplicates:
        raise BatchfitError(f"collect: duplicate dataset ids: {_id_list(duplicates)}")
    bad_names = [d for d in dataset_ids if not d or "/" in d or d == "."]
    if bad_names:
        raise BatchfitError(
            f"collect: dataset ids {_id_list(bad_names)} cannot name a group in posteriors.nc"
        )
    fitted, failed, missing, both = [], [], [], []
    for dataset_id in dataset_ids:
        has_fit = Path(fit_path(dataset_id)).is_file()
        has_failure = Path(failure_path(dataset_id)).is_file()
        if has_fit and has_failure:
            both.append(dataset_id)
        elif has_fit:
            fitted.append(dataset_id)
        elif has_failure:
            failed.append(dataset_id)
        else:
            missing.append(dataset_id)
    if missing:
        first = missing[0]
        raise BatchfitError(
            f"collect: {len(missing)} dataset(s) have neither a fit nor a failure record: "
            f"{_id_list(missing)} (e.g. no {fit_path(first)} or {failure_path(first)}); "
            "run the fit stage for them first"
        )
    if both:
        first = both[0]
        raise BatchfitError(
            f"collect: {len(both)} dataset(s) have both a fit and a failure record, so one is "
            f"stale: {_id_list(both)} (e.g. {fit_path(first)} and {failure_path(first)}); "
            "delete the stale file or re-run the fit stage for them"
        )
    return fitted, failed


def _check_provenance(
    fitted: Sequence[str], fit_path: Callable[[str], Path], expected: Mapping[str, str]
) -> None:
    """Raise if any fit recorded another provenance digest than the current config gives."""
    stale = []
    for dataset_id in fitted:
        try:
            recorded = fit_digest(fit_path(dataset_id))
        except OSError as exc:
            raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=fit_path(dataset_id)) from exc
        if recorded != expected[dataset_id]:
            stale.append(dataset_id)
    if stale:
        raise BatchfitError(
            f"collect: {len(stale)} of {len(fitted)} fit(s) were made with other settings, another model "
            f"file or other data than the current config and files give: {_id_list(stale)} (e.g. "
            f"{fit_path(stale[0])}); not mixing them in. Run the fit stage again (snakemake or "
            "batchfit run): it refits exactly these datasets"
        )


def group_dataset(group: netCDF4.Group) -> xr.Dataset:
    """One group of a netCDF4 file opened with ``set_auto_mask(False)``, in memory: variables with
    their attributes, dimension variables as coordinates.

    Far cheaper than ``xr.open_dataset(path, group=...)``, which reads the metadata of the whole
    file on every open (seconds per fit under load, when SBC ranks or plots read hundreds).
    """
    variables = {name: (var.dimensions, var[...], {k: var.getncattr(k) for k in var.ncattrs() if not k.startswith("_")})
                 for name, var in group.variables.items()}
    coords = {name: variables.pop(name)[1] for name in list(variables) if name in group.dimensions}
    return xr.Dataset(variables, coords=coords)


def read_fit(dataset_id: str, path: Path) -> tuple[xr.Dataset, int]:
    """Load one fit's posterior into memory and count its divergent transitions.

    Only what collect needs is read (the posterior, ``diverging`` and the root attributes), not
    the whole tree. The posterior keeps its own attrs plus the fit's root attrs (dataset,
    source, model_hash, seed, sampler, ...) so each group of posteriors.nc carries provenance.
    """
    try:
        with netCDF4.Dataset(path) as nc:
            missing = [group for group in ("posterior", "sample_stats") if group not in nc.groups]
            if missing:
                raise DatasetError(f"fit has no {' or '.join(missing)} group", dataset=dataset_id, path=path)
            if "diverging" not in nc["sample_stats"].variables:
                raise DatasetError("fit has no sample_stats/diverging variable", dataset=dataset_id, path=path)
            root_attrs = {key: nc.getncattr(key) for key in nc.ncattrs()}
            divergences = int(np.asarray(nc["sample_stats"]["diverging"][:]).sum())
        recorded = root_attrs.get("dataset", dataset_id)
        if recorded != dataset_id:
            raise DatasetError(f"fit file is for dataset '{recorded}'", dataset=dataset_id, path=path)
        with xr.open_dataset(path, group="posterior", engine=ENGINE) as ds:
            posterior = ds.load().drop_encoding()
        posterior.attrs = {**posterior.attrs, **root_attrs}
        return posterior, divergences
    except (OSError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=path) from exc


def _health(table: pd.DataFrame, divergences: int, thresholds: HealthThresholds) -> dict[str, Any]:
    """Dataset-level health from its summary table and divergence count."""
    max_r_hat = _nan_reduce(np.nanmax, table["r_hat"])
    min_ess_bulk = _nan_reduce(np.nanmin, table["ess_bulk"])
    reasons = []
    if divergences > thresholds.max_divergences:
        reasons.append(f"{divergences} divergences > {thresholds.max_divergences}")
    if max_r_hat > thresholds.max_r_hat:
        reasons.append(f"max r_hat {max_r_hat:.3f} > {thresholds.max_r_hat}")
    if min_ess_bulk < thresholds.min_ess_bulk:
        reasons.append(f"min ess_bulk {min_ess_bulk:.0f} < {thresholds.min_ess_bulk}")
    return {
        "divergences": divergences,
        "max_r_hat": max_r_hat,
        "min_ess_bulk": min_ess_bulk,
        "status": "warning" if reasons else "ok",
        "reasons": reasons,
    }


def _nan_reduce(reduce: Callable[[np.ndarray], Any], values: pd.Series) -> float:
    """`reduce` over the non-NaN values, NaN if there are none (comparisons then pass)."""
    finite = values.to_numpy(dtype=float)
    finite = finite[~np.isnan(finite)]
    return float(reduce(finite)) if finite.size else math.nan


def _summary_rows(
    dataset_id: str, table: pd.DataFrame, health: dict[str, Any], columns: list[str], fit_attrs: dict[str, Any]
) -> pd.DataFrame:
    """summary.csv rows for one fitted dataset: why it is a warning, and the structure and path it took."""
    rows = table.rename_axis("parameter").reset_index()
    rows.insert(0, "dataset", dataset_id)
    for key in ("divergences", "max_r_hat", "min_ess_bulk", "status"):
        rows[key] = health[key]
    rows["message"] = "; ".join(health["reasons"])
    rows["structure"] = str(fit_attrs.get("structure", ""))[:12]
    rows["sampler_path"] = str(fit_attrs.get("sampler_path", ""))
    return rows[columns]


def _failure_rows(record: dict[str, str], columns: list[str]) -> pd.DataFrame:
    """The single summary.csv row for a failed dataset."""
    row = {"dataset": record["dataset"], "parameter": "", "status": "failed", "message": record["message"]}
    return pd.DataFrame([row], columns=columns)


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    """One summary table; divergences as nullable ints so failed rows write an empty cell."""
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return table.astype({"divergences": "Int64"})


@contextmanager
def _netcdf_groups(path: Path, attrs: dict[str, Any]) -> Iterator[Callable[[str, xr.Dataset], None]]:
    """Create a netCDF4 file with root `attrs`; yield `add(group, dataset)` writing one group.

    The file stays open for all groups: `to_netcdf(mode="a", group=...)` per dataset re-opens
    it and rescans every existing group, which is quadratic in the number of datasets (400
    datasets took minutes). Each group is written and dropped in turn, so memory holds one
    posterior at a time.
    """
    store = xr.backends.NetCDF4DataStore.open(path, mode="w")
    try:
        xr.Dataset(attrs=attrs).dump_to_store(store)
        yield lambda group, dataset: dataset.dump_to_store(store.get_child_store(group))
    finally:
        store.close()


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)


def _id_list(dataset_ids: Sequence[str]) -> str:
    """Ids for an error message, shortened when there are many."""
    shown = ", ".join(f"'{d}'" for d in dataset_ids[:_MAX_IDS_IN_MESSAGE])
    more = len(dataset_ids) - _MAX_IDS_IN_MESSAGE
    return f"{shown} and {more} more" if more > 0 else shown
