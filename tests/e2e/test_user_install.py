"""Sweeps in the install a user gets (issue #43): every dataset fitted, none through a fallback.

A user installs batchfit with ``pip install ./batchfit``, without extras (README, "Start a
project"). In that install the first dataset of every fit job once failed on batchfit's cached
path (arviz_base's lazy loading with JAX and numpyro missing) while the test venv, which the test
extra gave both, fitted them all. So these sweeps run entirely in ``.venv-user``
(tests/testkit/venvs.py): its ``snakemake`` and ``batchfit``, as subprocesses, in folders of their own,
each from an empty cache as a first sweep starts. Each sweep has 5 datasets and ``batch_size:
4``: a job that fits several datasets and one that fits one, each with a first dataset.

Each test is a class of its own so that pytest-xdist (``--dist loadscope``) shares them out
between its workers instead of running them all on one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from testkit import REPO, write_config

SAMPLER = {"draws": 300, "tune": 300, "chains": 2}
BATCH_SIZE = 4
N_DATASETS = 5  # with BATCH_SIZE, a job of 4 datasets and a job of 1
# What a fit log says when a dataset left batchfit's cached path (batchfit.fitting.fitter, batchfit.compile.structures)
FALLBACK = ("batchfit's cached path failed", "nutpie's own compile")
# Set by the test session (tests/conftest.py: its compile cache) or by the test venv: a user's shell has
# none of them, so neither do these sweeps (whose caches are then only their cache_dir's).
SESSION_ONLY = ("PYTENSOR_FLAGS", "NUMBA_CACHE_DIR", "BATCHFIT_TEST_CACHE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")

pytestmark = pytest.mark.slow


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}


def run(user_bin: Path, program: str, *args: str | Path, cwd: Path, timeout: int = 300
        ) -> subprocess.CompletedProcess:
    """`program` of the user's venv, as the user runs it (README: ``../.venv/bin/snakemake``)."""
    return subprocess.run([str(user_bin / program), *map(str, args)], cwd=cwd, env=user_env(), capture_output=True,
                          text=True, timeout=timeout)


def assert_every_dataset_fitted(user_bin: Path, root: Path, results: Path, ids: list[str],
                                config: str = "config.yaml") -> None:
    """``snakemake --cores 2`` in `root` fits every dataset of `ids` on batchfit's cached path."""
    sweep = run(user_bin, "snakemake", "--cores", "2", cwd=root, timeout=1500)
    logs = sorted((results / "logs" / "fit").glob("*.log"))
    fallbacks = [f"{log.name}: {line}" for log in logs for line in log.read_text().splitlines()
                 if any(text in line for text in FALLBACK)]
    failures = results / "failures.csv"
    failed = [f"{f.dataset}: {f.message}" for f in pd.read_csv(failures).itertuples()] if failures.exists() else []
    assert not fallbacks, "datasets left batchfit's cached path:\n" + "\n".join(fallbacks + failed)
    assert sweep.returncode == 0, f"the sweep failed:\n{sweep.stdout[-3000:]}\n{sweep.stderr[-5000:]}"
    n = len(ids)
    status = run(user_bin, "batchfit", "status", "--config", config, cwd=root)
    assert status.returncode == 0, status.stderr
    assert f"{n} dataset(s): {n} fitted, 0 pending, 0 failed" in status.stdout, status.stdout
    assert "fitted off batchfit's cached path" not in status.stdout, status.stdout  # its count of fallbacks
    datasets = pd.read_csv(results / "datasets.csv", keep_default_na=False, dtype={"dataset": str})
    assert sorted(datasets["dataset"]) == ids
    assert sorted(pd.read_csv(results / "summary.csv", dtype={"dataset": str})["dataset"].unique()) == ids
    assert not (datasets["status"] == "failed").any(), datasets[datasets["status"] == "failed"]
    per_dataset = datasets.set_index("dataset")[["sampler_path", "fallback"]]
    assert set(datasets["sampler_path"]) == {"cached"} and set(datasets["fallback"]) == {""}, per_dataset
    assert not failed, failed
    # The jobs the sweep ran: one fitted several datasets
    held = sorted(int(n) for log in logs for n in re.findall(r" holds (\d+) dataset\(s\)", log.read_text()))
    assert held == [N_DATASETS - BATCH_SIZE, BATCH_SIZE], held


