"""Comparing two posteriors drawn by MCMC: the tolerance comes from their Monte Carlo errors.

Means are compared in units of the combined Monte Carlo standard error (ArviZ's ``mcse``), so
a right posterior passes with a fixed seed and a shifted one fails however long the chains;
standard deviations by ratio, where their own Monte Carlo error (ArviZ's ``mcse(method="sd")``)
is small enough to tell: in a heavy tail one extreme draw moves an sd by a third (the corpus's GP
lengthscale, InverseGamma(5, 20): sd 2.9 vs 4.0, each with a Monte Carlo error of 0.13 and 0.60).
Used wherever batchfit's posterior is checked against ``pm.sample``'s, which
`sample_reference` draws, through JAX, in the reference venv (tests/testkit/venvs.py): JAX is in no
environment batchfit runs in (issue #43). A test in the test venv gets such posteriors from
`reference_posteriors`, which runs this file there: ``python posterior_checks.py JOBS OUT_DIR``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

MAX_Z = 5.0  # |difference of means (or sds)| / combined MCSE; ~1 in 2 million for a right posterior
SD_RATIO = (0.75, 1.33)  # with a few hundred effective draws each, sds agree within ~15%
MAX_R_HAT = 1.1  # past it a chain is stuck or far from the others: Monte Carlo errors mean nothing


def sample_reference(model: Any, **sample: Any) -> tuple[Any, str]:
    """``pm.sample(nuts_sampler="nutpie", **sample)`` on ``model``, compiled through PyTensor's JAX
    backend; the InferenceData and the backend used (``"jax"`` or ``"numba"``).

    JAX, not the numba backend batchfit runs: the two sides then share no op implementation, so
    a wrong numba kernel cannot give both the same wrong posterior; and JAX compiles small models
    in about a third of numba's CPU time. A model with an op PyTensor cannot convert to JAX
    (``Interpolated``'s spline) is compiled with numba instead, with PyTensor's own numba
    implementations only (batchfit's, `batchfit.numba_ops.register`, are not registered here).
    """
    import pymc as pm

    registered = {"batchfit.numba_ops.linalg", "batchfit.numba_ops.splines"} & sys.modules.keys()
    assert not registered, "the reference would run batchfit's numba kernels"

    for backend in ("JAX", "NUMBA"):
        try:
            with model:
                return pm.sample(nuts_sampler="nutpie", progressbar=False, compile_kwargs={"mode": backend},
                                 **sample), backend.lower()
        except NotImplementedError as exc:
            if backend != "JAX" or "No JAX conversion" not in str(exc):
                raise
            print(f"{' '.join(str(exc).split())[:160]}; compiling the reference with numba", flush=True)
    raise AssertionError("unreachable")


class ModelInput:
    """What ``build_model(data)`` receives, rebuilt from its arrays and coordinate labels in another process."""

    def __init__(self, arrays: Mapping[str, np.ndarray], coords: Mapping[str, tuple]) -> None:
        self.arrays, self.coords = dict(arrays), dict(coords)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def keys(self) -> Any:
        return self.arrays.keys()


def reference_posteriors(python: Path, jobs: list[tuple[Path, Any]], **sample: Any) -> list[xr.Dataset]:
    """The posterior `sample_reference` gives for ``build_model(data)`` of each (model file, data) in
    `jobs` (data: anything with ``keys()``, ``[name]`` and ``.coords``, e.g. a batchfit Dataset as the
    sweep loads it), all sampled by one process of `python`, the reference venv's (it has JAX)."""
    with tempfile.TemporaryDirectory(prefix="batchfit-reference-") as tmp:
        spec = Path(tmp) / "jobs.pickle"
        spec.write_bytes(pickle.dumps({"sample": sample, "jobs": [
            (str(model_file), {k: np.asarray(data[k]) for k in data.keys()}, dict(data.coords))
            for model_file, data in jobs]}))
        run = subprocess.run([str(python), __file__, str(spec), tmp], capture_output=True, text=True, timeout=1800)
        assert run.returncode == 0, f"the reference process failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
        posteriors = []
        for i in range(len(jobs)):
            with xr.open_dataset(Path(tmp) / f"{i}.nc", engine="h5netcdf") as posterior:
                posteriors.append(posterior.load())
        return posteriors


def _sample_jobs(spec: Path, out: Path) -> None:
    """`reference_posteriors`' other side: each job's posterior to ``out/<i>.nc``."""
    import importlib.util

    given = pickle.loads(spec.read_bytes())
    for i, (model_file, arrays, coords) in enumerate(given["jobs"]):
        module_spec = importlib.util.spec_from_file_location(f"reference_model_{i}", model_file)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        idata, backend = sample_reference(module.build_model(ModelInput(arrays, coords)), **given["sample"])
        idata.posterior.to_netcdf(out / f"{i}.nc", engine="h5netcdf")
        print(f"{model_file}: sampled, compiled with {backend}", flush=True)


def assert_same_posterior(ours: xr.Dataset, reference: xr.Dataset, *, label: str,
                          var_names: list[str] | None = None) -> None:
    """Fail naming the variable and element whose mean or sd disagrees beyond Monte Carlo error.

    Every variable of `reference` (or each of `var_names`) must be in `ours`, with the same
    dimensions and coordinate labels (compared as text: 1 and "1" label the same element).
    Elements constant in both (a Cholesky factor's zeros, a correlation's diagonal) must be equal.
    """
    import arviz as az

    names = var_names or list(reference.data_vars)
    missing = [n for n in names if n not in ours.data_vars]
    assert not missing, f"{label}: missing from ours: {missing} (ours has {list(ours.data_vars)})"
    problems = []
    for name in names:
        a, b = ours[name], reference[name]
        assert a.shape[2:] == b.shape[2:], f"{label}: {name} has shape {a.shape[2:]} vs {b.shape[2:]}"
        assert a.dims == b.dims, f"{label}: {name} has dims {a.dims} vs {b.dims}"
        for dim in a.dims[2:]:
            labels_a, labels_b = _labels(a, dim), _labels(b, dim)
            assert labels_a == labels_b, f"{label}: {name} coordinate {dim} is {labels_a} vs {labels_b}"
        mean_a, mean_b = _flat(a.mean(("chain", "draw"))), _flat(b.mean(("chain", "draw")))
        sd_a, sd_b = _flat(a.std(("chain", "draw"))), _flat(b.std(("chain", "draw")))
        for side, values in (("ours", a), ("reference", b)):
            r_hat = np.nanmax(_flat(az.rhat(values.to_dataset())[name]), initial=1.0)
            assert r_hat <= MAX_R_HAT, f"{label}: {side} chains did not mix on {name} (r_hat {r_hat:.2f}): " \
                                       "a stuck chain, or a model too hard to compare posteriors on"
        mcse, mcse_sd = (np.hypot(_flat(az.mcse(a.to_dataset(), method=m)[name]),
                                  _flat(az.mcse(b.to_dataset(), method=m)[name])) for m in ("mean", "sd"))
        for i in range(mean_a.size):
            if sd_a[i] == 0 and sd_b[i] == 0:  # a constant element: no Monte Carlo error to scale by
                if not np.isclose(mean_a[i], mean_b[i], rtol=1e-9, atol=1e-12):
                    problems.append(f"{name}[{i}]: constant {mean_a[i]:.6g} vs {mean_b[i]:.6g}")
                continue
            z = abs(mean_a[i] - mean_b[i]) / max(mcse[i], 1e-12)
            ratio = sd_a[i] / sd_b[i] if sd_b[i] > 0 else (1.0 if sd_a[i] == 0 else np.inf)
            sd_z = abs(sd_a[i] - sd_b[i]) / max(mcse_sd[i], 1e-12)
            sd_differs = not SD_RATIO[0] <= ratio <= SD_RATIO[1] and not sd_z <= MAX_Z
            if not np.isfinite(z) or z > MAX_Z or sd_differs:
                problems.append(f"{name}[{i}]: mean {mean_a[i]:.4g} vs {mean_b[i]:.4g} ({z:.1f} MCSE), "
                                f"sd {sd_a[i]:.4g} vs {sd_b[i]:.4g} (ratio {ratio:.2f}, {sd_z:.1f} MCSE)")
    assert not problems, f"{label}: posteriors differ:\n  " + "\n  ".join(problems)


def _labels(values: xr.DataArray, dim: str) -> list[str] | None:
    """A dimension's coordinate labels as text, or None when it has none (PyMC's default index)."""
    return [str(v) for v in values[dim].values.tolist()] if dim in values.coords else None


def _flat(values: xr.DataArray | xr.Dataset) -> np.ndarray:
    return np.atleast_1d(np.asarray(values, dtype=float)).ravel()


if __name__ == "__main__":
    _sample_jobs(Path(sys.argv[1]), Path(sys.argv[2]))
