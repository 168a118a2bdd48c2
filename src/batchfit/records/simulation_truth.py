"""An SBC simulation's truth record, ``sbc/truth/{id}.json``: the parameter values its data were drawn from.

Written last by the simulation (`batchfit.sweep.sbc.simulate`: a killed run leaves the simulation to redo),
which also reads it to tell whether a simulation is up to date; read by the ranking
(`batchfit.sweep.sbc.ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchfit.records.json_record import JsonRecord


@dataclass(frozen=True)
class SimulationTruth(JsonRecord):
    """A simulation's id and inputs' digest, the sha256 of the data file it wrote, the generator model and the
    template dataset, and each parameter's true value (nested lists) with its dimensions' coordinates."""

    KIND = "simulation truth"
    VERSION = 1
    REMEDY = "delete it, and the next SBC run draws the simulation again"

    simulation: str
    digest: str
    data_sha256: str
    generator: str
    template: str
    truth: dict[str, Any]
    coords: dict[str, Any]