def new_project(user_bin: Path, root: Path, model: str, write_data: Callable[[Path, int], None],
                datasets: str = "data/*.csv") -> list[str]:
    """``batchfit init`` in `root`, its model and datasets replaced by `model` and N_DATASETS of
    `write_data(data_dir, i)`, with the settings these sweeps use; the dataset ids."""
    init = run(user_bin, "batchfit", "init", root, cwd=root.parent)
    assert init.returncode == 0, init.stderr
    for example in (root / "data").iterdir():
        example.unlink()
    (root / "model.py").write_text(textwrap.dedent(model))
    for i in range(N_DATASETS):
        write_data(root / "data", i)
    config = (root / "config.yaml").read_text()
    assert 'datasets: ["data/*.csv"]' in config
    config = config.replace('datasets: ["data/*.csv"]', f"datasets: [{json.dumps(datasets)}]")
    config += f"sampler: {json.dumps(SAMPLER)}\nbatch_size: {BATCH_SIZE}\n"
    (root / "config.yaml").write_text(config)
    return sorted(p.stem for p in (root / "data").iterdir())


class TestTheUserVenv:
    def test_it_holds_this_working_trees_batchfit_and_no_extras(self, user_bin):
        probe = textwrap.dedent("""\
            import importlib.metadata as m, json, pathlib, batchfit
            print(json.dumps({"package": str(pathlib.Path(batchfit.__file__).parent),
                              "direct_url": json.loads(m.distribution("batchfit").read_text("direct_url.json")),
                              "installed": sorted(d.metadata["Name"].lower() for d in m.distributions())}))
        """)
        done = subprocess.run([str(user_bin / "python"), "-c", probe], env=user_env(), capture_output=True, text=True,
                              timeout=300, cwd=user_bin)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        package = Path(found["package"])
        assert package.is_relative_to(user_bin.parent) and "site-packages" in package.parts  # not editable
        assert not found["direct_url"].get("dir_info", {}).get("editable", False)
        # Every installed file is the working tree's, the workflow's included
        source = REPO / "src" / "batchfit"
        installed = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        stale = [str(p.relative_to(package)) for p in installed
                 if p.read_bytes() != (source / p.relative_to(package)).read_bytes()]
        assert not stale, f"installed files that differ from the working tree's: {stale}"
        modules = {p.relative_to(source) for p in source.glob("**/*.py") if "__pycache__" not in p.parts}
        assert modules <= {p.relative_to(package) for p in installed}
        # No package only an extra asks for
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

        def names(requirements: list[str]) -> set[str]:
            return {re.split(r"[ <>=!\[;]", r, maxsplit=1)[0].lower() for r in requirements}

        extras = set().union(*map(names, project["optional-dependencies"].values())) - names(project["dependencies"])
        assert extras and not extras & set(found["installed"]), extras & set(found["installed"])


class TestBundledExample:
    def test_the_bundled_example_fits_every_dataset(self, user_bin, tmp_path):
        """What ``./setup.sh`` runs, with the repository's Snakefile and config/config.yaml, on 5 of its
        20 datasets with shorter chains, in a copy of the repository's example (a cold cache); the workflow
        is the installed package's."""
        root = tmp_path / "batchfit"
        root.mkdir()
        for name in ("Snakefile", "config", "models"):
            copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
            copy(REPO / name, root / name)
        ids = sorted(p.stem for p in (REPO / "data" / "example").glob("*.csv"))[:N_DATASETS]
        (root / "data" / "example").mkdir(parents=True)
        for d in ids:
            shutil.copy2(REPO / "data" / "example" / f"{d}.csv", root / "data" / "example")
        config = yaml.safe_load((root / "config" / "config.yaml").read_text())
        config["sampler"].update(SAMPLER)
        config["batch_size"] = BATCH_SIZE
        write_config(root / "config" / "config.yaml", config)
        assert_every_dataset_fitted(user_bin, root, root / config["results_dir"], ids, "config/config.yaml")


