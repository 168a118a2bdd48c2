"""The user modules a model file imports, found from its source, are the ones Python loads.

The reference is Python itself: a child process with the helpers on ``PYTHONPATH`` runs the
model file and calls ``build_model`` (which imports one more module), and lists the modules it
loaded from the helpers' directory. The static scan must find exactly those, with their files'
sha256, and nothing from the standard library or installed packages.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from testkit import HIERARCHICAL, REPO, snakemake, write_config

from batchfit.compat.python import library_roots
from batchfit.model.imports import is_user_file, user_import_files, user_imports

BIN = Path(sys.executable).parent

FILES = {
    # a package whose __init__ pulls a module by a relative import, which imports a plain module
    "bfh_pkg/__init__.py": "from .scales import NOISE\n",
    "bfh_pkg/scales.py": "import math\n\nfrom bfh_plain import BASE\n\nNOISE = math.sqrt(BASE) * 2\n",
    # a subpackage reached only from inside build_model, two relative levels deep
    "bfh_pkg/sub/__init__.py": "",
    "bfh_pkg/sub/deep.py": "from ..scales import NOISE as _NOISE\n\nDEEP = _NOISE\n",
    "bfh_plain.py": "BASE = 1.0\n",
    "bfh_unused.py": "UNUSED = 1\n",  # on the path, never imported: must not count
}

MODEL = """
import os
from collections import OrderedDict

import numpy as np

from bfh_pkg import NOISE

try:
    import bfh_not_installed_anywhere
except ImportError:
    bfh_not_installed_anywhere = None


def build_model(data):
    from bfh_pkg.sub import deep
    return NOISE + deep.DEEP
"""

LOADED = """
import json, runpy, sys
namespace = runpy.run_path(sys.argv[1])
namespace["build_model"](None)
lib = sys.argv[2]
print(json.dumps({name: m.__file__ for name, m in sys.modules.items()
                  if (getattr(m, "__file__", None) or "").startswith(lib)}))
"""


@pytest.fixture
def helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The helper files under ``lib/`` (on this process's path) and a model file importing them."""
    lib = tmp_path / "lib"
    for name, text in FILES.items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(text)
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(lib))
    return tmp_path


def test_the_scan_finds_exactly_the_user_modules_python_loads(helpers: Path) -> None:
    lib = helpers / "lib"
    env = {**os.environ, "PYTHONPATH": str(lib)}
    run = subprocess.run([sys.executable, "-c", LOADED, str(helpers / "model.py"), str(lib)],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    loaded = json.loads(run.stdout)
    assert set(loaded) == {"bfh_pkg", "bfh_pkg.scales", "bfh_pkg.sub", "bfh_pkg.sub.deep", "bfh_plain"}

    found = user_imports(helpers / "model.py")
    assert found == {name: hashlib.sha256(Path(path).read_bytes()).hexdigest() for name, path in loaded.items()}
    # the workflow's jobs declare these files as inputs (#46)
    assert user_import_files(helpers / "model.py") == sorted({str(Path(p).resolve()) for p in loaded.values()})


def test_an_edit_to_a_helper_two_imports_away_changes_the_result(helpers: Path) -> None:
    before = user_imports(helpers / "model.py")
    plain = helpers / "lib" / "bfh_plain.py"
    plain.write_text("BASE = 4.0\n")
    after = user_imports(helpers / "model.py")
    assert after["bfh_plain"] != before["bfh_plain"]
    assert {k: v for k, v in after.items() if k != "bfh_plain"} == {k: v for k, v in before.items()
                                                                   if k != "bfh_plain"}


def test_the_scan_imports_nothing(helpers: Path) -> None:
    """The plan runs the scan at every Snakemake parse: it must not execute the user's code."""
    (helpers / "lib" / "bfh_pkg" / "__init__.py").write_text("raise RuntimeError('executed')\n")
    assert "bfh_pkg" in user_imports(helpers / "model.py")
    assert not any(name.startswith("bfh_") for name in sys.modules)


class RaisingFinder(importlib.abc.MetaPathFinder):
    """A finder of some other library that raises on names it does not know (importlib's namespace
    paths raise KeyError for a parent missing from sys.modules)."""

    def find_spec(self, fullname, path=None, target=None):
        raise KeyError(fullname)


def test_the_scan_survives_a_finder_that_raises(helpers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = user_imports(helpers / "model.py")
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, RaisingFinder()])  # asked about every name no other has
    assert user_imports(helpers / "model.py") == expected
    assert set(expected) == {"bfh_pkg", "bfh_pkg.scales", "bfh_pkg.sub", "bfh_pkg.sub.deep", "bfh_plain"}


