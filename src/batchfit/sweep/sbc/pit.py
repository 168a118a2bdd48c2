"""Ranks as probability integral transforms, and the simultaneous band their ECDF stays in (Säilynoja et al. 2022)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("batchfit")


@dataclass(frozen=True)
class Ranked:
    """One parameter's ranks, shaped (simulation, *parameter shape), with its dims and coordinate labels."""

    values: np.ndarray
    dims: tuple[str, ...]
    coords: Mapping[str, Any]


def pit_values(ranks: np.ndarray, n_draws: int) -> np.ndarray:
    """Ranks 0..L as values in (0, 1), the centre of each rank's bin: what the ECDF test reads."""
    return (np.asarray(ranks, dtype=float) + 0.5) / (n_draws + 1)


@functools.cache
def simultaneous_band(n: int, prob: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evaluation points and the simultaneous ``prob`` band of the ECDF of ``n`` uniform values.

    ArviZ's `ecdf_pit` (Säilynoja et al. 2022); the band depends only on ``n`` and ``prob``, so
    it is computed once for every element (the values passed are not used for the band). Its
    simulation count grows with ``prob`` so the extreme quantile is estimated from ~20 draws
    beyond it; its generator has a fixed seed, so the band is reproducible.
    """
    from arviz_stats.ecdf_utils import ecdf_pit

    n_simulations = int(min(20000, max(1000, np.ceil(20 / (1 - prob)))))
    x, _, lower, upper = ecdf_pit(np.linspace(0, 1, n), prob, n_simulations=n_simulations)
    return x, lower, upper


def element_prob(envelope_prob: float, n_elements: int) -> float:
    return 1 - (1 - envelope_prob) / max(1, n_elements)