class TestInitProject:
    def test_a_batchfit_init_project_fits_every_dataset(self, user_bin, tmp_path):
        """The project `batchfit init` writes, as it is, with two more datasets from its model's simulate."""
        root = tmp_path / "my-project"
        init = run(user_bin, "batchfit", "init", root, cwd=tmp_path)
        assert init.returncode == 0, init.stderr
        more = run(user_bin, "batchfit", "simulate", "--model", "model.py", "--n", "2", "--prefix", "more", "--out",
                   "data", cwd=root)
        assert more.returncode == 0, more.stderr
        with open(root / "config.yaml", "a") as f:
            f.write(f"sampler: {json.dumps(SAMPLER)}\nbatch_size: {BATCH_SIZE}\n")
        ids = sorted(p.stem for p in (root / "data").glob("*.csv"))
        assert len(ids) == N_DATASETS, ids
        assert_every_dataset_fitted(user_bin, root, root / "results", ids)


# Three kinds of model from the parity corpus (tests/testkit/parity_corpus.py), each over several datasets.

# coords-integer-array-int-index, as a Poisson varying-intercept regression: the coordinate values are
# np.unique of an integer column (the model of issue #43's reproduction)
INTEGER_COORDS = """\
    import numpy as np
    import pymc as pm


    def build_model(data):
        sites = np.unique(data["site"])
        with pm.Model(coords={"site_id": sites}) as model:
            site = pm.Data("site", data["site"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 2.0)
            sd = pm.HalfNormal("sd", 1.0)
            a = pm.Normal("a", mu, sd, dims="site_id")
            pm.Poisson("y_obs", pm.math.exp(a[site]), observed=y, shape=y.shape)
        return model
"""


def integer_sites(directory: Path, i: int) -> None:
    rng = np.random.default_rng([43, i])
    site = rng.integers(0, 5, 60)
    pd.DataFrame({"site": site, "y": rng.poisson(np.exp(0.8 + 0.3 * site))}).to_csv(directory / f"d{i}.csv",
                                                                                     index=False)


class TestIntegerCoordinates:
    def test_a_model_with_integer_coordinates_fits_every_dataset(self, user_bin, tmp_path):
        ids = new_project(user_bin, tmp_path / "counts", INTEGER_COORDS, integer_sites)
        assert_every_dataset_fitted(user_bin, tmp_path / "counts", tmp_path / "counts" / "results", ids)


# Only vector parameters, no scalar free variable (like the corpus's lkj-cholesky-mvnormal and its
# multivariate families): a regression's coefficients as one vector and a noise scale per group
VECTOR_ONLY = """\
    import pymc as pm


    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"], "term": ["intercept", "slope"]}) as model:
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            coef = pm.Normal("coef", 0.0, 2.0, dims="term")
            sigma = pm.HalfNormal("sigma", 1.0, dims="groups")
            pm.Normal("y_obs", coef[0] + coef[1] * x, sigma[group], observed=y, shape=x.shape)
        return model
"""


def vector_rows(directory: Path, i: int) -> None:
    rng = np.random.default_rng([44, i])
    group = rng.integers(0, 3, 40)
    x = rng.normal(0.0, 1.0, 40).round(4)
    y = (0.5 + 1.2 * x + rng.normal(0.0, 1.0, 40) * np.array([0.3, 0.6, 1.0])[group]).round(4)
    pd.DataFrame({"group": np.array(["a", "b", "c"])[group], "x": x, "y": y}).to_csv(directory / f"d{i}.csv",
                                                                                   index=False)