def test_a_library_file_reached_through_a_symlink_is_no_user_file(tmp_path: Path) -> None:
    """Library roots and files are compared resolved: a process started through a symlinked prefix sees
    the installed packages through the link, and they are still the libraries'."""
    site = Path(np.__file__).resolve().parent.parent
    (tmp_path / "linked").symlink_to(site, target_is_directory=True)
    assert not is_user_file(tmp_path / "linked" / "numpy" / "__init__.py")
    assert not is_user_file(np.__file__)
    (tmp_path / "mine.py").write_text("")
    assert is_user_file(tmp_path / "mine.py")
    # a sibling folder whose name starts like a root's is not under it
    assert any(is_user_file(f"{root}-beside/x.py") for root in library_roots())


# --- modules beside the model file ------------------------------------------------------------

BESIDE_MODEL = """
import pymc as pm

import helpers
from priors_pkg import LOCATION


def build_model(data):
    import lazy_helper  # imported only when a model is built

    with pm.Model() as model:
        y = pm.Data("y", data["y"])
        mu = pm.Normal("mu", LOCATION, helpers.PRIOR_SD)
        pm.Normal("obs", mu, lazy_helper.NOISE, observed=y, shape=y.shape)
    model.used = (helpers.TAG, LOCATION, lazy_helper.TAG)
    return model
"""


