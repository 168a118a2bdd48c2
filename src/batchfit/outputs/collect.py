"""Combine the per-dataset fits of a sweep into posteriors.nc, summary.csv, datasets.csv and failures.csv.

Each dataset has either a fit (``fits/{id}.nc``, an ArviZ DataTree) or a failure record
(``failures/{id}.json``). Collect handles them one at a time, streaming summary.csv and
posteriors.nc (layout: `batchfit.outputs.combined`) to disk, so memory stays flat however many datasets
the sweep has, and writes every output atomically. Summaries are cached per fit content
(`SummaryCache`), so adding datasets to a finished sweep summarises only those; given several
workers, collect shares many new fits out between that many processes.
"""

from __future__ import annotations

import csv
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from batchfit.common.atomic import atomic_path
from batchfit.errors import BatchfitError, DatasetError
from batchfit.fitting.fit_register import FitRegister
from batchfit.layout import ResultsLayout
from batchfit.outputs.combined import (
    SweepLayout,
    no_chunk_cache,
    previous_blocks,
    read_posterior,
    stacked_writer,
)
from batchfit.outputs.health import (
    DATASET_COLUMNS,
    HealthThresholds,
    failed_row,
    fitted_row,
    recorded_rows,
    score_health,
)
from batchfit.outputs.summary_cache import (
    SummaryCache,
    _cell,
    _summary_rows,
    summary_columns,
)
from batchfit.outputs.summary_pool import SummaryHelpers
from batchfit.records import fit_attributes
from batchfit.records.failure import FAILURE_COLUMNS, FailureRecord
from batchfit.settings import SummarySettings

log = logging.getLogger("batchfit")


PREVIOUS_POSTERIORS = "posteriors.previous.nc"  # in the summary cache directory: see _keep_for_next_collect


_MAX_IDS_IN_MESSAGE = 20


class CollectConfig(Protocol):
    """The parts of `batchfit.config.Config` that `collect` reads."""

    health: HealthThresholds
    summary: SummarySettings

    @property
    def layout(self) -> ResultsLayout: ...


@dataclass(frozen=True)
class CollectReport:
    """Outcome of a collect run: counts per status and the files written."""

    n_ok: int
    n_warning: int
    n_failed: int
    posteriors_path: Path
    summary_path: Path
    failures_path: Path
    datasets_path: Path
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
            line += f"; {n_fallbacks} not on batchfit's cached path (datasets.csv's fallback column says why)"
        if self.n_failed:
            return f"{line} (see {self.failures_path})"
        if self.n_warning or n_fallbacks:
            return f"{line} (see {self.datasets_path})"
        return line


def collect(
    config: CollectConfig, dataset_ids: Sequence[str], *, expected_provenance: Mapping[str, str] | None = None,
    workers: int | SummaryHelpers = 1, register: FitRegister | None = None,
) -> CollectReport:
    """Collect the sweep's fits using the layout, health thresholds and summary settings of a `Config`.

    ``expected_provenance`` (dataset id -> digest, `batchfit.fitting.provenance.expected_digests`) is
    what the current config gives; a fit that recorded another digest is an error (see
    `collect_fits`). The sweep (`batchfit.sweep.collect_job.run_collect`) always passes it, and helper
    processes it started early for ``workers``.
    """
    return collect_fits(dataset_ids, fits=config.layout, thresholds=config.health, summary=config.summary,
                        expected_provenance=expected_provenance, workers=workers, register=register)


