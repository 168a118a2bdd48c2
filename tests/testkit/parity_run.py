"""Fit corpus models one after the other in this process: ``python parity_run.py SIDE ROOT NAME...``.

SIDE is ``batchfit`` (the library's fit stage, as ``batchfit fit`` runs it) or
``reference`` (``pm.sample(nuts_sampler="nutpie")`` on the same files, read without batchfit's
readers so a reader bug cannot hide in both, and compiled through PyTensor's JAX backend so an op
numba implements wrongly cannot hide in both either; see `fit_reference`). For each NAME it writes
``ROOT/NAME/SIDE.started`` first and ``ROOT/NAME/SIDE.json`` (status, message, seconds, backend)
last; the reference also writes ``reference.nc``. A process that dies leaves a ``.started``
without a ``.json``: the test's driver records that model as crashed and starts a new process
for the rest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SIDES = ("batchfit", "reference")
# The sampler settings' families each model is also fitted under, on batchfit's side after its default fit
# (the compile is then a cache hit): none may change the posterior (test_parity compares each with
# pm.sample's, whose nutpie adapts a diagonal mass matrix). Results under ROOT/NAME/batchfit-FAMILY/.
SETTING_FAMILIES: dict[str, dict[str, Any]] = {
    "adaptation-low-rank": {"adaptation": "low_rank"},
    "adaptation-draw-diag": {"adaptation": "draw_diag", "mass_matrix_switch_freq": 40, "early_window_switch_freq": 5},
    # Not unjittered starts (jitter_rvs: []): nutpie refuses a start where an element of the gradient is
    # exactly 0, as at coords-text-labels' own initial point (mu_a's, every group intercept at mu_a), and
    # nutpie's compile_pymc_model(jitter_rvs=set()) fails there alike. That initvals and jitter_rvs reach
    # nutpie is tests/unit/test_sampler_settings.py's.
    "nuts": {"max_treedepth": 12, "target_accept": 0.9},
    "kept-warmup-and-stats": {"discard_tuned_samples": False, "store_divergences": True, "store_unconstrained": True,
                              "store_gradient": True, "store_mass_matrix": True},
}


def table_data(path: Path) -> Any:
    """What ``build_model(data)`` receives, read independently of batchfit: arrays and text labels.

    Text columns become codes 0..K-1 of their sorted labels (batchfit's documented coding);
    NetCDF data variables keep their rank and 1-D coordinates become labels.
    """
    from posterior_checks import ModelInput

    arrays: dict[str, np.ndarray] = {}
    coords: dict[str, tuple] = {}
    if path.suffix == ".csv":
        import pandas as pd

        for name, column in pd.read_csv(path).items():
            if not pd.api.types.is_numeric_dtype(column):
                labels = tuple(sorted(column.unique()))
                arrays[name] = np.searchsorted(labels, column.to_numpy()).astype(np.int64)
                coords[name] = labels
            else:
                arrays[name] = column.to_numpy()
    else:
        import xarray as xr

        with xr.open_dataset(path, engine="h5netcdf") as ds:
            arrays = {str(k): np.asarray(v.values) for k, v in ds.data_vars.items()}
            coords = {str(k): tuple(c.values.tolist()) for k, c in ds.coords.items() if c.ndim == 1}
    return ModelInput(arrays, coords)


def fit_reference(directory: Path, sampler: dict[str, Any]) -> str:
    """pm.sample with nutpie on the case's model file and dataset; the posterior goes to reference.nc.

    Compiled through JAX where PyTensor can (posterior_checks.sample_reference; the corpus's
    reference side took 316 CPU-s through JAX against 914 through numba on 2026-12-02).
    Returns the backend used.
    """
    from posterior_checks import sample_reference

    spec = importlib.util.spec_from_file_location(f"parity_{directory.name.replace('-', '_')}",
                                                  directory / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [data_file] = sorted((directory / "data").iterdir())
    model = module.build_model(table_data(data_file))
    idata, backend = sample_reference(model, draws=sampler["draws"], tune=sampler["tune"],
                                      chains=sampler["chains"], random_seed=sampler["seed"] + 1)
    idata.posterior.to_netcdf(directory / "reference.nc", engine="h5netcdf")
    return backend


def fit_batchfit(directory: Path, family: str | None = None) -> None:
    """What ``batchfit fit --config`` does for the case (with the settings of ``family`` added to its
    sampler's, into ``batchfit-FAMILY``); a failed dataset raises its recorded message.

    The fit stage alone, as the CLI's ``fit`` runs it (it compiles on a cache miss): the compile
    stage's extra nopython check would compile every model twice.
    """
    import yaml

    from batchfit.config import config_from_dict
    from batchfit.sweep import stages as pipeline

    settings = yaml.safe_load((directory / "config.yaml").read_text())
    if family is not None:
        settings["sampler"] = {**settings["sampler"], **SETTING_FAMILIES[family]}
        settings["results_dir"] = str(directory / f"batchfit-{family}")
    config = config_from_dict(settings, source=str(directory / "config.yaml"))
    pipeline.run_fit(config, threads=2)
    failures = list(config.layout.failures.glob("*.json"))
    if failures:
        raise RuntimeError(json.loads(failures[0].read_text())["message"])


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the compile worker): a model's cost,
    which unlike its wall time does not depend on how loaded the machine is."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def main(side: str, root: Path, names: list[str]) -> None:
    import logging

    import yaml

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("batchfit").setLevel(logging.INFO)  # the compile line, with its time

    for name in names:
        directory = root / name
        (directory / f"{side}.started").touch()
        # batchfit's side: the default settings first (the driver's record of the model), then each family
        runs = [(side, None)] + ([(f"{side}-{family}", family) for family in SETTING_FAMILIES]
                                 if side == "batchfit" else [])
        for label, family in runs:
            start, cpu_start = time.perf_counter(), _cpu_seconds()
            try:
                if side == "reference":
                    sampler = yaml.safe_load((directory / "config.yaml").read_text())["sampler"]
                    backend = fit_reference(directory, sampler)
                else:
                    fit_batchfit(directory, family)
                    backend = "numba"
                result = {"status": "ok", "message": "", "backend": backend}
            except Exception as exc:  # noqa: BLE001 - every failure is a result to report, not a reason to stop
                result = {"status": "failed", "message": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            result["seconds"] = round(time.perf_counter() - start, 2)
            result["cpu_seconds"] = round(_cpu_seconds() - cpu_start, 2)
            (directory / f"{label}.json").write_text(json.dumps(result))
            print(name, label, result, flush=True)


if __name__ == "__main__":
    assert sys.argv[1] in SIDES, sys.argv[1]
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
