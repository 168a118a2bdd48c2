"""A fit rule's job, with a shared filesystem or without one (docs/cluster.md).

With one, a job reads the data and the label registry where the config says and writes each fit
into ``results_dir``, so a retried job fits only what a killed attempt left. Without one (Snakemake's
``--shared-fs-usage none`` and a storage plugin) a job sees only its declared inputs and keeps only
its declared outputs: the submitting machine stages what it reads (`stage_fit_job`), and it writes
a results directory of its own, which collect adopts (`batchfit.outputs.adopt`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from batchfit.config import Config
from batchfit.errors import BatchfitError
from batchfit.fitting.batch import fit_batch
from batchfit.fitting.job_inputs import JobInputs, stage_inputs
from batchfit.fitting.outcome import BatchReport
from batchfit.records.compile_stamp import CompileStamp
from batchfit.sweep.plan import still_pending, sweep_plan


def run_fit_job(config: Config, batch: str, *, threads: int, bundle: Path, datasets: Sequence[str] = (),
                staged: Path | None = None, outputs: Path | None = None) -> BatchReport:
    """Fit the batch ``batch``: the planned ``datasets`` still pending, or with ``staged`` inputs the
    staged ones, writing into ``outputs`` (the job's own results directory, where the storage plugin
    puts the rule's output) instead of ``results_dir``; the two come together."""
    if (staged is None) != (outputs is None):
        raise TypeError("run_fit_job takes staged inputs and an output directory together, or neither")
    if staged is None:
        return fit_batch(config, still_pending(config, datasets), batch_id=batch, threads=threads,
                         inputs=JobInputs(bundle))
    inputs = JobInputs(bundle, staged)
    own = dataclasses.replace(config, results_dir=Path(outputs))
    return fit_batch(own, inputs.members(), batch_id=batch, threads=threads, inputs=inputs)


def stage_fit_job(config: Config, batch: str, stamp: Path, directory: Path) -> None:
    """Stage what the fit job of ``batch`` reads into ``directory`` (on the submitting machine, which sees
    the data): its datasets and the reference dataset the compile stage recorded in ``stamp``."""
    plan = sweep_plan(config, job=True)  # the one this run recorded
    if batch not in plan.batches:
        raise BatchfitError(f"batch {batch} is not in the sweep's plan ({config.layout.plan})")
    reference = CompileStamp.read(stamp).reference_dataset
    stage_inputs(config, plan.datasets, plan.batches[batch], reference, directory)
