"""What a predict job reads besides the config: the datasets, their fits and new-data files, and the bundle.

With a shared filesystem a job reads them where the sweep keeps them. Without one (docs/cluster.md) the
submitting machine stages a directory per job (`stage_predict_inputs`): what a fit job would read for the
same datasets (`batchfit.fitting.job_inputs.stage_inputs`: the data files, the reference dataset's, the
label registry), plus the fits and the new data of its datasets (files, or the rows of their table groups:
`batchfit.fitting.job_inputs.stage_sources`), and what the plan expects of each.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from batchfit.config import Config
from batchfit.data.discovery import DatasetIndex
from batchfit.data.labels import Coding
from batchfit.fitting.job_inputs import JobInputs, link_or_copy, read_staged, stage_inputs, stage_sources, staged_index
from batchfit.predictions.new_data import new_data_files

_MANIFEST = "predict.json"
_FITS = "fits"
_NEW = "new"


@dataclass(frozen=True)
class Expected:
    """What the plan expects of a dataset's prediction: its digest, and the digest of the fit it is made from."""

    prediction: str
    fit: str


@dataclass(frozen=True)
class PredictInputs:
    """A predict job's inputs beyond the config: the compiled bundle, and its staged directory (None: the
    sweep's own files)."""

    bundle: Path | None = None
    staged: Path | None = None

    @property
    def job(self) -> JobInputs:
        return JobInputs(self.bundle, self.staged)

    def datasets(self, config: Config) -> Mapping[str, Path]:
        return self.job.datasets(config)

    def coding(self, config: Config, paths: Mapping[str, Path]) -> Coding:
        return self.job.coding(config, paths)

    def fit(self, config: Config, dataset_id: str) -> Path:
        """The fit of ``dataset_id`` this job reads."""
        return config.layout.fit(dataset_id) if self.staged is None else self.staged / _FITS / f"{dataset_id}.nc"

    def new_files(self, config: Config) -> DatasetIndex:
        """The new-data files (``predict.data``) by dataset id: the sweep's, or the staged copies."""
        if self.staged is None:
            return new_data_files(config)
        return staged_index(self.staged, self._manifest["new"])

    def expected(self) -> dict[str, Expected]:
        """The staged datasets and what the plan expects of each."""
        return {d: Expected(*pair) for d, pair in self._manifest["expected"].items()}

    @cached_property
    def _manifest(self) -> dict:
        assert self.staged is not None
        return read_staged(self.staged / _MANIFEST)


# A job that reads the sweep's own files, and has no compiled bundle.
OWN_FILES = PredictInputs()


def stage_predict_inputs(config: Config, datasets: Mapping[str, Path], expected: Mapping[str, Expected],
                         reference: str | None, directory: Path) -> None:
    """Write ``directory``: what the predict job of the datasets ``expected`` reads (module docstring)."""
    members = [d for d in expected if d in datasets]
    stage_inputs(config, datasets, members, reference, directory)
    for dataset_id in expected:
        fit = config.layout.fit(dataset_id)
        if fit.exists():
            link_or_copy(fit, directory / _FITS / f"{dataset_id}.nc")
    files = new_data_files(config)
    new = stage_sources(config, files, [d for d in expected if d in files], directory, _NEW)
    manifest = {"expected": {d: [e.prediction, e.fit] for d, e in expected.items()}, "new": new}
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=1))

