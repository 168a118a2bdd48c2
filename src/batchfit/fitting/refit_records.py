"""The refits' files: the plan the compare rule's jobs share, each refit's record, a refit job's manifest.

Light on purpose: the workflow reads the plan while Snakemake parses (which refit jobs exist), and the
compare rule reads the refits' results, so this module imports nothing of the fitting stage
(`batchfit.fitting.refits` runs the refits).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from batchfit.config import Config
from batchfit.errors import BatchfitError
from batchfit.records.json_record import JsonRecord

RELOO, KFOLD, PSIS = "reloo", "kfold", "psis"  # comparison.csv's methods: the refits' two, and none
HELD_OUT_DIM = "row"  # a refit result's observation dimension: the held-out rows, by their index


@dataclass(frozen=True)
class Refit:
    """One refit: of which variant's fit of which dataset, for which method, without which rows."""

    variant: str
    dataset: str
    method: str  # RELOO or KFOLD
    id: str  # e.g. reloo-17 (row 17 held out), kfold-3-of-10
    rows: tuple[int, ...]  # the held-out rows, ascending (0-based, in the dataset's order)
    fit_digest: str  # the provenance digest of the fit it refits
    structure: str  # that fit's model structure, which the refit must build too

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "rows": list(self.rows)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Refit:
        return cls(**{**data, "rows": tuple(int(r) for r in data["rows"])})


@dataclass(frozen=True)
class RefitPlan(JsonRecord):
    """What the compare rule needs: each compared dataset's method (`RELOO`, `KFOLD` or `PSIS` for all its
    variants), why PSIS where an exact method was asked for, every refit, and the pending ones in batches."""

    KIND = "refit plan"
    VERSION = 1
    REMEDY = "delete it, and the refits are planned again"

    methods: dict[str, str]
    notes: dict[str, str]
    refits: list[Refit]
    batches: dict[str, list[Refit]]  # batch id -> pending refits, of one variant each

    def to_fields(self) -> dict[str, Any]:
        return {"methods": self.methods, "notes": self.notes, "refits": [r.to_json() for r in self.refits],
                "batches": {b: [r.to_json() for r in rs] for b, rs in self.batches.items()}}

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        return cls(dict(fields["methods"]), dict(fields["notes"]), [Refit.from_json(r) for r in fields["refits"]],
                   {b: [Refit.from_json(r) for r in rs] for b, rs in fields["batches"].items()})

    def folds(self, dataset_id: str) -> np.ndarray:
        """The fold (1 to k) of each row of a K-fold dataset, from its refits (every variant has the same)."""
        own = [r for r in self.refits if r.dataset == dataset_id and r.method == KFOLD]
        own = [r for r in own if r.variant == own[0].variant]
        folds = np.zeros(sum(len(r.rows) for r in own), dtype=int)
        for fold, refit in enumerate(own, start=1):
            folds[list(refit.rows)] = fold
        return folds

    def batch_variant(self, batch_id: str) -> str:
        """The variant whose refits batch ``batch_id`` holds; an unknown batch is an error naming the plan."""
        try:
            return self.batches[batch_id][0].variant
        except (KeyError, IndexError):
            raise BatchfitError(f"refit batch {batch_id} is not in the refit plan") from None


@dataclass
class RefitOutcome:
    """What happened to one refit of a batch."""

    status: str  # "ok" or "failed"
    seconds: float
    message: str = ""
    sampler_path: str = ""
    divergences: int = 0


@dataclass(frozen=True)
class RefitManifest(JsonRecord):
    """A refit job's declared output: its batch, variant and compile line, and each refit's outcome by
    ``{dataset}/{refit id}``."""

    KIND = "refit manifest"
    VERSION = 1
    REMEDY = "delete it, and its refit job runs again"

    batch: str
    variant: str
    compile: str
    refits: dict[str, RefitOutcome]

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Self:
        return cls(fields["batch"], fields["variant"], fields["compile"],
                   {key: RefitOutcome(**o) for key, o in fields["refits"].items()})


def refit_done(config: Config, refit: Refit) -> bool:
    """Whether ``refit``'s result exists for its fit and rows (a result of another fit or rows is not its)."""
    path = config.layout.refit(refit.dataset, refit.id)
    if not path.exists():
        return False
    import netCDF4

    try:
        with netCDF4.Dataset(path) as nc:
            return (nc.getncattr("fit_digest") == refit.fit_digest
                    and json.loads(nc.getncattr("rows")) == list(refit.rows))
    except (OSError, KeyError, AttributeError, ValueError):
        return False  # a damaged or older file: refitted


def read_refit(config: Config, refit: Refit) -> Any:
    """A done refit's held-out pointwise log-likelihood: an xarray DataArray (chain, draw, `HELD_OUT_DIM`)."""
    import xarray as xr

    if not refit_done(config, refit):
        raise BatchfitError(f"refit {refit.id} of dataset '{refit.dataset}' (variant {refit.variant}) has no result "
                            f"for its fit and rows at {config.layout.refit(refit.dataset, refit.id)}: run the refits "
                            "again (snakemake, or batchfit compare)")
    with xr.open_dataset(config.layout.refit(refit.dataset, refit.id), engine="netcdf4") as ds:
        return ds["log_likelihood"].load()
