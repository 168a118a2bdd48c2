"""Fit a batch of datasets with one compiled model: load, check, build, sample, write, per dataset.

A dataset that fails at any stage is recorded in ``failures/{id}.json`` and, with ``on_error:
continue``, the batch goes on. While one dataset samples (in nutpie's threads, outside the GIL),
the main thread finishes the one before and prepares the next; with more threads than chains,
helper processes fit datasets of the batch beside it (`batchfit.fitting.lane_pool`).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchfit.common import collector
from batchfit.common.atomic import remove_stale_temporaries
from batchfit.compat.nutpie import wait_for_sampler_threads
from batchfit.compile.structures import Structure
from batchfit.config import Config
from batchfit.data.dataset import Dataset
from batchfit.data.discovery import source_of
from batchfit.errors import (
    BatchfitError,
    DatasetError,
    ModelCodeError,
    is_expected,
    one_line,
    reason_of,
)
from batchfit.fitting.fit_register import touching
from batchfit.fitting.fitter import Fitter, Sampling, prepare
from batchfit.fitting.job_inputs import SHARED, JobInputs
from batchfit.fitting.lane_pool import LANE_STAGE, lanes
from batchfit.fitting.netcdf_writer import write_fit
from batchfit.fitting.outcome import BatchReport, format_groups, hint, record_failed, write_manifest
from batchfit.fitting.provenance import Provenance, record
from batchfit.fitting.sampler_health import sampler_reasons
from batchfit.records import fit_attributes
from batchfit.records.manifest import Outcome

log = logging.getLogger("batchfit")


def fit_batch(config: Config, dataset_ids: Sequence[str], *, batch_id: str, threads: int = 1,
              inputs: JobInputs = SHARED) -> BatchReport:
    """Fit ``dataset_ids`` with one compile; write fits, failures and the manifest.

    ``inputs``: what the job was given besides the config (`batchfit.fitting.job_inputs`).

    With more threads than the sampler's chains, helper processes fit datasets of the batch
    beside this one (`batchfit.fitting.lane_pool`). With ``on_error: stop`` the first failure (in the batch's
    order) is raised after the manifest is written; with ``continue`` it is recorded and the batch
    goes on. Already written fits are never removed.
    """
    # The datasets first, so that a dataset's log lines (each starts with its id) are found by
    # `batchfit status --dataset` and by grep.
    log.info("%s holds %d dataset(s): %s", batch_id, len(dataset_ids), " ".join(dataset_ids))
    touching(config.layout, batch_id, dataset_ids)  # before any of their files changes: the register reads them
    owned = (path for d in dataset_ids for path in (config.layout.fit(d), config.layout.failure(d)))
    stale = remove_stale_temporaries(owned)  # before any lane starts writing its own
    if stale:
        log.info("removed %d temporary file(s) left by a killed job, e.g. %s", len(stale), stale[0])
    # the helpers start first: their start overlaps ours
    with lanes(config, dataset_ids, threads=threads, inputs=inputs) as job_lanes:
        cache, reader, ref = prepare(config, inputs, wanted=dataset_ids)
        fitter = Fitter(config, ref, cache, compile_workers=threads)
        collector.resume()  # the imports, the reference model and the compiled function live to the end
        log.info("compile: %s", fitter.compile_line)
        report = BatchReport(batch_id, fitter.compile_line)
        progress = Progress(len(dataset_ids))
        own = fit_datasets(fitter, job_lanes.claims, threads=job_lanes.threads_each)
        try:
            for outcome in in_batch_order(job_lanes.outcomes(own)):
                if outcome.stage == LANE_STAGE:  # its lane died with it: nobody else records it
                    record_failed(config, outcome, source_of(reader.index, outcome.dataset))
                report.outcomes.append(outcome)
                log.info("%s", outcome_line(outcome))
                progress.done_one()
                if outcome.status == "failed" and config.on_error == "stop":
                    raise BatchfitError(f"dataset '{outcome.dataset}' failed at {outcome.stage}: {outcome.message}")
        finally:  # the helpers are ended on leaving `lanes`; this lane's sample is cancelled by `own`'s own finally
            own.close()
            write_manifest(config, report)
    log.info("%s", batch_line(report))
    return report


def outcome_line(outcome: Outcome) -> str:
    """A dataset's line in the fit log: ``theoph_08: fitted in 0.70 s, sampler warning: 1 divergences > 0``.

    A fitted dataset is not called ``ok``: its health is collect's to score (R-hat and ESS need a
    summary), and datasets.csv may mark it ``warning``. What the sampler's statistics decide is
    said here, in datasets.csv's words (`batchfit.fitting.sampler_health`).
    """
    if outcome.status == "failed":
        return f"{outcome.dataset}: failed in {outcome.seconds:.2f} s ({outcome.stage}: {outcome.message})"
    warned = f", sampler warning: {'; '.join(outcome.warnings)}" if outcome.warnings else ""
    return f"{outcome.dataset}: fitted in {outcome.seconds:.2f} s{warned}"


def batch_line(report: BatchReport) -> str:
    """The fit log's last line: the batch's fitted and failed datasets, and what is left to collect."""
    fitted = [o for o in report.outcomes if o.status != "failed"]
    warned = sum(bool(o.warnings) for o in fitted)
    return (f"{report.batch}: {len(fitted)} fitted ({warned} with a sampler warning), {report.n_failed} failed; "
            "collect scores every fit's health (R-hat, ESS and the sampler's) into datasets.csv")


def in_batch_order(outcomes: Iterable[tuple[int, Outcome]]) -> Iterator[Outcome]:
    """Outcomes that come as lanes finish them, in the batch's order (so ``on_error: stop`` stops
    where a sequential fit would, and the manifest lists the batch as given)."""
    waiting: dict[int, Outcome] = {}
    following = 0
    for index, outcome in outcomes:
        waiting[index] = outcome
        while following in waiting:
            yield waiting.pop(following)
            following += 1


# How often the main thread looks whether a sample has finished: short against even the tiniest
# sample and long enough to leave the cores to the chains.
_POLL_SECONDS = 0.002


@dataclass
class DatasetFit:
    """One dataset on its way through a batch: what is known of it so far, and the stage it is at."""

    id: str
    path: Path | None  # its file as the sweep knows it (`source_of`), in messages and records
    started: float = field(default_factory=time.perf_counter)
    stage: str = "load"
    provenance: Provenance | None = None
    dataset: Dataset | None = None
    model: Any = None
    structure: Structure | None = None
    sampling: Sampling | None = None


def fit_datasets(fitter: Fitter, claims: Iterable[tuple[int, str]], *,
                 threads: int) -> Iterator[tuple[int, Outcome]]:
    """Fit the claimed (position, dataset id) pairs one sample at a time; yield (position, Outcome) as each ends.

    nutpie samples in its own threads, outside the GIL. So while a dataset samples, this thread
    finishes the one before (optional outputs, writing) and prepares the next (load, check,
    build, sampler model), claiming it only then: another lane may take it first
    (`batchfit.fitting.lane_pool.Claims`). A dataset's draws depend only on its data and seed.
    """
    running: tuple[int, DatasetFit] | None = None
    try:
        for index, dataset_id in claims:
            prepared = _prepare(fitter, dataset_id)  # while `running` samples
            if isinstance(prepared, Outcome):
                yield index, prepared
                continue
            finished = running
            if finished is not None:
                while not finished[1].sampling.finished:
                    time.sleep(_POLL_SECONDS)
            fitter.start(prepared.sampling, threads=threads)
            running = index, prepared
            if finished is not None:  # finished while the next one samples
                yield finished[0], _complete(fitter, finished[1], threads=threads)
        if running is not None:
            finished, running = running, None
            yield finished[0], _complete(fitter, finished[1], threads=threads)
    finally:  # with a sample running only when the caller stops (on_error: stop, or an interrupt)
        if running is not None:
            running[1].sampling.cancel()
        after_sampling()


def after_sampling() -> None:
    """Wait until no nutpie chain thread of this process is left, once none of its samples is wanted.

    A failed sample's chain threads may still be winding down, and a process that exits under
    them dies (see `compat.wait_for_sampler_threads`). Only called when no sampler is running:
    the threads of a sampler whose result nobody takes do not end, so waiting while other
    datasets sample ran into the minute's timeout after every failed sample.
    """
    if not wait_for_sampler_threads():
        log.warning("nutpie's chain threads did not end within a minute after sampling")


def _prepare(fitter: Fitter, dataset_id: str) -> DatasetFit | Outcome:
    """Load, check and build one dataset and make its sampler model; a failure becomes its Outcome."""
    reader = fitter.ref.reader
    job = DatasetFit(dataset_id, source_of(reader.index, dataset_id))
    try:
        if dataset_id not in reader.index:
            raise BatchfitError(f"dataset '{dataset_id}' is not among the config's datasets")
        job.provenance = fitter.provenance(dataset_id)
        job.dataset = reader.load(dataset_id)
        job.stage = "build"
        job.model = fitter.build(job.dataset)
        job.stage = "compile"
        job.structure = fitter.structure(job.model, job.dataset)
        if job.structure.error is not None:
            raise RuntimeError(f"compiling model structure {job.structure.id[:12]} failed: "
                               f"{one_line(job.structure.error)}") from job.structure.error
        job.stage = "sample"
        job.sampling = fitter.sampling(job.model, job.dataset, job.structure)
    except Exception as exc:  # noqa: BLE001 - isolate the dataset; the failure record says what to fix
        return _failed(fitter.config, job, exc)
    return job


def _complete(fitter: Fitter, job: DatasetFit, *, threads: int) -> Outcome:
    """Take a started dataset's sample, add its outputs and write its fit; a failure becomes its Outcome."""
    config = fitter.config
    try:
        tree, path, fallback = fitter.draws(job.sampling, job.model, job.dataset, job.structure, threads=threads)
        tree = fitter.finish(tree, job.model, job.dataset, job.structure, job.sampling.seed, job.provenance, path,
                             fallback)
        warnings = sampler_reasons(tree["sample_stats"].to_dataset(), config.health, job.dataset.n_rows)
        job.stage = "write"
        # What datasets.csv shows of the dataset and its fit (`batchfit.outputs.health.fitted_row`)
        tree.attrs.update({fit_attributes.ROWS: job.dataset.n_rows, "groups": format_groups(job.dataset.groups),
                           "dropped_where": job.dataset.dropped.where, "dropped_missing": job.dataset.dropped.missing,
                           "wall_seconds": round(time.perf_counter() - job.started, 3),
                           fit_attributes.SOURCE: str(job.path)})
        # The sidecar goes first and comes back last: a job killed in between leaves a fit
        # without one (the plan then reads the fit itself), never a sidecar of another fit.
        config.layout.sidecar(job.id).unlink(missing_ok=True)
        write_fit(tree, config.layout.fit(job.id))
        record(config, job.id, job.provenance)
    except Exception as exc:  # noqa: BLE001 - as in `_prepare`
        return _failed(config, job, exc)
    config.layout.failure(job.id).unlink(missing_ok=True)
    return Outcome(job.id, "ok", time.perf_counter() - job.started, fallback=tree.attrs[fit_attributes.FALLBACK],
                   warnings=warnings)


