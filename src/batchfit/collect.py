"""Combine the per-dataset fits of a sweep into posteriors.nc, summary.csv and failures.csv.

Each dataset has either a fit (``fits/{id}.nc``, an ArviZ DataTree) or a failure record
(``failures/{id}.json``). Collect handles them one at a time, streaming summary.csv and
posteriors.nc (layout: `batchfit.combined`) to disk, so memory stays flat however many datasets
the sweep has, and writes every output atomically. Summaries are cached per fit content
(`SummaryCache`), so adding datasets to a finished sweep summarises only those; given several
workers, collect shares many new fits out between that many processes.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import netCDF4
import numpy as np
import pandas as pd
import xarray as xr
from arviz_base import rcParams

from batchfit import diagnostics, intervals
from batchfit.atomic import atomic_path
from batchfit.combined import (
    SweepLayout,
    decoded_group,
    fit_layout,
    no_chunk_cache,
    plain_attrs,
    previous_blocks,
    read_posterior,
    stacked_writer,
)
from batchfit.config import SummarySettings
from batchfit.errors import BatchfitError, ConfigError, DatasetError
from batchfit.provenance import file_sha256
from batchfit.summary_workers import SummaryHelpers, helpers_for, started
from batchfit.variables import FREE, OBSERVATION_SIZED, ROLE_ATTR, select_vars, stack_elements

log = logging.getLogger("batchfit")

PREVIOUS_POSTERIORS = "posteriors.previous.nc"  # in the summary cache directory: see _keep_for_next_collect
STAGED = "staged"  # in the summary cache directory: new fits' draws between collect's passes (SummaryCache._stage)
# Draws staged per fit at most: what staging saves is a file open's fixed cost, which matters for
# small posteriors; a large one would take as long to stage as to read again, and its disk space twice.
STAGE_MAX_BYTES = 2**20
# summary.csv columns around the statistics (`stat_columns`, named and ordered as arviz_stats.summary's)
ROW_COLUMNS = ["dataset", "parameter"]
HEALTH_COLUMNS = ["divergences", "max_r_hat", "min_ess_bulk", "status", "message", "structure", "sampler_path",
                  "fallback"]
FAILURE_COLUMNS = ["dataset", "path", "stage", "error_type", "message", "traceback"]
_OPTIONAL_FAILURE_COLUMNS = ("traceback",)  # not in records of batchfit 0.1.0 before issue #43
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
    summarised_ids: list[str] = field(default_factory=list)  # summarised this run (no valid cached summary)
    posterior_read_ids: list[str] = field(default_factory=list)  # read from their fits (not copied from before)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)  # why not the cached path -> datasets

    @property
    def n_datasets(self) -> int:
        return self.n_ok + self.n_warning + self.n_failed

    def one_line(self) -> str:
        """E.g. ``collect: 18 ok, 1 warning, 1 failed of 20 datasets (see results/failures.csv)``."""
        line = (
            f"collect: {self.n_ok} ok, {self.n_warning} warning, {self.n_failed} failed "
            f"of {self.n_datasets} datasets"
        )
        n_fallbacks = sum(map(len, self.fallbacks.values()))
        if n_fallbacks:
            line += f"; {n_fallbacks} not on batchfit's cached path (summary.csv's fallback column says why)"
        if self.n_failed:
            return f"{line} (see {self.failures_path})"
        if self.n_warning or n_fallbacks:
            return f"{line} (see {self.summary_path})"
        return line


def collect(
    config: CollectConfig, dataset_ids: Sequence[str], *, expected_provenance: Mapping[str, str] | None = None,
    workers: int | SummaryHelpers = 1,
) -> CollectReport:
    """Collect the sweep's fits using the paths and health thresholds of a `Config`.

    ``expected_provenance`` (dataset id -> digest, `batchfit.provenance.expected_digests`) is
    what the current config gives; a fit that recorded another digest is an error (see
    `collect_fits`). The sweep (`batchfit.pipeline.run_collect`) always passes it, and helper
    processes it started early for ``workers``.
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
        cache_dir=config.results_dir / "summaries",
        workers=workers,
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
    cache_dir: Path | None = None,
    workers: int | SummaryHelpers = 1,
) -> CollectReport:
    """Write summary.csv, posteriors.nc and failures.csv for `dataset_ids`.

    posteriors.nc (`batchfit.combined`) and summary.csv hold the variables `summary` selects;
    the status is scored on those `thresholds` selects (see `batchfit.variables`).

    Incremental: each fit's summary rows, divergences and layout are cached in
    ``cache_dir/{id}.json`` (default ``summaries/`` beside summary.csv), keyed by the fit file's
    sha256 and every setting and code the summary depends on (`summary_key`); only fits without
    a matching entry are read and summarised (`CollectReport.summarised_ids`), shared out between
    this process and helpers when there are many (``workers``: processes at once, or helpers
    already started; `SummaryCache.fill`). posteriors.nc is
    rewritten, but a dataset whose fit is unchanged since the previous posteriors.nc of the same
    layout (kept as a hard link in the cache directory) is copied from it block by block instead
    of read from its fit (`CollectReport.posterior_read_ids` lists the others); a fit summarised in
    this collect is not read again, its draws were staged when it was summarised.

    Raises BatchfitError, writing no output (only cache entries), if a dataset has neither a fit
    nor a failure record (the fit stage has not run for it), has both (one of them is stale), or, given
    ``expected_provenance``, has a fit whose recorded provenance digest differs (it was made
    with other settings, another model or other data, and must not be mixed in).
    """
    fitted, failed = _classify(dataset_ids, fit_path, failure_path)
    failures = {d: read_failure(d, failure_path(d)) for d in failed}
    summary = summary or SummarySettings()
    cache = SummaryCache(Path(cache_dir or Path(summary_path).parent / "summaries"), summary, thresholds)
    # Paths as text: 10,000 Path objects take ~10 MiB, and most of it stays with the process once
    # they are freed (collect's peak at 10,000 tiny fits, by hand: 183.5 -> 173.0 MiB)
    cache.fill([(d, str(fit_path(d))) for d in fitted], workers)
    columns = summary_columns(summary)
    statuses: dict[str, str] = {}
    fallbacks: dict[str, list[str]] = {}
    stale: list[str] = []
    layout = SweepLayout()
    with atomic_path(summary_path) as summary_tmp, atomic_path(posteriors_path) as posteriors_tmp:
        with open(summary_tmp, "w", newline="") as out:
            csv_out = csv.writer(out, lineterminator="\n")  # as pandas' to_csv writes, without a DataFrame per dataset
            csv_out.writerow(columns)
            for dataset_id in dataset_ids:  # summary.csv streamed in the order given, one dataset at a time
                if dataset_id in failures:
                    csv_out.writerow(_failure_row(failures[dataset_id], columns))
                    continue
                entry = cache.entry(dataset_id, Path(fit_path(dataset_id)))
                # the digest the fit recorded, from its cached attributes (the cache entry is for this very file)
                recorded = entry["attrs"].get("provenance")
                if expected_provenance is not None and recorded != expected_provenance[dataset_id]:
                    stale.append(dataset_id)
                table = entry["table"]
                scored = np.isin(table["variable"], entry["scored"])
                health = _health(np.asarray(table["r_hat"], dtype=float)[scored],
                                 np.asarray(table["ess_bulk"], dtype=float)[scored], entry["divergences"], thresholds)
                statuses[dataset_id] = health["status"]
                if entry["attrs"].get("fallback"):
                    fallbacks.setdefault(str(entry["attrs"]["fallback"]), []).append(dataset_id)
                csv_out.writerows(_summary_rows(dataset_id, entry, health, columns))
                layout.add(entry["layout"], list(entry["attrs"]), dataset_id)
        if stale:
            raise stale_fits_error(stale, len(fitted), fit_path)
        for name, why in layout.excluded.items():
            log.warning("collect: variable %r is left out of posteriors.nc (%s); read it from the fits", name, why)
        read = _write_posteriors(posteriors_tmp, cache.directory / PREVIOUS_POSTERIORS, fitted, layout, cache, fit_path)
    cache.clear_stage()
    _keep_for_next_collect(Path(posteriors_path), cache.directory / PREVIOUS_POSTERIORS)
    _write_csv(pd.DataFrame(list(failures.values()), columns=FAILURE_COLUMNS), failures_csv_path)
    log.info("collect: summarised %d of %d fits (the others from %s), read %d posteriors from their fits",
             len(cache.summarised), len(fitted), cache.directory, len(read))

    summarised = set(cache.summarised)  # reported in the sweep's order, whichever process summarised them
    return CollectReport(
        n_ok=sum(status == "ok" for status in statuses.values()),
        n_warning=sum(status == "warning" for status in statuses.values()),
        n_failed=len(failures),
        posteriors_path=Path(posteriors_path),
        summary_path=Path(summary_path),
        failures_path=Path(failures_csv_path),
        warning_ids=[d for d, status in statuses.items() if status == "warning"],
        failed_ids=list(failed),
        summarised_ids=[d for d in fitted if d in summarised],
        posterior_read_ids=read,
        fallbacks=fallbacks,
    )