class TestOnlyVectorParameters:
    def test_a_model_with_only_vector_parameters_fits_every_dataset(self, user_bin, tmp_path):
        ids = new_project(user_bin, tmp_path / "vectors", VECTOR_ONLY, vector_rows)
        assert_every_dataset_fitted(user_bin, tmp_path / "vectors", tmp_path / "vectors" / "results", ids)


# NetCDF datasets (the corpus's rank2 and rank3 netcdf cases) for a multivariate normal per group, like
# models/grouped_mvnormal.py: rank-2 outcomes, integer group codes and the groups' labels as a coordinate
GROUPED_MVNORMAL = """\
    import pymc as pm
    import pytensor.tensor as pt


    def build_model(data):
        with pm.Model(coords={"groups": data.coords["groups"], "outcome": data.coords["outcome"]}) as model:
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 5.0, dims=("groups", "outcome"))
            sd = pm.HalfNormal("sd", 2.5, dims=("groups", "outcome"))
            corr = pm.LKJCorr("corr", n=3, eta=2.0)
            chol = sd[:, :, None] * pt.linalg.cholesky(corr)[None, :, :]
            pm.MvNormal("y_obs", mu=mu[group], chol=chol[group], observed=y, shape=y.shape)
        return model
"""


def grouped_outcomes(directory: Path, i: int) -> None:
    import xarray as xr

    rng = np.random.default_rng([45, i])
    n_groups = 2 + i % 2  # coordinate lengths differ between datasets
    group = np.repeat(np.arange(n_groups), 20)
    cov = np.array([[1.0, 0.4, 0.2], [0.4, 1.0, 0.3], [0.2, 0.3, 1.0]])
    y = rng.normal(0.0, 2.0, (n_groups, 3))[group] + rng.multivariate_normal(np.zeros(3), cov, group.size)
    xr.Dataset({"y": (("row", "outcome"), y.round(4)), "group": (("row",), group)},
               coords={"groups": [f"g{k}" for k in range(n_groups)], "outcome": ["u", "v", "w"]},
               ).to_netcdf(directory / f"d{i}.nc", engine="h5netcdf")


class TestNetCDFDatasets:
    def test_a_grouped_mvnormal_over_netcdf_datasets_fits_every_dataset(self, user_bin, tmp_path):
        ids = new_project(user_bin, tmp_path / "mvn", GROUPED_MVNORMAL, grouped_outcomes, datasets="data/*.nc")
        assert_every_dataset_fitted(user_bin, tmp_path / "mvn", tmp_path / "mvn" / "results", ids)


# A model importing a helper beside it, in a project reached through a symlink (issue #58: on clusters home
# and scratch are often symlinks), with the venv beside it reached through the same link.
HELPER_MODEL = """\
    import pymc as pm
    from scales import PRIOR_SD


    def build_model(data):
        with pm.Model() as model:
            x = pm.Data("x", data["x"])
            y = pm.Data("y", data["y"])
            b = pm.Normal("b", 0.0, PRIOR_SD)
            sigma = pm.HalfNormal("sigma", PRIOR_SD)
            pm.Normal("y_obs", b * x, sigma, observed=y, shape=x.shape)
        return model
"""
# What a notebook builds and what the scan of the model's imports finds, as one line of JSON.
NOTEBOOK_PROBE = """\
import json, sys, batchfit
from batchfit.model.imports import user_import_files, user_imports
model = batchfit.build_model("config.yaml", "d0")
print(json.dumps({"prefix": sys.prefix, "free": sorted(v.name for v in model.free_RVs),
                  "imports": user_imports("model.py"), "files": user_import_files("model.py")}))
"""


def regression_rows(directory: Path, i: int) -> None:
    rng = np.random.default_rng([58, i])
    x = rng.normal(0.0, 1.0, 30).round(4)
    pd.DataFrame({"x": x, "y": (0.7 * x + rng.normal(0.0, 0.5, 30)).round(4)}).to_csv(directory / f"d{i}.csv",
                                                                                      index=False)


