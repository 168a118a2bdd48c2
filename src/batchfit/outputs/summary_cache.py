"""Each fit's rows of summary.csv (ArviZ's statistics of its variables) and of datasets.csv, cached per fit content.

A fit's summary (reading it and ArviZ's diagnostics) depends on that fit alone, so it is cached
under the fit file's sha256 and everything the summary depends on (`summary_key`); adding
datasets to a finished sweep summarises only those (`SummaryCache`). A new fit's entry is written
as ``summaries/{id}.json`` (by collect or its helper processes); collect then takes every entry
into one store, ``summaries/entries.jsonl`` (a line per fit, in the sweep's order) with its index
``summaries/index.json``, so that a collect of a large sweep reads two files, not one per fit.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import shutil
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from arviz_base import rcParams

from batchfit.common.atomic import atomic_path
from batchfit.common.hashing import file_sha256, package_sources, sources_digest
from batchfit.errors import ConfigError, DatasetError
from batchfit.model.variables import FREE, OBSERVATION_SIZED, ROLE_ATTR, select_vars, stack_elements
from batchfit.outputs import diagnostics, intervals
from batchfit.outputs.combined import (
    fit_layout,
    plain_attrs,
)
from batchfit.outputs.fit_reader import read_fit
from batchfit.outputs.health import HealthThresholds, recorded_rows, score_health
from batchfit.outputs.summary_pool import SummaryHelpers, helpers_for, started
from batchfit.settings import SummarySettings

log = logging.getLogger("batchfit")


STAGED = "staged"  # in the summary cache directory: new fits' draws between collect's passes (SummaryCache._stage)
STORE = "entries.jsonl"  # in the summary cache directory: every entry, one JSON line each, in the sweep's order
INDEX = "index.json"  # dataset id -> [summary_key, fit stamp, entry key, offset]: which stored entries are valid


# Draws staged per fit at most: what staging saves is a file open's fixed cost, which matters for
# small posteriors; a large one would take as long to stage as to read again, and its disk space twice.
STAGE_MAX_BYTES = 2**20


# summary.csv columns around the statistics (`stat_columns`, named and ordered as arviz_stats.summary's)
ROW_COLUMNS = ["dataset", "parameter"]


class SummaryCache:
    """Each fit's summary table, sampler diagnostics, selected variables, layout and attributes, cached as JSON.

    An entry is valid for exactly one fit file content and one `summary_key`; anything else is
    recomputed (and overwritten). Entries of datasets no longer in the sweep are left alone.
    ``stamps``: each fit's size and modification time as the sweep's fit register knows them
    (`batchfit.fitting.fit_register`): an entry made from a fit of that very stamp is valid without
    hashing the fit again.
    """

    def __init__(self, directory: Path, summary: SummarySettings, thresholds: HealthThresholds,
                 stamps: Mapping[str, tuple[int, int] | None] | None = None):
        self.directory, self.summary, self.thresholds = directory, summary, thresholds
        self.settings_key = summary_key(summary, thresholds)
        self.stamps = stamps or {}
        self.summarised: list[str] = []
        self.fresh: set[str] = set()  # datasets whose valid entry is a file of its own (not in the store)
        self.in_store: set[str] = set()  # datasets whose valid entry is in the store
        self._index: dict[str, list] | None = None

    @property
    def index(self) -> dict[str, list]:
        """The store's index (read on first use; empty when there is none or it is damaged)."""
        if self._index is None:
            try:
                self._index = dict(json.loads((self.directory / INDEX).read_text()))
            except (OSError, ValueError, TypeError):
                self._index = {}
        return self._index

    def stored(self, dataset_id: str, fit: str | Path) -> bool:
        """Whether the store holds a valid entry of the fit: for its stamp as the register knows it, else (no
        register) for its content."""
        record = self.index.get(dataset_id)
        if not isinstance(record, list) or len(record) != 4 or record[0] != self.settings_key:
            return False
        stamp = self.stamps.get(dataset_id)
        if stamp is not None:
            return record[1] == list(stamp)
        try:
            return record[2] == hashlib.sha256(f"{self.settings_key}:{file_sha256(fit)}".encode()).hexdigest()
        except OSError:
            return False

    @property
    def settings(self) -> tuple[Path, SummarySettings, HealthThresholds]:
        """What `SummaryCache` is built from: a helper process builds its own from them."""
        return self.directory, self.summary, self.thresholds

    def entry(self, dataset_id: str, fit: str | Path) -> dict[str, Any]:
        """The fit's valid entry, computed and written if there is none."""
        fit_sha256, key, entry = self._cached(dataset_id, fit)
        if entry is not None:
            return entry
        stat = Path(fit).stat()
        entry, draws = self._compute(dataset_id, fit)
        entry |= {"key": key, "fit_sha256": fit_sha256, "settings_key": self.settings_key,
                  "fit_stamp": [stat.st_size, stat.st_mtime_ns]}
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stage(key, [draws[name] for name in entry["summarised"]])
        with atomic_path(self.directory / f"{dataset_id}.json") as tmp:
            tmp.write_text(json.dumps(entry))
        self.summarised.append(dataset_id)
        return entry

    def _stage(self, key: str, arrays: list[np.ndarray]) -> None:
        """Keep the summarised variables' draws for `staged_draws`, by the entry's key (fit content and settings).

        posteriors.nc is written after every entry is known (its layout is their union), so
        without this each new fit is read twice. Reading a tiny fit again costs far more than
        saving and loading these arrays (up to `STAGE_MAX_BYTES`): netCDF-C opening the file reads
        the metadata of every variable in every group.
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
        """The fit's sha256, its entry key, and its entry if one with that key is cached (without hashing the fit
        when the entry was made from a fit of the stamp the register knows)."""
        stamp = self.stamps.get(dataset_id)
        if stamp is not None:
            try:
                entry = json.loads((self.directory / f"{dataset_id}.json").read_text())
                if entry.get("settings_key") == self.settings_key and entry.get("fit_stamp") == list(stamp):
                    return entry["fit_sha256"], entry["key"], entry
            except (OSError, ValueError, KeyError, AttributeError):
                pass
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
        and helper processes (`batchfit.outputs.summary_pool`) when there are many.

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
        self.summarised += helpers.summarise(self.settings, missing, self._summarise_here)  # this process's: by `entry`

    def _summarise_here(self, fits: Sequence[tuple[str, str | Path]]) -> None:
        """This process's share of `fill`."""
        for dataset_id, fit in fits:
            with contextlib.suppress(Exception):  # `entry` tries again and reports it in the sweep's order
                self.entry(dataset_id, fit)

    def _needs_summary(self, dataset_id: str, fit: str | Path) -> bool:
        """Whether the fit has no valid entry, stored or of its own (which it then notes as fresh)."""
        if self.stored(dataset_id, fit):
            self.in_store.add(dataset_id)
            return False
        try:
            entry = self._cached(dataset_id, fit)[2]
        except DatasetError:  # an unreadable fit: `entry` reports it, in the sweep's order
            return False
        if entry is None:
            return True
        self.fresh.add(dataset_id)
        return False

    @contextlib.contextmanager
    def taking_in(self, fitted: Sequence[tuple[str, str | Path]]) -> Iterator[Iterator[dict[str, Any]]]:
        """Every fitted dataset's entry, in the order of ``fitted`` (id, fit), each written to a new store as it
        is taken: from the old store (read along, in the same order), or its own file (computed now if it has
        none: its error is then raised here, in the sweep's order). On success the new store and its index
        replace the old ones and the entries of their own are removed; `stored_entries` reads them back."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fresh = self.fresh | set(self.summarised)
        index: dict[str, list] = {}
        with (atomic_path(self.directory / STORE) as tmp, open(tmp, "wb") as out,
              _store(self.directory / STORE, self.index) as old):
            def entries() -> Iterator[dict[str, Any]]:
                for dataset_id, fit in fitted:
                    line = old(dataset_id) if dataset_id in self.in_store and dataset_id not in fresh else None
                    entry = json.loads(line) if line is not None else self.entry(dataset_id, fit)
                    index[dataset_id] = [entry.get("settings_key"), entry.get("fit_stamp"), entry.get("key"),
                                         out.tell()]
                    out.write((json.dumps({**entry, "dataset": dataset_id}) + "\n").encode())
                    yield entry

            yield entries()
        with atomic_path(self.directory / INDEX) as tmp:
            tmp.write_text(json.dumps(index))
        self._index = index
        for dataset_id in fresh:
            (self.directory / f"{dataset_id}.json").unlink(missing_ok=True)

    def stored_entries(self) -> Iterator[dict[str, Any]]:
        """The store's entries, in its order (`taking_in` wrote it: the order of the fitted datasets)."""
        with open(self.directory / STORE) as lines:
            for line in lines:
                yield json.loads(line)

    def _compute(self, dataset_id: str, path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The fit's entry (without key and digest) and the draws of its summarised variables."""
        posterior, sampler = read_fit(dataset_id, path)
        summarised = _selected(posterior, self.summary, "summary", dataset_id, path)
        scored = _selected(posterior, self.thresholds, "health", dataset_id, path)
        table = summarise_posterior(posterior, dataset_id, path, self.summary, [*summarised, *scored])
        columns = {"parameter": list(table.index), **{str(k): v.tolist() for k, v in table.items()}}
        entry = {"dataset": dataset_id, **sampler, "summarised": summarised, "scored": scored,
                 "table": columns, "layout": fit_layout(posterior[summarised]),
                 "attrs": {k: v if isinstance(v, str) else str(v) for k, v in plain_attrs(posterior.attrs).items()}}
        return entry, {name: posterior[name].values for name in summarised}


def summary_key(summary: SummarySettings, thresholds: HealthThresholds) -> str:
    """Digest of what a cached summary depends on besides the fit: settings, ArviZ's defaults and versions, this code.

    The health thresholds are not in it (health is scored from the cached table at every
    collect), the variables they select are.
    """
    parts = {
        "summary": [summary.var_names, summary.filter_vars, summary.interval_kind, summary.interval_prob],
        "health": [thresholds.var_names, thresholds.filter_vars],
        "ess_tail_prob": rcParams["stats.ci_prob"],
        "versions": {name: version(name) for name in ("arviz-stats", "arviz-base", "numpy", "xarray")},
        "code": _code_sha256(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# The code a fit's summary comes from: a change to how summaries are computed invalidates every cached one.
SUMMARY_CODE = ("outputs/summary_cache.py", "outputs/health.py", "outputs/fit_reader.py", "outputs/combined.py",
                "outputs/diagnostics.py", "outputs/intervals.py", "model/variables.py")


@functools.cache
def _code_sha256() -> str:
    """sha256 of batchfit's summary code (`SUMMARY_CODE`)."""
    return sources_digest(package_sources(*SUMMARY_CODE))


def summary_columns(summary: SummarySettings) -> list[str]:
    """summary.csv's columns; the interval's are named as ArviZ names them (``eti89_lb``, ``eti89_ub``).

    A row per parameter and nothing of the dataset but its id: a dataset's own columns are
    datasets.csv's (`batchfit.outputs.health.DATASET_COLUMNS`), joined on ``dataset``.
    """
    return [*ROW_COLUMNS, *stat_columns(summary)]


def stat_columns(summary: SummarySettings) -> list[str]:
    """The statistics of `summarise_posterior`, in the order of ``arviz_stats.summary(kind="all")``."""
    return [*intervals.column_names(summary.interval_kind, summary.interval_prob),
            "ess_bulk", "ess_tail", "r_hat", "mcse_mean", "mcse_sd"]


def summarise_posterior(
    posterior: xr.Dataset, dataset_id: str, path: str | Path, summary: SummarySettings | None = None,
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """ArviZ's summary of every element of the variables `names` (default all), indexed by label (``a[store_3]``).

    Columns: `stat_columns` (unrounded, as ``arviz_stats.summary(kind="all")`` computes them with
    ``ci_kind``/``ci_prob`` from `summary`; ess_tail at ArviZ's ``stats.ci_prob``, as there), and
    ``variable``, the variable each row belongs to. All elements are stacked and summarised
    in one vectorised pass: the interval by `batchfit.outputs.intervals`, the diagnostics by
    `batchfit.outputs.diagnostics` (arviz_stats' definitions, without its loop over elements).
    """
    summary = summary or SummarySettings()
    wanted = set(posterior.data_vars if names is None else names)
    names = [name for name in posterior.data_vars if name in wanted]
    if not names:
        return pd.DataFrame(columns=[*stat_columns(summary), "variable"], dtype=float)
    try:
        labels, owners, draws = stack_elements(posterior[names])
        flat = draws.reshape(draws.shape[0], -1)
        with np.errstate(divide="ignore", invalid="ignore"):  # constant variables give NaN r_hat
            values = [
                *intervals.mean_sd_interval(flat, summary.interval_kind, summary.interval_prob),
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


def _summary_rows(dataset_id: str, entry: Mapping[str, Any], columns: list[str]) -> list[list[str]]:
    """summary.csv rows for one fitted dataset: a row per summarised element (none when the fit has none,
    e.g. ``outputs.var_names`` kept only observation-sized deterministics)."""
    table = entry["table"]
    wanted = set(entry["summarised"])
    return [[_cell(dataset_id if c == "dataset" else table[c][i]) for c in columns]
            for i, variable in enumerate(table["variable"]) if variable in wanted]


def _cell(value: Any) -> str:
    """A CSV cell as pandas writes it: floats as their shortest repr, NaN as an empty cell."""
    if isinstance(value, float | np.floating):
        return "" if math.isnan(value) else repr(float(value))
    return str(value)


def dataset_health(fit_path: Path, thresholds: HealthThresholds) -> dict[str, Any]:
    """Health of one written fit: its diagnostics (`batchfit.outputs.health.DIAGNOSTICS`), status, reasons,
    and the rows and groups the fit recorded of its dataset.

    `status` is "warning" if any threshold is crossed, else "ok"; `reasons` says which, in
    words, for log lines. NaN diagnostics (e.g. a constant variable) are ignored.
    """
    fit_path = Path(fit_path)
    dataset_id = fit_path.stem
    posterior, sampler = read_fit(dataset_id, fit_path)
    scored = _selected(posterior, thresholds, "health", dataset_id, fit_path)
    table = summarise_posterior(posterior, dataset_id, fit_path, names=scored)
    rows = recorded_rows(posterior.attrs)
    health = score_health(*(table[column].to_numpy(float) for column in ("r_hat", "ess_bulk", "ess_tail")), sampler,
                          thresholds, rows)
    return {**health, "rows": rows, "groups": str(posterior.attrs.get("groups", ""))}


@contextlib.contextmanager
def _store(path: Path, index: Mapping[str, list]) -> Iterator[Callable[[str], str | None]]:
    """A function giving a dataset's line of the store at ``path`` (None without one), by the offset its index
    records."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        yield lambda dataset_id: None
        return

    def line_of(dataset_id: str) -> str | None:
        record = index.get(dataset_id)
        if not isinstance(record, list) or len(record) != 4:
            return None
        handle.seek(record[3])
        line = handle.readline().decode()
        try:
            return line if json.loads(line)["dataset"] == dataset_id else None
        except (ValueError, KeyError, TypeError):
            return None  # a damaged line: that dataset is summarised again

    with handle:
        yield line_of