def beside(folder: Path, tag: str, model: str = BESIDE_MODEL) -> Path:
    """A model file in ``folder`` with a module, a package and a module imported lazily beside it,
    each telling ``tag``; returns the model file."""
    files = {"model.py": model,
             "helpers.py": f"TAG = {tag!r}\nPRIOR_SD = 2.0\n",
             "priors_pkg/__init__.py": "from .where import LOCATION\n",
             "priors_pkg/where.py": f"LOCATION = {tag!r}.count('o') * 1.0\nTAG = {tag!r}\n",
             "lazy_helper.py": f"TAG = {tag!r}\nNOISE = 1.0\n"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / "model.py"


def build(model_file: Path) -> object:
    from batchfit.data.dataset import Dataset
    from batchfit.model.model_file import build_model, load_model_file

    data = Dataset(id="d", path=Path("d.csv"), arrays={"y": np.array([0.3, -1.2, 0.8])}, coords={})
    return build_model(load_model_file(model_file), data)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_model_imports_modules_beside_it_at_load_and_inside_build_model(tmp_path: Path) -> None:
    model_file = beside(tmp_path, "one")
    assert build(model_file).used == ("one", 1.0, "one")
    assert user_imports(model_file) == {
        "helpers": sha256(tmp_path / "helpers.py"), "lazy_helper": sha256(tmp_path / "lazy_helper.py"),
        "priors_pkg": sha256(tmp_path / "priors_pkg" / "__init__.py"),
        "priors_pkg.where": sha256(tmp_path / "priors_pkg" / "where.py")}


def test_two_model_files_in_different_folders_each_import_their_own_helpers(tmp_path: Path) -> None:
    """Both import modules named ``helpers``, ``priors_pkg`` and ``lazy_helper``: Python would hand
    the second model the first one's from ``sys.modules``."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, two = beside(tmp_path / "one", "one"), beside(tmp_path / "two", "two")
    for _ in range(2):  # and again, each model's modules coming back from the other's
        assert build(one).used == ("one", 1.0, "one")
        assert build(two).used == ("two", 1.0, "two")
    # The scan of one model is not misled by the other's modules, imported now.
    assert user_imports(one)["helpers"] == sha256(tmp_path / "one" / "helpers.py")
    assert user_imports(one)["lazy_helper"] == sha256(tmp_path / "one" / "lazy_helper.py")


def test_an_edited_helper_is_imported_anew_with_the_model(tmp_path: Path) -> None:
    model_file = beside(tmp_path, "one")
    before = user_imports(model_file)
    assert build(model_file).used == ("one", 1.0, "one")
    (tmp_path / "lazy_helper.py").write_text("TAG = 'edited'\nNOISE = 1.0\n")
    after = user_imports(model_file)
    assert after["lazy_helper"] != before["lazy_helper"]
    assert {k: v for k, v in after.items() if k != "lazy_helper"} == {k: v for k, v in before.items()
                                                                     if k != "lazy_helper"}
    assert build(model_file).used == ("one", 1.0, "edited")


def test_the_scan_is_the_same_with_the_model_folder_on_sys_path(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Snakemake puts a project's folder on ``sys.path`` when it plans; a fit job does not: both
    must record the same imports, or every plan would refit everything."""
    from batchfit.model.imports import scan

    model_file = beside(tmp_path, "one")
    (tmp_path / "tabnanny.py").write_text("raise RuntimeError('a library import reached the model folder')\n")
    (tmp_path / "helpers.py").write_text("import tabnanny\n" + (tmp_path / "helpers.py").read_text())
    without = scan(model_file)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert scan(model_file) == without
    assert "tabnanny" not in without.modules and set(without.shadowed) == {"tabnanny"}


def test_a_file_beside_the_model_never_replaces_a_library_module(tmp_path: Path) -> None:
    from batchfit.errors import ModelContractError

    assert "tabnanny" not in sys.modules  # a standard library module nothing here imports
    (tmp_path / "imports").mkdir()
    (tmp_path / "imports" / "numpy.py").write_text("raise RuntimeError('the model folder numpy')\n")
    model_file = beside(tmp_path / "imports", "one", "import numpy as np\n" + BESIDE_MODEL)
    with pytest.raises(ModelContractError, match=r"numpy\.py beside model\.py has the name of the module 'numpy' "
                                                 r"\(.*numpy/__init__\.py\).*rename numpy\.py"):
        build(model_file)
    # Beside a model that does not import it, the file stays out of the way of the library's.
    (tmp_path / "ignores").mkdir()
    (tmp_path / "ignores" / "tabnanny.py").write_text("raise RuntimeError('the model folder tabnanny')\n")
    assert build(beside(tmp_path / "ignores", "two")).used == ("two", 1.0, "two")
    try:
        import tabnanny

        assert Path(tabnanny.__file__).parent == Path(os.__file__).parent
    finally:
        sys.modules.pop("tabnanny", None)


def test_a_missing_module_names_the_model_folder(tmp_path: Path) -> None:
    from batchfit.errors import ModelContractError

    model_file = beside(tmp_path, "one", "from helpers_missing import X\n" + BESIDE_MODEL)
    folder = re.escape(str(tmp_path))
    with pytest.raises(ModelContractError, match=rf"No module named 'helpers_missing'.*its own folder, {folder}"):
        build(model_file)


# --- a project whose model imports modules beside it, end to end ---------------------------------

PROJECT_MODEL = """
import pymc as pm

from helpers import PRIOR_SD, draw


def build_model(data):
    import noise  # imported when the model is built, in whichever process builds it

    with pm.Model() as model:
        y = pm.Data("y", data["y"])
        mu = pm.Normal("mu", 0.0, PRIOR_SD)
        sigma = pm.HalfNormal("sigma", noise.SCALE)
        pm.Normal("y_obs", mu, sigma, observed=y, shape=y.shape)
    return model


def simulate(rng, index):
    return draw(rng, 15)
"""
PROJECT_FILES = {
    "model.py": PROJECT_MODEL,
    "helpers.py": ("import pandas as pd\n\nPRIOR_SD = 1.0\n\n\ndef draw(rng, n):\n"
                   "    return pd.DataFrame({'y': rng.normal(0.3, 1.0, n).round(4)})\n"),
    "noise.py": "SCALE = 1.0\n",
}


def run(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def planned_jobs(root: Path) -> dict[str, int]:
    """The jobs a dry run of the sweep would run, by rule."""
    out = run([str(BIN / "snakemake"), "-n", "--cores", "2"], root)
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", out, re.M)}


@pytest.mark.slow
def test_a_project_whose_model_imports_modules_beside_it_checks_sweeps_and_calibrates(
        tmp_path: Path, session_cache: Path) -> None:
    """`batchfit init`, then a model importing ``helpers`` (at the top) and ``noise`` (inside
    build_model) from its folder: simulate, check, a `snakemake --cores 2` sweep (compile workers,
    a fit job of two lanes: one chain on two threads) and SBC all import them, and editing one
    refits the sweep."""
    root = tmp_path / "project"
    run([str(BIN / "batchfit"), "init", str(root)], tmp_path)
    for path in (root / "data").glob("*.csv"):
        path.unlink()
    for name, text in PROJECT_FILES.items():
        (root / name).write_text(text)
    run([str(BIN / "batchfit"), "simulate", "--model", "model.py", "--n", "3", "--out", "data"], root)
    write_config(root / "config.yaml", {
        "model": "model.py", "datasets": ["data/*.csv"], "cache_dir": str(session_cache),
        "sampler": {"draws": 100, "tune": 100, "chains": 1, "seed": 3}, "batch_size": 3,
        "sbc": {"n_simulations": 4, "thin": 2, "seed": 7}})

    assert "check: ok" in run([str(BIN / "batchfit"), "check", "--config", "config.yaml"], root)
    run([str(BIN / "snakemake"), "--cores", "2"], root)
    datasets = pd.read_csv(root / "results" / "datasets.csv")
    assert sorted(datasets["dataset"]) == ["dataset_000", "dataset_001", "dataset_002"]
    assert "failed" not in set(datasets["status"])
    [log] = (root / "results" / "logs" / "fit").glob("*.log")
    assert "fitting 2 datasets at once: this process and 1 helper process" in log.read_text()  # two lanes
    imports = {name: sha256(root / f"{name}.py") for name in ("helpers", "noise")}
    with xr.open_datatree(root / "results" / "fits" / "dataset_001.nc") as tree:
        assert json.loads(tree.attrs["model_imports"]) == imports

    run([str(BIN / "snakemake"), "--cores", "2", "sbc"], root)
    assert (root / "results" / "sbc" / "verdict.txt").read_text().startswith("SBC ")
    assert len(list((root / "results" / "sbc" / "fits").glob("*.nc"))) == 4

    assert "fit" not in planned_jobs(root)  # the plan (Snakemake's process) agrees with what the fits recorded
    (root / "noise.py").write_text("SCALE = 1.5\n")
    jobs = planned_jobs(root)
    assert jobs.get("fit") == 1 and jobs.get("compile") == 1, jobs


def test_the_jobs_that_build_the_model_declare_its_local_imports_as_inputs(tmp_path: Path) -> None:
    """A job reads the helper modules beside the model file: they are inputs, so Snakemake stages them (#46)."""
    model = HIERARCHICAL.read_text().replace("import pymc as pm\n", "import pymc as pm\nimport bf_helper  # noqa\n", 1)
    assert "import bf_helper" in model
    (tmp_path / "model.py").write_text(model)
    (tmp_path / "bf_helper.py").write_text("SCALE = 1.0\n")
    (tmp_path / "data").mkdir()
    for source in sorted((REPO / "data" / "example").glob("*.csv"))[:2]:
        (tmp_path / "data" / source.name).write_text(source.read_text())
    config = write_config(tmp_path / "config.yaml", {
        "model": str(tmp_path / "model.py"), "datasets": ["data/*.csv"], "columns": {"group": {"scope": "dataset"}},
        "cache_dir": str(tmp_path / "cache"), "results_dir": "results"})
    # --touch marks every output made (no job runs), so that --detailed-summary lists each output's
    # rule and the inputs Snakemake resolved for its job (input functions included).
    touched = snakemake(tmp_path, config, "--touch")
    assert touched.returncode == 0, touched.stderr[-3000:]
    run = snakemake(tmp_path, config, "--detailed-summary")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split("\t") for line in run.stdout.splitlines()]
    header = rows[0]
    inputs = {row[header.index("rule")]: row[header.index("input-file(s)")].split(",") for row in rows[1:]
              if len(row) == len(header)}
    for rule in ("compile", "fit"):
        assert str(tmp_path / "bf_helper.py") in inputs[rule], (rule, inputs.get(rule))
