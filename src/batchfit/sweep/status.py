"""``batchfit status``: where a sweep stands, read from its files only.

Safe while a sweep runs, also from a cluster's login node: it reads the fits' provenance
sidecars, the failure records, the batch manifests and the fit logs, and writes nothing (the
coding and data-digest caches the plan keeps are read, not updated).
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchfit.common.grouping import grouped_lines
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.errors import DatasetError, RecordError
from batchfit.fitting.fit_register import FitRegister
from batchfit.fitting.provenance import expected_digests
from batchfit.records.failure import FailureRecord
from batchfit.records.manifest import BatchManifest
from batchfit.sweep.verdict import fitted_text
from batchfit.variants import configs_of, one_variant

FITTED, FAILED, PENDING = "fitted", "failed", "pending"


@dataclass(frozen=True)
class SweepStatus:
    """Every dataset's state (fitted, failed or pending) and an estimate of the fitting left."""

    states: dict[str, str]
    estimate: str
    fallbacks: dict[str, list[str]] = field(default_factory=dict)  # fitted off the cached path: why -> ids
    reasons: dict[str, str] = field(default_factory=dict)  # failed dataset -> why, without the dataset
    health: str = ""  # the fitted datasets' health as datasets.csv scores it (`verdict.fitted_text`), or ''

    def ids(self, state: str) -> list[str]:
        return [d for d, s in self.states.items() if s == state]

    def lines(self) -> list[str]:
        counts = {state: len(self.ids(state)) for state in (FITTED, PENDING, FAILED)}
        lines = [f"{len(self.states)} dataset(s): " + ", ".join(f"{n} {state}" for state, n in counts.items())]
        if self.health:
            lines.append(self.health)
        failed = self.ids(FAILED)
        if failed:  # one line per distinct reason
            lines += ["failed:", *(f"  {line}" for line in grouped_lines({d: self.reasons.get(d, "") for d in failed}))]
        if self.ids(PENDING):
            lines.append(f"{PENDING}: {_ids(self.ids(PENDING))}")
        if self.fallbacks:
            lines.append(f"fitted off batchfit's cached path: {sum(map(len, self.fallbacks.values()))} dataset(s)")
            lines += [f"  {len(ids)} because {why}: {_ids(ids)}" for why, ids in self.fallbacks.items()]
        return [*lines, f"time left: {self.estimate}"]


def _ids(ids: list[str]) -> str:
    return f"{', '.join(ids[:10])}{', ...' if len(ids) > 10 else ''}"


@dataclass(frozen=True)
class DatasetStatus:
    """One dataset's state, what it means (health, failure message or why it is pending), its log lines."""

    dataset: str
    state: str
    detail: str
    log: list[tuple[Path, str]] = field(default_factory=list)
    traceback: str = ""  # a failed dataset's: where the model's code failed

    def lines(self) -> list[str]:
        lines = [f"{self.dataset}: {self.state} ({self.detail})",
                 *(f"  {line}" for line in self.traceback.rstrip().splitlines())]
        if not self.log:
            return [*lines, "no fit log mentions it (results_dir/logs/fit/*.log)"]
        for path in dict.fromkeys(p for p, _ in self.log):
            lines += [f"{path}:", *(f"  {line}" for p, line in self.log if p == path)]
        return lines


def status_lines(config: Config, *, dataset: str | None = None, variant: str | None = None) -> list[str]:
    """``batchfit status``: the sweep's counts (`sweep_status`) or one dataset's state (`dataset_status`); in a
    sweep of variants, each variant's under its id (only ``variant``'s when given)."""
    configs = {variant: one_variant(config, variant)} if variant is not None else configs_of(config)
    lines = []
    for name, variant_config in configs.items():
        report = dataset_status(variant_config, dataset) if dataset else sweep_status(variant_config)
        lines += [f"variant {name} ({variant_config.results_dir}):", *(f"  {line}" for line in report.lines())] \
            if name is not None else report.lines()
    return lines


def sweep_status(config: Config) -> SweepStatus:
    """Count fitted, failed and pending datasets; estimate the time left for the pending ones."""
    found = _states(config)
    states = {d: state for d, (state, _) in found.items()}
    pending = sum(s == PENDING for s in states.values())
    current = [d for d, s in states.items() if s == FITTED]
    reasons = {d: _failure_message(config, d, reason=True) or "" for d, s in states.items() if s == FAILED}
    return SweepStatus(states, _estimate(config, pending, current), _fallbacks(config, current), reasons,
                       _health(config, current))


def _health(config: Config, fitted: list[str]) -> str:
    """The health of the ``fitted`` datasets datasets.csv has scored (those whose fit collect read: written
    before it), as the run's verdict counts it, and how many it has not scored yet."""
    collected_ns = _mtime_ns(config.layout.datasets_csv)
    if collected_ns is None or not fitted:
        return ""
    register = FitRegister.current(config.layout)  # each fit's modification time, without a file read per fit
    collected = {d for d in fitted if (register.fit_stamp(d) or (0, 0))[1] <= collected_ns}
    scored = fitted_text(config.layout.datasets_csv, collected)
    later = len(fitted) - len(collected)
    return "; ".join(filter(None, [f"{scored} ({config.layout.datasets_csv})" if scored else "",
                                   f"{later} fitted since collect last ran, not scored yet" if later else ""]))