# The reasons of the model errors whose full traceback this process has logged: once each is enough.
_LOGGED: set[str] = set()


def _failed(config: Config, job: DatasetFit, exc: Exception) -> Outcome:
    """Record a dataset's failure (and drop its stale fit); the Outcome names the stage and the fix.

    An unexpected exception (`errors.is_expected`) is batchfit's bug: logged at ERROR with its
    traceback, which its failure record keeps too, never retried another way. An error of the
    model's own code (`ModelCodeError`) records the model's frames (`batchfit.model.user_traceback`);
    the log has its full traceback, once per distinct error.
    """
    if isinstance(exc, DatasetError):
        exc = exc.naming(job.path)  # a staged copy's error names the sweep's file
    message = one_line(exc)
    trace = ""
    if isinstance(exc, ModelCodeError):
        trace = exc.user_traceback
        if exc.reason not in _LOGGED:
            _LOGGED.add(exc.reason)
            log.warning("%s: the model's code failed at %s; its whole traceback (the record keeps the model's "
                        "frames):\n%s", job.id, job.stage, exc.full_traceback)
    elif not is_expected(exc):
        trace = "".join(traceback.format_exception(exc))
        log.error("%s: batchfit failed at %s, a bug to report with this traceback:\n%s", job.id, job.stage, trace)
    if isinstance(exc, BatchfitError):
        reason = reason_of(exc, job.id, job.path)
    else:  # e.g. nutpie's or h5py's own words: add whose and where
        reason = f"{job.stage} failed: {message}{hint(message)}"
        message = (f"{job.stage} failed for dataset '{job.id}' (file {job.path}): "
                   f"{message}{hint(message)}")
    loaded = job.dataset
    outcome = Outcome(job.id, "failed", time.perf_counter() - job.started, job.stage, type(exc).__name__, message,
                      trace, reason=reason, rows=loaded.n_rows if loaded is not None else None,
                      groups=format_groups(loaded.groups) if loaded is not None else "",
                      dropped_where=loaded.dropped.where if loaded is not None else None,
                      dropped_missing=loaded.dropped.missing if loaded is not None else None)
    record_failed(config, outcome, job.path)
    return outcome


class Progress:
    """Logs ``progress: D/T datasets, R/s, ETA S s`` every ``seconds`` or every tenth of the batch.

    One line a dataset would drown a long batch's log; one at the end says nothing while it runs.
    """

    def __init__(self, total: int, *, seconds: float = 10.0):
        self.total = total
        self.done = 0
        self.seconds = seconds
        self.every = max(1, total // 10)
        self.start = self.last = time.perf_counter()
        self.last_done = 0

    def done_one(self) -> None:
        """Count a finished dataset (fitted or failed); log when the interval is up or the batch is done."""
        self.done += 1
        now = time.perf_counter()
        if self.done < self.total and now - self.last < self.seconds and self.done - self.last_done < self.every:
            return
        rate = self.done / max(now - self.start, 1e-9)
        log.info("progress: %d/%d datasets, %.2f/s, ETA %.0f s", self.done, self.total, rate,
                 (self.total - self.done) / rate)
        self.last, self.last_done = now, self.done
