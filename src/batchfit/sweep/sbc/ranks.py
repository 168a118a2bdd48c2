"""SBC's verdict: each true value's rank among the posterior draws, and the ranks' uniformity."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import netCDF4
import numpy as np
import pandas as pd
import xarray as xr

from batchfit.common.atomic import atomic_path
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.errors import BatchfitError, ModelContractError
from batchfit.fitting.fit_register import settle
from batchfit.fitting.fitter import dataset_seed
from batchfit.fitting.provenance import expected_digests
from batchfit.model.variables import OBSERVATION_SIZED, ROLE_ATTR
from batchfit.outputs.fit_reader import group_dataset
from batchfit.records.failure import FailureRecord
from batchfit.records.simulation_truth import SimulationTruth
from batchfit.sweep.sbc.pit import Ranked, element_prob, pit_values, simultaneous_band
from batchfit.sweep.sbc.plots import plot_ranks
from batchfit.sweep.sbc.simulate import generator_file
from batchfit.sweep.sbc.sweep import RANKS_GROUP, sbc_config

log = logging.getLogger("batchfit")


@dataclass
class SBCResult:
    """Ranks of the fitted simulations, the uniformity test per parameter element, and the counts."""

    n_simulations: int
    fitted: list[str]
    failed: dict[str, str]
    n_draws: int
    table: Any  # uniformity.csv: parameter, n, outside_band, max_abs_ecdf_diff, pot_c_p_value
    envelope_prob: float

    @property
    def passed(self) -> bool:
        return not self.failed and not bool(self.table["outside_band"].any())

    def verdict(self) -> str:
        """One line: PASS, or FAIL with the parameters outside their band and the failed fits."""
        n_elements = len(self.table)
        outside = self.table.loc[self.table["outside_band"], "parameter"].tolist()
        parts = []
        if outside:
            parts.append(f"{len(outside)} of {n_elements} parameter element(s) have non-uniform ranks: "
                         f"{', '.join(outside[:8])}{', ...' if len(outside) > 8 else ''}")
        if self.failed:
            ids = sorted(self.failed)
            parts.append(f"{len(ids)} of {self.n_simulations} simulated fit(s) failed ({', '.join(ids[:5])}"
                         f"{', ...' if len(ids) > 5 else ''}; a failing fit biases SBC, see "
                         "sbc/failures/)")
        head = (f"SBC {'PASS' if not parts else 'FAIL'}: {len(self.fitted)} of {self.n_simulations} "
                f"simulations fitted, ranks among {self.n_draws} draws, {n_elements} parameter element(s), "
                f"{self.envelope_prob:.0%} simultaneous ECDF bands")
        return head + ("" if not parts else "; " + "; ".join(parts))


def rank_simulations(config: Config, *, plots: bool = True) -> SBCResult:
    """Rank, test and write SBC's outputs for the first ``sbc.n_simulations`` simulations.

    Every simulation must have a current fit or a failure record (run the fit stage first);
    a fit made from other data or settings than the current ones is an error, as in collect.
    """


    sweep = sbc_config(config)
    datasets = discover_datasets(sweep.data_sources)
    expected = expected_digests(sweep, datasets)
    register = settle(sweep.layout, datasets)  # the simulated fits are all done: the rule runs after them
    fitted, failed, missing = [], {}, []
    for sim in datasets:
        if register.failed(sim):
            failed[sim] = FailureRecord.read_of(sim, sweep.layout.failure(sim)).message or ""
        elif register.digest(sim) == expected[sim]:
            fitted.append(sim)
        else:
            missing.append(sim)
    if missing:
        raise BatchfitError(
            f"sbc: {len(missing)} simulation(s) have no current fit or failure record ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); run the fit stage first (batchfit sbc or snakemake sbc)")
    if not fitted:
        raise BatchfitError(f"sbc: every one of the {len(datasets)} simulated fits failed; see "
                            f"{sweep.layout.failures}")
    ranks, n_draws = _ranks(config, fitted)
    sbc = config.layout.sbc
    table = uniformity(ranks, n_draws, config.sbc.envelope_prob)
    long = _long_table(ranks, fitted, n_draws)
    with atomic_path(sbc.ranks_csv) as tmp:
        long.to_csv(tmp, index=False)
    with atomic_path(sbc.uniformity) as tmp:
        table.to_csv(tmp, index=False)
    tree = ranks_tree(ranks, fitted, n_draws, config)
    with atomic_path(sbc.ranks_nc) as tmp:
        tree.to_netcdf(tmp, engine="h5netcdf")
    result = SBCResult(len(datasets), fitted, failed, n_draws, table, config.sbc.envelope_prob)
    with atomic_path(sbc.verdict) as tmp:
        tmp.write_text(result.verdict() + "\n")
    with atomic_path(sbc.failed_simulations) as tmp:
        pd.DataFrame({"simulation": list(failed), "message": list(failed.values())}).to_csv(tmp, index=False)
    if plots:
        plot_ranks(ranks, n_draws, config.sbc.envelope_prob, len(table), sbc.plots)
    return result


def _ranks(config: Config, fitted: Sequence[str]) -> tuple[dict[str, np.ndarray], int]:
    """Per parameter, the ranks of the fitted simulations stacked as (simulation, *parameter shape)."""


    sweep = sbc_config(config)
    ranks: dict[str, list[np.ndarray]] = {}
    coords: dict[str, dict[str, Any]] = {}
    dims: dict[str, tuple[str, ...]] = {}
    n_draws = 0
    for sim in fitted:
        record = SimulationTruth.read(config.layout.sbc.truth(sim))
        truth, truth_coords = record.truth, record.coords
        with netCDF4.Dataset(sweep.layout.fit(sim)) as nc:
            nc.set_auto_mask(False)
            posterior = group_dataset(nc["posterior"]).isel(draw=slice(None, None, config.sbc.thin))
        rng = np.random.default_rng(dataset_seed(config.sbc.seed, f"ties:{sim}"))
        for name, var in posterior.data_vars.items():
            if var.attrs.get(ROLE_ATTR) == OBSERVATION_SIZED:
                continue  # per observation, not a parameter (its truth is not a draw from a prior)
            if name not in truth:
                raise ModelContractError(
                    f"the simulator ({generator_file(config)}) defines no variable {name!r}, "
                    f"which the fitted model has; truth file {config.layout.sbc.truth(sim)}")
            # (chain, draw, ...) -> (sample, ...), chain-major as xarray's stack; NumPy, since an
            # xarray stack per variable and simulation was a large part of this step
            values = var.transpose("chain", "draw", ...).values
            draws = values.reshape(-1, *values.shape[2:])
            true = np.asarray(truth[name], dtype=float)
            if true.shape != draws.shape[1:]:
                raise ModelContractError(
                    f"variable {name!r} has shape {true.shape} in the simulator but {draws.shape[1:]} in the "
                    f"fit of {sim} ({sweep.layout.fit(sim)})")
            dims[str(name)] = tuple(d for d in var.dims if d not in ("chain", "draw"))
            coords[str(name)] = {d: posterior[d].values for d in dims[str(name)] if d in posterior.coords}
            _check_labels(str(name), truth_coords.get(name, {}), coords[str(name)],
                          f"the simulator ({generator_file(config)})", f"the fit of {sim} ({sweep.layout.fit(sim)})")
            less = (draws < true).sum(axis=0)
            ties = (draws == true).sum(axis=0)  # discrete parameters: spread ties uniformly
            ranks.setdefault(str(name), []).append(less + rng.integers(0, ties + 1))
            n_draws = draws.shape[0]
    return {name: Ranked(np.stack(r), dims[name], coords[name]) for name, r in ranks.items()}, n_draws


def _check_labels(name: str, simulated: Mapping[str, Sequence[Any]], fitted: Mapping[str, Any],
                  simulator: str, fit: str) -> None:
    """A dimension of ``name`` that both the simulator and the fit label must have the same labels in
    the same order: otherwise a true value would be ranked among another element's draws."""
    for dim, labels in simulated.items():
        if dim not in fitted:
            continue
        drawn, fitted_labels = [str(v) for v in labels], [str(v) for v in fitted[dim]]
        if drawn != fitted_labels:
            raise ModelContractError(
                f"dimension {dim!r} of variable {name!r} has the labels {_some(drawn)} in {simulator} but "
                f"{_some(fitted_labels)} in {fit}: a true value would be ranked among another element's "
                f"draws; give both models the same coordinates")