class TestSymlinkedPrefix:
    def test_notebook_check_and_sweep_through_a_symlinked_folder_of_venv_and_project(self, user_bin, tmp_path):
        """Python started as ``home/venv/bin/python``, ``home`` a symlink to the folder holding a symlink to
        the user's venv and the project: the notebook API, ``batchfit check`` and a sweep work, and the scan
        of the model's imports finds the same helper, by its real file, as a process started the real way."""
        real = tmp_path / "real"
        real.mkdir()
        (real / "venv").symlink_to(user_bin.parent, target_is_directory=True)
        (tmp_path / "home").symlink_to(real, target_is_directory=True)
        linked_bin = tmp_path / "home" / "venv" / "bin"
        project = tmp_path / "home" / "proj"
        ids = new_project(linked_bin, project, HELPER_MODEL, regression_rows)
        (real / "proj" / "scales.py").write_text("PRIOR_SD = 2.0\n")
        helper = real / "proj" / "scales.py"
        expected = {"free": ["b", "sigma"], "imports": {"scales": hashlib.sha256(helper.read_bytes()).hexdigest()},
                    "files": [str(helper.resolve())]}

        found = {}
        for name, bin_dir, cwd in (("linked", linked_bin, project), ("real", user_bin, real / "proj")):
            probe = run(bin_dir, "python", "-c", NOTEBOOK_PROBE, cwd=cwd)
            assert probe.returncode == 0, f"{name}:\n{probe.stderr[-3000:]}"
            found[name] = json.loads(probe.stdout.strip().splitlines()[-1])
        assert found["linked"]["prefix"] == str(tmp_path / "home" / "venv"), found  # started through the link
        for name, result in found.items():
            assert {k: result[k] for k in expected} == expected, (name, result)

        check = run(linked_bin, "batchfit", "check", "--config", "config.yaml", cwd=project)
        assert check.returncode == 0, f"{check.stdout[-3000:]}\n{check.stderr[-3000:]}"
        assert_every_dataset_fitted(linked_bin, project, project / "results", ids)


class TestTableSweep:
    def test_a_nonmem_style_table_in_the_users_data_folder_fits_every_subject(self, user_bin, tmp_path):
        """The user's long table, already in data/ when `batchfit init` runs (which then writes no example data):
        split by ID, its dosing records skipped, each dose from a side table, the bundled PK model."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("pk_oral", REPO / "models" / "pk_oral.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        root = tmp_path / "pk"
        (root / "data").mkdir(parents=True)
        table = module.simulate(np.random.default_rng(7), N_DATASETS)
        table.to_csv(root / "data" / "pk.csv", index=False, na_rep=".")
        table[table.EVID == 1][["ID", "AMT"]].rename(columns={"AMT": "dose"}).to_csv(root / "data" / "doses.csv",
                                                                                      index=False)
        init = run(user_bin, "batchfit", "init", root, cwd=tmp_path)
        assert init.returncode == 0, init.stderr
        assert "no example data were written" in init.stdout
        assert sorted(p.name for p in (root / "data").iterdir()) == ["doses.csv", "pk.csv"]
        shutil.copy2(REPO / "models" / "pk_oral.py", root / "model.py")
        config = (root / "config.yaml").read_text().replace(
            'datasets: ["data/*.csv"]', 'datasets: [{table: data/pk.csv, by: ID}]')
        config += ('values: {table: data/doses.csv, by: ID}\nrows: {where: "EVID == 0"}\n'
                   f"sampler: {json.dumps(SAMPLER)}\nbatch_size: {BATCH_SIZE}\n")
        (root / "config.yaml").write_text(config)
        ids = sorted(str(i) for i in table.ID.unique())
        assert_every_dataset_fitted(user_bin, root, root / "results", ids)