def dataset_status(config: Config, dataset_id: str) -> DatasetStatus:
    """One dataset's state in detail, with the fit log lines that mention it."""
    states = _states(config)
    if dataset_id not in states:
        raise DatasetError(f"not among the datasets of config {config.source} ({len(states)} dataset(s): "
                           f"{', '.join(list(states)[:5])}{', ...' if len(states) > 5 else ''})", dataset=dataset_id)
    state, detail = states[dataset_id]
    if state == FITTED:
        from batchfit.outputs.summary_cache import dataset_health  # xarray, netCDF4, ArviZ: to show a fit's health

        health = dataset_health(config.layout.fit(dataset_id), config.health)
        size = [] if health["rows"] is None else [f"{health['rows']} rows" + (f", {health['groups']}"
                                                                              if health["groups"] else "")]
        detail = "; ".join([health["status"], *size, *health["reasons"]])
    trace = _failure_traceback(config, dataset_id) if state == FAILED else ""
    return DatasetStatus(dataset_id, state, detail, log_lines(config, dataset_id), trace)


def _states(config: Config) -> dict[str, tuple[str, str]]:
    """Each dataset's state and a short reason, in id order."""

    datasets = discover_datasets(config.data_sources)
    expected = expected_digests(config, datasets, record=False)
    register = FitRegister.current(config.layout)
    states = {}
    for d in datasets:
        recorded = register.digest(d)
        failure = _failure_message(config, d) if register.failed(d) else None
        if recorded == expected[d]:
            states[d] = (FITTED, "its fit has the config's provenance")
        elif failure is not None:
            states[d] = (FAILED, failure)
        elif recorded is None:
            states[d] = (PENDING, "never fitted")
        else:
            states[d] = (PENDING, "its fit's provenance differs from the config's (the sampler or outputs settings, "
                         "the model, the data file, the coding of a text column or a library changed): refitted "
                         "by the next run")
    return states


def _failure_message(config: Config, dataset_id: str, *, reason: bool = False) -> str | None:
    """A failed dataset's stage and message (its record's reason, without the dataset, if ``reason``);
    None without a failure record."""
    try:
        record = FailureRecord.read(config.layout.failure(dataset_id))
    except FileNotFoundError:
        return None
    except (OSError, RecordError) as exc:
        return str(exc)
    return f"at {record.stage}: {record.why if reason else record.message}"


def _failure_traceback(config: Config, dataset_id: str) -> str:
    """The traceback a failure record keeps (the model's own frames, or batchfit's bug's), '' if none."""
    try:
        return FailureRecord.read(config.layout.failure(dataset_id)).traceback
    except (OSError, RecordError):
        return ""


def _estimate(config: Config, pending: int, fitted: list[str]) -> str:
    """Time left for ``pending`` datasets: at the latest sweep's pace, else from the timed fits.

    The sweep's main process writes plan.json when it starts; fits written since then give its
    pace (parallel jobs included). Before any of them, the batch manifests' median seconds per fit.
    """
    if not pending:
        return "none, nothing is pending"
    started = _mtime_ns(config.layout.plan) or 0
    register = FitRegister.current(config.layout)
    written = (register.fit_stamp(d) for d in fitted)
    since = sorted(t for t in (stamp[1] for stamp in written if stamp) if started and t > started)
    if since:
        per_fit = (since[-1] - started) / 1e9 / len(since)
        clock = time.strftime("%H:%M:%S", time.localtime(started / 1e9))
        return (f"about {_duration(per_fit * pending)} for {pending} pending dataset(s) at the pace of the latest "
                f"sweep ({len(since)} fit(s) in {_duration((since[-1] - started) / 1e9)} since it started at {clock})")
    seconds = _timed_fits(config)
    if not seconds:
        return f"unknown for {pending} pending dataset(s): no fit has been timed yet (batch manifests)"
    median = statistics.median(seconds)
    return (f"about {_duration(median * pending)} of fitting for {pending} pending dataset(s) in one job "
            f"({median:.2f} s per dataset, the median of {len(seconds)} fit(s) in the batch manifests); "
            "jobs running side by side divide it")


def _fallbacks(config: Config, fitted: list[str]) -> dict[str, list[str]]:
    """Why each of ``fitted`` that was not sampled on the cached path was not, from the batch
    manifests (the newest outcome of a dataset counts)."""
    latest: dict[str, str] = {}
    for path in sorted(config.layout.batches.glob("*.json"), key=lambda p: _mtime_ns(p) or 0):
        try:
            outcomes = BatchManifest.read(path).datasets
        except (OSError, RecordError):
            continue  # a manifest being written, or damaged: the others suffice
        latest.update({d: o.fallback for d, o in outcomes.items() if o.status == "ok"})
    found: dict[str, list[str]] = {}
    for dataset_id in fitted:
        if latest.get(dataset_id):
            found.setdefault(latest[dataset_id], []).append(dataset_id)
    return found


def _timed_fits(config: Config) -> list[float]:
    """Seconds of every successful fit recorded in the batch manifests."""
    seconds = []
    for path in config.layout.batches.glob("*.json"):
        try:
            outcomes = BatchManifest.read(path).datasets.values()
        except (OSError, RecordError):
            continue  # a manifest being written, or damaged: the others suffice
        seconds += [float(o.seconds) for o in outcomes if o.status == "ok"]
    return seconds


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def log_lines(config: Config, dataset_id: str) -> list[tuple[Path, str]]:
    """The lines of the fit logs that name ``dataset_id`` (each log's header lists its batch's datasets)."""
    word = re.compile(rf"(?<![\w.-]){re.escape(dataset_id)}(?![\w.-])")
    logs = sorted(config.layout.fit_logs.glob("*.log"), key=lambda p: _mtime_ns(p) or 0)
    found = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        found += [(path, line) for line in text.splitlines() if word.search(line)]
    return found