def _some(labels: Sequence[str]) -> str:
    return "[" + ", ".join(labels[:6]) + (", ...]" if len(labels) > 6 else "]")


def element_ranks(name: str, ranked: Ranked) -> list[tuple[str, np.ndarray]]:
    """(label, ranks over simulations) for every scalar element: 'sigma', 'a[g01]'."""
    shape = ranked.values.shape[1:]
    if not shape:
        return [(name, ranked.values)]
    labels = [ranked.coords.get(d, range(n)) for d, n in zip(ranked.dims, shape, strict=True)]
    return [(f"{name}[{', '.join(map(str, combo))}]", ranked.values[(slice(None), *idx)])
            for idx, combo in zip(np.ndindex(*shape), itertools.product(*labels), strict=True)]


def uniformity(ranks: Mapping[str, Ranked], n_draws: int, envelope_prob: float) -> Any:
    """The uniformity test of every parameter element.

    ``outside_band``: the ECDF of the element's ranks leaves ArviZ's simultaneous band
    (`simultaneous_band`) at probability ``1 - (1 - envelope_prob) / K`` for K elements
    (Bonferroni), so a calibrated model passes all K together with probability at least
    ``envelope_prob``. ``pot_c_p_value`` is ArviZ's recommended pointwise-order test
    (`uniformity_test`, method pot_c), reported for reading, not used for the verdict.
    """
    import xarray as xr
    from arviz_stats.ecdf_utils import compute_ecdf

    elements = [e for name, ranked in ranks.items() for e in element_ranks(name, ranked)]
    n_sims = len(elements[0][1])
    x, lower, upper = simultaneous_band(n_sims, element_prob(envelope_prob, len(elements)))
    rows = []
    for label, values in elements:
        pit = pit_values(values, n_draws)
        ecdf = np.concatenate(([0.0], compute_ecdf(pit, x[1:-1]), [1.0]))
        p_value, _, _ = xr.DataArray(pit, dims=["simulation"]).azstats.uniformity_test(dim="simulation")
        rows.append({"parameter": label, "n": len(values),
                     "outside_band": bool(np.any((ecdf < lower) | (ecdf > upper))),
                     "max_abs_ecdf_diff": float(np.max(np.abs(ecdf - x))),
                     "pot_c_p_value": float(p_value)})
    return pd.DataFrame(rows)


