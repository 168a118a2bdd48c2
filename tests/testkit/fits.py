"""Fitting simulated datasets of the bundled hierarchical model in the test process: the datasets, a config for
them, and reading and comparing the fits' groups (test_fit, test_lanes, test_fallbacks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from batchfit.config import config_from_dict
from testkit import HIERARCHICAL

SAMPLER = {"draws": 100, "tune": 100, "chains": 2, "seed": 2026}


def write_datasets(out_dir: Path, indices: range | list[int], *, seed: int = 5) -> dict[str, Path]:
    from batchfit.model.model_file import load_model_file

    simulate = load_model_file(HIERARCHICAL).simulate
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i in indices:
        paths[f"d{i}"] = out_dir / f"d{i}.csv"
        simulate(np.random.default_rng([seed, i]), i).to_csv(paths[f"d{i}"], index=False)
    return paths


def make_config(results_dir: Path, cache_dir: Path, datasets: list[str], *, model: Path = HIERARCHICAL,
                extras: bool = False, **overrides):
    # the simulated datasets' groups are each dataset's own (store g00 is not another store's g00)
    columns = {"group": {"scope": "dataset"}} if model == HIERARCHICAL else {}
    return config_from_dict({
        "model": str(model), "datasets": datasets, "sampler": SAMPLER, "cache_dir": str(cache_dir),
        "columns": columns,
        "results_dir": str(results_dir),
        "outputs": {"log_likelihood": extras, "posterior_predictive": extras}, **overrides,
    })


def read_tree(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every group's variables of a fit file, loaded into memory."""
    with xr.open_datatree(path) as tree:
        return {name.strip("/"): {v: tree[name].ds[v].values.copy() for v in tree[name].ds.data_vars}
                for name in tree.groups if name != "/"}


def assert_groups_equal(a, b, groups=("posterior", "log_likelihood", "posterior_predictive")):
    for group in groups:
        assert sorted(a[group]) == sorted(b[group]), group
        for name in a[group]:
            assert np.array_equal(a[group][name], b[group][name]), f"{group}.{name} differs"
