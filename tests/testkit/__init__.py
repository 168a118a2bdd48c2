"""What the test modules share: the repository's paths, running the real Snakemake on a sweep,
writing a sweep's config, and reading what a sweep wrote.

Not named ``helpers.py``: pytest puts tests/ on ``sys.path``, and batchfit refuses a model's own
``helpers.py`` when another module of that name is importable (tests/unit/test_model_imports.py
fits models that import one). Nothing of batchfit is imported at the top: tests/conftest.py
imports this module before it sets PyTensor's and numba's cache directories.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
import yaml

REPO = Path(__file__).resolve().parents[2]  # tests/testkit/__init__.py -> the repository
SNAKEFILE = REPO / "Snakefile"
HIERARCHICAL = REPO / "models" / "hierarchical.py"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")  # the test venv's, as a user runs it
#: a small, fast sampler (the default of `sweep_settings`)
SAMPLER = {"draws": 100, "tune": 100, "chains": 2, "target_accept": 0.9, "seed": 2026}


# --- running Snakemake -----------------------------------------------------------------------------


def snakemake_command(directory: Path, configfile: Path, *args: str, cores: int = 2) -> list[str]:
    """The real snakemake on the repository's Snakefile in ``directory`` (its ``--directory``), with
    ``args`` (options, targets) first: ``--configfile`` takes every word after it as another file."""
    return [str(SNAKEMAKE), *args, "--cores", str(cores), "--snakefile", str(SNAKEFILE), "--directory", str(directory),
            "--configfile", str(configfile)]


def snakemake(directory: Path, configfile: Path, *args: str, cores: int = 2, timeout: float = 900,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `snakemake_command` in ``directory``, its output captured as text."""
    return subprocess.run(snakemake_command(directory, configfile, *args, cores=cores), cwd=directory,
                          capture_output=True, text=True, timeout=timeout, env=env)


def output_of(run: subprocess.CompletedProcess) -> str:
    return f"{run.stdout}\n{run.stderr}"


def planned_jobs(run: subprocess.CompletedProcess) -> dict[str, int]:
    """The jobs a (dry) run lists in its job table, by rule."""
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", output_of(run), re.M)}


# --- a sweep's config ------------------------------------------------------------------------------


def sweep_settings(cache_dir: Path, *, update: dict | None = None, **changes: object) -> dict:
    """A small sweep's config as a dict: the hierarchical model, ``data/*.csv`` and ``results``
    (relative to the project directory) and `SAMPLER`, in batches of 3.

    ``changes`` replace keys (``sampler={"draws": 50}`` is the whole sampler section); ``update``
    changes keys too, but a section's settings one by one (``{"sampler": {"draws": 60}}`` keeps
    the other sampler settings).
    """
    config = {"model": str(HIERARCHICAL), "datasets": ["data/*.csv"], "sampler": dict(SAMPLER), "batch_size": 3,
              "cache_dir": str(cache_dir), "results_dir": "results", **changes}
    for key, value in (update or {}).items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def write_config(path: Path, settings: object) -> Path:
    """``settings`` as the config file ``path``, YAML (keys in their order) or, where ``path`` ends
    in .json, JSON (for a script that reads it with ``json.loads``); returns ``path``."""
    path.write_text(json.dumps(settings) if path.suffix == ".json" else yaml.safe_dump(settings, sort_keys=False))
    return path


def write_sweep(root: Path, cache: Path, n: int) -> Path:
    """``n`` datasets of the hierarchical model and the config of a tiny sweep of them under ``root``."""
    from batchfit.model.simulate import simulate_datasets  # not at the top: see the module's docstring

    simulate_datasets(HIERARCHICAL, root / "data", n, seed=7, prefix="shop")
    return write_config(root / "sweep.yaml", sweep_settings(
        cache, sampler={"draws": 100, "tune": 100, "chains": 2, "seed": 11}, batch_size=2,
        columns={"group": {"scope": "dataset"}}))  # each shop's groups are its own


# Two variants of the bundled model: its noise Normal or Student-t (a build_model parameter, docs/variants.md).
VARIANTS = {"normal": {"params": {"noise": "normal"}}, "student": {"params": {"noise": "student"}}}


def write_variant_sweep(root: Path, cache: Path, n: int) -> Path:
    """`write_sweep`'s ``n`` datasets and config, sweeping `VARIANTS` (batches of 3: one fit job a variant),
    with the sensitivity rule on."""
    config = write_sweep(root, cache, n)
    return write_config(config, yaml.safe_load(config.read_text()) | {"variants": VARIANTS, "batch_size": 3,
                                                                      "outputs": {"sensitivity": True}})


def table(seed: int, n_rows: int, n_groups: int) -> pd.DataFrame:
    """A clean dataset for the hierarchical model (columns group, x, y)."""
    rng = np.random.default_rng([7, seed])
    idx = np.arange(n_rows) % n_groups
    intercepts = rng.normal(1.0, 1.0, size=n_groups)
    x = rng.normal(size=n_rows)
    y = intercepts[idx] + 0.7 * x + rng.normal(0.0, 0.5, size=n_rows)
    return pd.DataFrame({"group": [f"g{k:02d}" for k in idx], "x": x.round(4), "y": y.round(4)})


# --- what a sweep wrote ----------------------------------------------------------------------------


def mtimes(directory: Path) -> dict[str, int]:
    """Modification time of each ``*.nc`` file in ``directory`` (a fit written again changes it)."""
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.glob("*.nc"))}


def manifests(results: Path) -> dict[str, dict]:
    """Each batch's manifest in the results directory ``results``, by batch."""
    return {p.stem: json.loads(p.read_text()) for p in (results / "batches").glob("*.json")}


def posterior_arrays(path: Path, group: str = "posterior") -> dict[str, np.ndarray]:
    """The posterior draws of the fit file ``path`` (or of another of its groups), by variable."""
    with xr.open_datatree(path, engine="h5netcdf") as tree:
        return {name: np.asarray(var.values) for name, var in tree[group].to_dataset().data_vars.items()}


# A user's op with only a Python implementation (``perform``, as in PyMC's black-box likelihood
# examples): numba runs it in object mode, a model batchfit's cached path cannot take, which goes
# through nutpie's own compile.
OBJECT_MODE_MODEL = """\
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op


class PythonSoftplus(Op):
    __props__ = ()

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.asarray(np.logaddexp(0.0, inputs[0]))

    def pullback(self, inputs, outputs, output_grads):
        return [output_grads[0] * pt.sigmoid(inputs[0])]


def build_model(data):
    with pm.Model() as model:
        y = pm.Data("y", data["y"])
        p = pm.Normal("p", 0.0, 1.0)
        pm.Normal("obs", PythonSoftplus()(p), 0.3, observed=y, shape=y.shape)
    return model
"""


# A slope known to be a whole number: a discrete free variable, which NUTS cannot sample, so a sweep fits it
# with pm.sample's own step methods (Metropolis for the slope, NUTS for the rest); nutpie refuses the model.
DISCRETE_FREE = """\
import pymc as pm

def build_model(data):
    with pm.Model() as model:
        x = pm.Data("x", data["x"])
        y = pm.Data("y", data["y"])
        k = pm.Binomial("k", n=10, p=0.5)
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("obs", mu + k * x, sigma, observed=y, shape=x.shape)
    return model
"""