def collect_fits(
    dataset_ids: Sequence[str],
    *,
    fits: ResultsLayout,
    thresholds: HealthThresholds,
    out: ResultsLayout | None = None,
    summary: SummarySettings | None = None,
    expected_provenance: Mapping[str, str] | None = None,
    workers: int | SummaryHelpers = 1,
    register: FitRegister | None = None,
) -> CollectReport:
    """Write summary.csv, datasets.csv, posteriors.nc and failures.csv of `out` (default: `fits`) for
    `dataset_ids`, whose fits and failure records are in `fits`.

    posteriors.nc (`batchfit.outputs.combined`) and summary.csv hold the variables `summary` selects;
    the status is scored on those `thresholds` selects (see `batchfit.model.variables`).

    Incremental: each fit's summary rows, divergences and layout are cached in the store of
    ``summaries/`` of `out` (`SummaryCache`), keyed by the fit file's sha256 (or, given the sweep's
    ``register``, the stamp it records of the fit) and every setting and code the summary depends
    on (`summary_key`); only fits without
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
    out = out or fits
    fit_path, failure_path = fits.fit, fits.failure
    if register is None:
        has_fit, has_failure = (lambda d: Path(fit_path(d)).is_file()), (lambda d: Path(failure_path(d)).is_file())
    else:
        has_fit, has_failure = (lambda d: register.digest(d) is not None), register.failed
    fitted, failed = _classify(dataset_ids, has_fit, has_failure, fit_path, failure_path)
    failures = {d: FailureRecord.read_of(d, failure_path(d)).row() for d in failed}
    summary = summary or SummarySettings()
    stamps = {d: register.fit_stamp(d) for d in fitted} if register is not None else None
    cache = SummaryCache(out.summaries, summary, thresholds, stamps)
    # Paths as text: Path objects cost memory per dataset, and most of it stays with the process
    # once they are freed, so collect's peak would grow with N
    fits_of = [(d, str(fit_path(d))) for d in fitted]
    cache.fill(fits_of, workers)
    columns = summary_columns(summary)
    statuses: dict[str, str] = {}
    fallbacks: dict[str, list[str]] = {}
    stale: list[str] = []
    stacked = SweepLayout()  # posteriors.nc's
    with (atomic_path(out.summary) as summary_tmp, atomic_path(out.datasets_csv) as datasets_tmp,
          atomic_path(out.posteriors) as posteriors_tmp):
        with (open(summary_tmp, "w", newline="") as csv_file, open(datasets_tmp, "w", newline="") as datasets_file,
              cache.taking_in(fits_of) as entries):
            # as pandas' to_csv writes, without a DataFrame per dataset
            csv_out = csv.writer(csv_file, lineterminator="\n")
            csv_out.writerow(columns)
            datasets_out = csv.writer(datasets_file, lineterminator="\n")
            datasets_out.writerow(DATASET_COLUMNS)
            for dataset_id in dataset_ids:  # both streamed in the order given, one dataset at a time
                if dataset_id in failures:
                    datasets_out.writerow(_dataset_cells(failed_row(failures[dataset_id])))
                    continue
                entry = next(entries)  # in the order of `fitted`, which is the sweep's
                # the digest the fit recorded, from its cached attributes (the cache entry is for this very file)
                recorded = entry["attrs"].get(fit_attributes.PROVENANCE)
                if expected_provenance is not None and recorded != expected_provenance[dataset_id]:
                    stale.append(dataset_id)
                table = entry["table"]
                scored = np.isin(table["variable"], entry["scored"])
                health = score_health(*(np.asarray(table[column], dtype=float)[scored]
                                        for column in ("r_hat", "ess_bulk", "ess_tail")), entry, thresholds,
                                      recorded_rows(entry["attrs"]))
                statuses[dataset_id] = health["status"]
                if entry["attrs"].get(fit_attributes.FALLBACK):
                    fallbacks.setdefault(str(entry["attrs"][fit_attributes.FALLBACK]), []).append(dataset_id)
                csv_out.writerows(_summary_rows(dataset_id, entry, columns))
                datasets_out.writerow(_dataset_cells(fitted_row(dataset_id, entry["attrs"], health)))
                stacked.add(entry["layout"], list(entry["attrs"]), dataset_id)
        if stale:
            raise stale_fits_error(stale, len(fitted), fit_path)
        for name, why in stacked.excluded.items():
            log.warning("collect: variable %r is left out of posteriors.nc (%s); read it from the fits", name, why)
        previous = cache.directory / PREVIOUS_POSTERIORS
        read = _write_posteriors(posteriors_tmp, previous, fitted, stacked, cache, fit_path)
    cache.clear_stage()
    _keep_for_next_collect(out.posteriors, cache.directory / PREVIOUS_POSTERIORS)
    _write_csv(pd.DataFrame(list(failures.values()), columns=FAILURE_COLUMNS), out.failures_csv)
    log.info("collect: summarised %d of %d fits (the others from %s), read %d posteriors from their fits",
             len(cache.summarised), len(fitted), cache.directory, len(read))

    summarised = set(cache.summarised)  # reported in the sweep's order, whichever process summarised them
    return CollectReport(
        n_ok=sum(status == "ok" for status in statuses.values()),
        n_warning=sum(status == "warning" for status in statuses.values()),
        n_failed=len(failures),
        posteriors_path=out.posteriors,
        summary_path=out.summary,
        failures_path=out.failures_csv,
        datasets_path=out.datasets_csv,
        warning_ids=[d for d, status in statuses.items() if status == "warning"],
        failed_ids=list(failed),
        summarised_ids=[d for d in fitted if d in summarised],
        posterior_read_ids=read,
        fallbacks=fallbacks,
    )


def _dataset_cells(row: Mapping[str, object]) -> list[str]:
    """A datasets.csv row's cells in `DATASET_COLUMNS` order (empty where the row has no value)."""
    return [_cell(row.get(column, "")) for column in DATASET_COLUMNS]


def _write_posteriors(
    tmp: Path, previous: Path, fitted: Sequence[str], layout: SweepLayout, cache: SummaryCache,
    fit_path: Callable[[str], Path],
) -> list[str]:
    """Write posteriors.nc to `tmp`, copying unchanged datasets' blocks from `previous`; return ids read from fits."""
    read = []
    with (no_chunk_cache(), stacked_writer(tmp, layout, fitted) as writer,
          previous_blocks(previous, layout.signature()) as (old, blocks)):
        for i, (dataset_id, entry) in enumerate(zip(fitted, cache.stored_entries(), strict=True)):
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


def _classify(
    dataset_ids: Sequence[str],
    has_fit: Callable[[str], bool],
    has_failure: Callable[[str], bool],
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
        fit, failure = has_fit(dataset_id), has_failure(dataset_id)
        if fit and failure:
            both.append(dataset_id)
        elif fit:
            fitted.append(dataset_id)
        elif failure:
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


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)


def _id_list(dataset_ids: Sequence[str]) -> str:
    """Ids for an error message, shortened when there are many."""
    shown = ", ".join(f"'{d}'" for d in dataset_ids[:_MAX_IDS_IN_MESSAGE])
    more = len(dataset_ids) - _MAX_IDS_IN_MESSAGE
    return f"{shown} and {more} more" if more > 0 else shown
