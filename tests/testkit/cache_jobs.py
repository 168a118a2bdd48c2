"""Jobs run against a cache as Snakemake runs them, in fresh processes: their environment, the batchfit CLI, a
sweep's config file, and reading and comparing their posteriors (test_cache, test_cache_heal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from testkit import HIERARCHICAL, write_config

BATCHFIT = Path(sys.executable).parent / "batchfit"
SAMPLER = {"draws": 100, "tune": 100, "chains": 2, "seed": 7}
# Kept to one interpreter per job in every subprocess, so 8 of them fit on 2 cores.
SUBPROCESS_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def env_for(cache_dir: Path) -> dict[str, str]:
    """Environment of a job using ``cache_dir`` (PyTensor's compile dir inside it, as batchfit sets)."""
    env = {**os.environ, **SUBPROCESS_ENV}
    env["PYTENSOR_FLAGS"] = f"base_compiledir={Path(cache_dir) / 'pytensor'}"
    return env


def sweep_file(path: Path, *, data_glob: str, cache_dir: Path, results_dir: Path,
               model: Path = HIERARCHICAL, **extra: object) -> Path:
    """The config file ``path`` of a sweep of ``model`` over ``data_glob`` (JSON for FIT_SCRIPT, if .json)."""
    return write_config(path, {"model": str(model), "datasets": [data_glob], "sampler": SAMPLER,
                               "cache_dir": str(cache_dir), "results_dir": str(results_dir), **extra})


def posterior(fit_file: Path) -> dict[str, np.ndarray]:
    import xarray as xr

    with xr.open_datatree(fit_file) as tree:
        post = {name: var.values.copy() for name, var in tree["posterior"].ds.data_vars.items()}
    assert post and all(v.size for v in post.values())
    return post


def assert_same_draws(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name]), f"posterior '{name}' differs"


def cli(
    *args: object, cwd: Path | None = None, cache_dir: Path | None = None, timeout: float = 400
) -> subprocess.CompletedProcess:
    env = env_for(cache_dir) if cache_dir is not None else {**os.environ, **SUBPROCESS_ENV}
    return subprocess.run([str(BATCHFIT), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)