def _long_table(ranks: Mapping[str, Ranked], fitted: Sequence[str], n_draws: int) -> Any:
    """ranks.csv: one row per simulation and parameter element."""

    parts = [pd.DataFrame({"simulation": list(fitted), "parameter": label, "rank": values.astype(int),
                           "n_draws": n_draws})
             for name, ranked in ranks.items() for label, values in element_ranks(name, ranked)]
    return pd.concat(parts, ignore_index=True)


def ranks_tree(ranks: Mapping[str, Ranked], fitted: Sequence[str], n_draws: int, config: Config) -> Any:
    """ranks.nc: group ``prior_sbc`` with dims (chain=1, draw=simulation, *parameter dims), as simuk
    writes it, so ``arviz_plots.plot_ecdf_pit(xr.open_datatree('ranks.nc'))`` reads it directly."""

    variables = {name: (("chain", "draw", *r.dims), r.values[None]) for name, r in ranks.items()}
    coords = {"chain": [0], "draw": list(fitted),
              **{d: v for r in ranks.values() for d, v in r.coords.items()}}
    group = xr.Dataset(variables, coords=coords)
    root = xr.Dataset(attrs={"n_draws": n_draws, "thin": config.sbc.thin, "seed": config.sbc.seed,
                             "n_simulations": config.sbc.n_simulations})
    return xr.DataTree.from_dict({"/": root, RANKS_GROUP: group})