def _write_posteriors(
    tmp: Path, previous: Path, fitted: Sequence[str], layout: SweepLayout, cache: SummaryCache,
    fit_path: Callable[[str], Path],
) -> list[str]:
    """Write posteriors.nc to `tmp`, copying unchanged datasets' blocks from `previous`; return ids read from fits."""
    read = []
    with (no_chunk_cache(), stacked_writer(tmp, layout, fitted) as writer,
          previous_blocks(previous, layout.signature()) as (old, blocks)):
        for i, dataset_id in enumerate(fitted):
            entry = cache.load(dataset_id)
            block = blocks.get(dataset_id)
            if old is not None and block is not None and block[1] == entry["fit_sha256"]:
                writer.copy(i, old, block[0])
            else:
                draws = cache.staged_draws(entry)
                if draws is None:
                    path = Path(fit_path(dataset_id))
                    try:
                        posterior = read_posterior(path)
                    except (OSError, ValueError, RuntimeError) as exc:
                        raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=path) from exc
                    draws = {name: posterior[name].values for name in entry["summarised"]}
                writer.put(i, draws, entry["layout"]["coords"])
                read.append(dataset_id)
            writer.describe(i, entry["layout"], entry["attrs"], entry["fit_sha256"], entry["divergences"])
    return read


def _keep_for_next_collect(posteriors: Path, keep: Path) -> None:
    """Hard-link posteriors.nc into the cache directory, where the next collect copies unchanged blocks from.

    Snakemake deletes a rule's outputs before running it, so the next collect cannot read the old
    posteriors.nc itself; a hard link shares its disk space. Without hard links (some file
    systems) the next collect reads every fit again: slower, same result.
    """
    try:
        keep.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(keep) as tmp:
            os.link(posteriors, tmp)
    except OSError as exc:
        keep.unlink(missing_ok=True)
        log.info("collect: cannot link %s to %s (%s); the next collect reads every fit", posteriors, keep, exc)


class SummaryCache:
    """Each fit's summary table, divergences, selected variables, layout and attributes, cached as JSON.

    An entry is valid for exactly one fit file content and one `summary_key`; anything else is
    recomputed (and overwritten). Entries of datasets no longer in the sweep are left alone.
    """

    def __init__(self, directory: Path, summary: SummarySettings, thresholds: HealthThresholds):
        self.directory, self.summary, self.thresholds = directory, summary, thresholds
        self.settings_key = summary_key(summary, thresholds)
        self.summarised: list[str] = []

    def entry(self, dataset_id: str, fit: str | Path) -> dict[str, Any]:
        """The fit's valid entry, computed and written if there is none."""
        fit_sha256, key, entry = self._cached(dataset_id, fit)
        if entry is not None:
            return entry
        entry, draws = self._compute(dataset_id, fit)
        entry |= {"key": key, "fit_sha256": fit_sha256}
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stage(key, [draws[name] for name in entry["summarised"]])
        with atomic_path(self.directory / f"{dataset_id}.json") as tmp:
            tmp.write_text(json.dumps(entry))
        self.summarised.append(dataset_id)
        return entry

    def _stage(self, key: str, arrays: list[np.ndarray]) -> None:
        """Keep the summarised variables' draws for `staged_draws`, by the entry's key (fit content and settings).

        posteriors.nc is written after every entry is known (its layout is their union), so
        without this each new fit is read twice; reading a fit again costs ~16 ms for a tiny
        one, mostly netCDF-C opening the file (it reads the metadata of every variable in every
        group), against ~1 ms to save and load these arrays (up to `STAGE_MAX_BYTES`).
        """
        if sum(a.nbytes for a in arrays) > STAGE_MAX_BYTES:
            return
        path = self.directory / STAGED / f"{key}.npz"
        path.parent.mkdir(exist_ok=True)
        try:
            with atomic_path(path) as tmp, open(tmp, "wb") as out:
                np.savez(out, *arrays, allow_pickle=False)  # arr_0, arr_1, ...: no variable name can clash
        except ValueError:  # object arrays, which only pickle could keep: the fit is read again instead
            pass

    def staged_draws(self, entry: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """The draws `entry`'s computation staged (summarised variable -> array), taken off the stage; None
        if there are none (the entry came from the cache) or they cannot be read (the fit is read instead)."""
        path = self.directory / STAGED / f"{entry['key']}.npz"
        try:
            with np.load(path, allow_pickle=False) as staged:
                return {name: staged[f"arr_{j}"] for j, name in enumerate(entry["summarised"])}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            return None
        finally:
            path.unlink(missing_ok=True)

    def clear_stage(self) -> None:
        """Remove draws no posteriors.nc took (a collect stopped between its passes)."""
        shutil.rmtree(self.directory / STAGED, ignore_errors=True)

    def _cached(self, dataset_id: str, fit: str | Path) -> tuple[str, str, dict[str, Any] | None]:
        """The fit's sha256, its entry key, and its entry if one with that key is cached."""
        try:
            fit_sha256 = file_sha256(fit)
        except OSError as exc:
            raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=fit) from exc
        key = hashlib.sha256(f"{self.settings_key}:{fit_sha256}".encode()).hexdigest()
        try:
            entry = json.loads((self.directory / f"{dataset_id}.json").read_text())
            if entry.get("key") == key:
                return fit_sha256, key, entry
        except (OSError, ValueError):
            pass
        return fit_sha256, key, None

    def fill(self, fits: Sequence[tuple[str, str | Path]], workers: int | SummaryHelpers) -> None:
        """Summarise the (dataset id, fit) pairs without a valid entry, shared out between this process
        and helper processes (`batchfit.summary_workers`) when there are many.

        ``workers``: processes at once (helpers are then started here), or helpers already
        started. A fit that could not be summarised is left for `entry`, which summarises it
        again in the sweep's order and raises its error there.
        """
        missing = [(d, fit) for d, fit in fits if self._needs_summary(d, fit)]
        if isinstance(workers, SummaryHelpers):
            self._share(missing, workers)
            return
        with started(helpers_for(workers, len(missing))) as helpers:
            self._share(missing, helpers)

    def _share(self, missing: Sequence[tuple[str, str | Path]], helpers: SummaryHelpers) -> None:
        self.summarised += helpers.summarise(self, missing, self._summarise_here)  # this process's: by `entry`

    def _summarise_here(self, fits: Sequence[tuple[str, str | Path]]) -> None:
        """This process's share of `fill`."""
        for dataset_id, fit in fits:
            with contextlib.suppress(Exception):  # `entry` tries again and reports it in the sweep's order
                self.entry(dataset_id, fit)

    def _needs_summary(self, dataset_id: str, fit: str | Path) -> bool:
        try:
            return self._cached(dataset_id, fit)[2] is None
        except DatasetError:  # an unreadable fit: `entry` reports it, in the sweep's order
            return False

    def load(self, dataset_id: str) -> dict[str, Any]:
        """The entry `entry` validated or wrote earlier in this run (not hashing the fit again)."""
        return json.loads((self.directory / f"{dataset_id}.json").read_text())

    def _compute(self, dataset_id: str, path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The fit's entry (without key and digest) and the draws of its summarised variables."""
        posterior, divergences = read_fit(dataset_id, path)
        summarised = _selected(posterior, self.summary, "summary", dataset_id, path)
        scored = _selected(posterior, self.thresholds, "health", dataset_id, path)
        table = summarise_posterior(posterior, dataset_id, path, self.summary, [*summarised, *scored])
        columns = {"parameter": list(table.index), **{str(k): v.tolist() for k, v in table.items()}}
        entry = {"dataset": dataset_id, "divergences": divergences, "summarised": summarised, "scored": scored,
                 "table": columns, "layout": fit_layout(posterior[summarised]),
                 "attrs": {k: v if isinstance(v, str) else str(v) for k, v in plain_attrs(posterior.attrs).items()}}
        return entry, {name: posterior[name].values for name in summarised}


def summary_key(summary: SummarySettings, thresholds: HealthThresholds) -> str:
    """Digest of what a cached summary depends on besides the fit: settings, ArviZ's defaults and versions, this code.

    The health thresholds are not in it (health is scored from the cached table at every
    collect), the variables they select are.
    """
    parts = {
        "summary": [summary.var_names, summary.filter_vars, summary.ci_kind, summary.interval_prob],
        "health": [thresholds.var_names, thresholds.filter_vars],
        "ess_tail_prob": rcParams["stats.ci_prob"],
        "versions": {name: version(name) for name in ("arviz-stats", "arviz-base", "numpy", "xarray")},
        "code": _code_sha256(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def _code_sha256() -> str:
    """batchfit's collect code: a change to how summaries are computed invalidates every cached one."""
    here = Path(__file__).parent
    sources = ("collect.py", "combined.py", "diagnostics.py", "intervals.py", "variables.py")
    return hashlib.sha256(b"".join((here / name).read_bytes() for name in sources)).hexdigest()


def dataset_health(fit_path: Path, thresholds: HealthThresholds) -> dict[str, Any]:
    """Health of one written fit: divergences, max_r_hat, min_ess_bulk, status, reasons.

    `status` is "warning" if any threshold is crossed, else "ok"; `reasons` says which, in
    words, for log lines. NaN diagnostics (e.g. a constant variable) are ignored.
    """
    fit_path = Path(fit_path)
    dataset_id = fit_path.stem
    posterior, divergences = read_fit(dataset_id, fit_path)
    scored = _selected(posterior, thresholds, "health", dataset_id, fit_path)
    table = summarise_posterior(posterior, dataset_id, fit_path, names=scored)
    return _health(table["r_hat"].to_numpy(float), table["ess_bulk"].to_numpy(float), divergences, thresholds)


def summary_columns(summary: SummarySettings) -> list[str]:
    """summary.csv's columns; the interval's are named as ArviZ names them (``hdi89_lb``, ``hdi89_ub``)."""
    return [*ROW_COLUMNS, *stat_columns(summary), *HEALTH_COLUMNS]


def stat_columns(summary: SummarySettings) -> list[str]:
    """The statistics of `summarise_posterior`, in the order of ``arviz_stats.summary(kind="all")``."""
    prefix = f"{summary.ci_kind}{int(summary.interval_prob * 100)}"  # ArviZ truncates: 0.945 -> 94
    return ["mean", "sd", f"{prefix}_lb", f"{prefix}_ub", "ess_bulk", "ess_tail", "r_hat", "mcse_mean", "mcse_sd"]


def summarise_posterior(
    posterior: xr.Dataset, dataset_id: str, path: str | Path, summary: SummarySettings | None = None,
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """ArviZ's summary of every element of the variables `names` (default all), indexed by label (``a[store_3]``).

    Columns: `stat_columns` (unrounded, as ``arviz_stats.summary(kind="all")`` computes them with
    ``ci_kind``/``ci_prob`` from `summary`; ess_tail at ArviZ's ``stats.ci_prob``, as there), and
    ``variable``, the variable each row belongs to. All elements are stacked and summarised
    in one vectorised pass: the interval by `batchfit.intervals`, the diagnostics by
    `batchfit.diagnostics` (arviz_stats' definitions, without its loop over elements).
    """
    summary = summary or SummarySettings()
    wanted = set(posterior.data_vars if names is None else names)
    names = [name for name in posterior.data_vars if name in wanted]
    if not names:
        return pd.DataFrame(columns=[*stat_columns(summary), "variable"], dtype=float)
    try:
        labels, owners, draws = stack_elements(posterior[names])
        flat = draws.reshape(draws.shape[0], -1)
        interval = intervals.of_kind(summary.ci_kind)
        with np.errstate(divide="ignore", invalid="ignore"):  # constant variables give NaN r_hat
            bounds = interval(flat, summary.interval_prob)
            values = [
                flat.mean(axis=-1), flat.std(axis=-1, ddof=1), bounds[..., 0], bounds[..., 1],
                diagnostics.ess_bulk(draws), diagnostics.ess_tail(draws, rcParams["stats.ci_prob"]),
                diagnostics.rhat(draws), diagnostics.mcse_mean(draws), diagnostics.mcse_sd(draws),
            ]
        table = pd.DataFrame(dict(zip(stat_columns(summary), values, strict=True)), index=labels)
    except Exception as exc:
        raise DatasetError(f"cannot summarise the posterior: {exc}", dataset=dataset_id, path=path) from exc
    table["variable"] = owners
    return table


def _selected(
    posterior: xr.Dataset, settings: HealthThresholds | SummarySettings, key: str, dataset_id: str,
    path: str | Path,
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
    missing = [key for key in FAILURE_COLUMNS if key not in record and key not in _OPTIONAL_FAILURE_COLUMNS]
    if missing:
        raise DatasetError(f"failure record lacks {', '.join(missing)}", dataset=dataset_id, path=path)
    if record["dataset"] != dataset_id:
        raise DatasetError(
            f"failure record is for dataset '{record['dataset']}'", dataset=dataset_id, path=path
        )
    return {key: str(record.get(key, "")) for key in FAILURE_COLUMNS}


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
            f"collect: dataset ids {_id_list(bad_names)} cannot name a file"
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


def stale_fits_error(stale: Sequence[str], n_fits: int, fit_path: Callable[[str], Path]) -> BatchfitError:
    """The error for fits that recorded another provenance digest than the current config gives."""
    return BatchfitError(
        f"collect: {len(stale)} of {n_fits} fit(s) were made with other settings, another model "
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


def read_fit(dataset_id: str, path: str | Path) -> tuple[xr.Dataset, int]:
    """Load one fit's posterior into memory and count its divergent transitions.

    Only what collect needs is read (the posterior, ``diverging`` and the root attributes), not
    the whole tree. The posterior keeps its own attrs plus the fit's root attrs (dataset,
    source, model_hash, seed, sampler, ...) so posteriors.nc records each dataset's provenance.
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
            posterior = decoded_group(nc["posterior"])  # through the open file: opening it again costs ~1 ms
        posterior.attrs = {**posterior.attrs, **root_attrs}
        return posterior, divergences
    except (OSError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=path) from exc


def _health(
    r_hat: np.ndarray, ess_bulk: np.ndarray, divergences: int, thresholds: HealthThresholds
) -> dict[str, Any]:
    """Dataset-level health from the r_hat and ess_bulk of its scored elements and its divergence count."""
    max_r_hat = _nan_reduce(np.nanmax, r_hat)
    min_ess_bulk = _nan_reduce(np.nanmin, ess_bulk)
    reasons = []
    if divergences > thresholds.max_divergences:
        reasons.append(f"{divergences} divergences > {number_text(thresholds.max_divergences)}")
    if max_r_hat > thresholds.max_r_hat:
        reasons.append(f"max r_hat {shown_against(max_r_hat, thresholds.max_r_hat, 3)} > "
                       f"{number_text(thresholds.max_r_hat)}")
    if min_ess_bulk < thresholds.min_ess_bulk:
        reasons.append(f"min ess_bulk {shown_against(min_ess_bulk, thresholds.min_ess_bulk)} < "
                       f"{number_text(thresholds.min_ess_bulk)}")
    return {
        "divergences": divergences,
        "max_r_hat": max_r_hat,
        "min_ess_bulk": min_ess_bulk,
        "status": "warning" if reasons else "ok",
        "reasons": reasons,
    }


def number_text(value: float) -> str:
    """A threshold as a health reason prints it: the shortest text that reads back as the same
    number, without a trailing ``.0`` (``1.01``, ``400``)."""
    text = repr(float(value))
    return text.removesuffix(".0")


def shown_against(value: float, threshold: float, decimals: int = 0) -> str:
    """``value`` with at least ``decimals`` decimals and as many more as it takes to read on its own
    side of ``threshold`` as `number_text` prints it: an r_hat of 1.0104 against 1.01 prints
    ``1.0104``, not ``1.010``, and an ess_bulk of 399.6 against 400 prints ``399.6``, not ``400``."""
    shown_threshold = float(number_text(threshold))
    if value == shown_threshold or not math.isfinite(value) or abs(value) >= 1e16:
        return number_text(value)  # no side to show, or fixed decimals would show digits it has not
    for places in range(decimals, 18):
        text = f"{value:.{places}f}"
        if (float(text) > shown_threshold) == (value > shown_threshold) and float(text) != shown_threshold:
            return text
    return number_text(value)  # a hair from the threshold: the text that reads back as the value itself


def _nan_reduce(reduce: Callable[[np.ndarray], Any], values: np.ndarray) -> float:
    """`reduce` over the non-NaN values, NaN if there are none (comparisons then pass)."""
    finite = values[~np.isnan(values)]
    return float(reduce(finite)) if finite.size else math.nan


def _summary_rows(
    dataset_id: str, entry: Mapping[str, Any], health: dict[str, Any], columns: list[str]
) -> list[list[str]]:
    """summary.csv rows for one fitted dataset: why it is a warning, and the structure and path it took.

    A row per summarised element; a fit with none (``outputs.var_names`` kept only
    observation-sized deterministics) gets one row with an empty parameter, as a failed dataset
    does: every dataset of the sweep has its health in summary.csv.
    """
    table, attrs = entry["table"], entry["attrs"]
    per_dataset = {
        "dataset": dataset_id, **{key: health[key] for key in ("divergences", "max_r_hat", "min_ess_bulk", "status")},
        "message": "; ".join(health["reasons"]), "structure": str(attrs.get("structure", ""))[:12],
        "sampler_path": str(attrs.get("sampler_path", "")), "fallback": str(attrs.get("fallback", "")),
    }
    wanted = set(entry["summarised"])
    rows = [[_cell(per_dataset[c] if c in per_dataset else table[c][i]) for c in columns]
            for i, variable in enumerate(table["variable"]) if variable in wanted]
    return rows or [[_cell(per_dataset.get(c, "")) for c in columns]]


def _failure_row(record: dict[str, str], columns: list[str]) -> list[str]:
    """The single summary.csv row for a failed dataset."""
    row = {"dataset": record["dataset"], "status": "failed", "message": record["message"]}
    return [row.get(c, "") for c in columns]


def _cell(value: Any) -> str:
    """A CSV cell as pandas writes it: floats as their shortest repr, NaN as an empty cell."""
    if isinstance(value, float | np.floating):
        return "" if math.isnan(value) else repr(float(value))
    return str(value)


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)


def _id_list(dataset_ids: Sequence[str]) -> str:
    """Ids for an error message, shortened when there are many."""
    shown = ", ".join(f"'{d}'" for d in dataset_ids[:_MAX_IDS_IN_MESSAGE])
    more = len(dataset_ids) - _MAX_IDS_IN_MESSAGE
    return f"{shown} and {more} more" if more > 0 else shown
