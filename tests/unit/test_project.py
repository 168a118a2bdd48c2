"""A project of one's own: `batchfit init`, batchfit's workflow as a Snakemake module, the wheel that
ships it, `batchfit status`, and the notebook entry points, against a real sweep outside the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from testkit import REPO, write_config

import batchfit
from batchfit.compile.fingerprint import structure_of
from batchfit.config import config_from_dict, config_to_dict, load_config
from batchfit.errors import BatchfitError
from batchfit.model.model_file import data_containers
from batchfit.project import config_template, init_project
from batchfit.schema import config_schema

BIN = Path(sys.executable).parent
IDS = ["dataset_000", "dataset_001", "dataset_002"]
BAD = "dataset_bad"  # sorts after the others: the reference dataset stays dataset_000


# --- the config template -------------------------------------------------------------------------------------

def _schema_keys(spec: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, child in spec.get("properties", {}).items():
        keys |= {prefix + name} | _schema_keys(child, f"{prefix}{name}.")
    extra = spec.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        keys |= {f"{prefix}*"} | _schema_keys(extra, f"{prefix}*.")
    return keys


def _uncommented(template: str) -> dict:
    """The template with the '# ' of every setting line removed (descriptions stay comments), as YAML."""
    lines = []
    for line in template.splitlines():
        rest = line[2:] if line.startswith("# ") else line
        if re.match(r"\s*\w+:( |$)", rest):
            lines.append(rest)
    return yaml.safe_load("\n".join(lines))


def _keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in data.items():
        label = "*" if prefix == "columns." else name
        keys |= {prefix + label}
        if isinstance(value, dict):
            keys |= _keys(value, f"{prefix}{label}.")
    return keys


def test_config_template_has_every_schema_key_with_its_default():
    template = config_template()
    full = _uncommented(template)
    assert _keys(full) == _schema_keys(config_schema())
    for key in _schema_keys(config_schema()):
        leaf = key.rsplit(".", 1)[-1]
        assert leaf == "*" or re.search(rf"^(# )?\s*{re.escape(leaf)}:", template, re.M)
    # Every default shown is the one batchfit fills in (the per-column example has none to show).
    del full["columns"]
    shown = config_to_dict(config_from_dict(full))
    defaults = config_to_dict(config_from_dict({"model": full["model"], "datasets": full["datasets"]}))
    assert shown == defaults
    # As written, only model and datasets are set.
    assert set(yaml.safe_load(template)) == {"model", "datasets"}


# --- init ----------------------------------------------------------------------------------------------------

def test_init_refuses_to_overwrite_and_writes_nothing_then(tmp_path):
    (tmp_path / "Snakefile").write_text("# mine\n")
    with pytest.raises(BatchfitError, match="Snakefile.*refusing to overwrite"):
        init_project(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Snakefile"]
    assert (tmp_path / "Snakefile").read_text() == "# mine\n"


def test_init_beside_the_users_data_writes_no_example_data_and_says_so(tmp_path):
    (tmp_path / "data").mkdir()
    pd.DataFrame({"ID": [1, 1], "y": [0.1, 0.2]}).to_csv(tmp_path / "data" / "pk.csv", index=False)
    run = subprocess.run([str(BIN / "batchfit"), "init", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["pk.csv"]
    assert "already holds 1 file(s) of yours, so no example data were written" in run.stdout
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "model.py").is_file()


def test_the_template_model_is_the_bundled_example():
    """`batchfit init`'s model is a copy of models/hierarchical.py (the wheel has no models/): one example."""
    template = REPO / "src" / "batchfit" / "template" / "model.py.template"
    assert template.read_text() == (REPO / "models" / "hierarchical.py").read_text()


def _code(snakefile: Path) -> list[str]:
    return [line for line in snakefile.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_the_repositorys_snakefile_is_a_projects_with_the_examples_config():
    """The repository runs batchfit's workflow as a `batchfit init` project does: the package's, as a module."""
    project = _code(REPO / "src" / "batchfit" / "template" / "Snakefile")
    assert _code(REPO / "Snakefile") == [line.replace('"config.yaml"', '"config/config.yaml"') for line in project]
    assert batchfit.workflow_snakefile() == REPO / "src" / "batchfit" / "workflow" / "Snakefile"


def test_init_cli_twice_fails_with_a_clear_message(tmp_path):
    first = subprocess.run([str(BIN / "batchfit"), "init", str(tmp_path / "p")], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([str(BIN / "batchfit"), "init", str(tmp_path / "p")], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 2
    assert "config.yaml" in again.stderr and "refusing to overwrite" in again.stderr


# --- the wheel -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_wheel_ships_the_workflow_and_a_project_runs_it_from_there(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), "-q"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    [wheel] = (tmp_path / "dist").glob("batchfit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "src" / "batchfit"
    shipped = {str(path.relative_to(package.parent)) for folder in ("workflow", "template")
               for path in (package / folder).rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert "batchfit/workflow/Snakefile" in shipped and shipped - names == set()

    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), "-q",
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}  # the wheel's batchfit, not the repository's
    project = tmp_path / "project"
    init = subprocess.run([sys.executable, "-m", "batchfit.cli", "init", str(project)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    where = subprocess.run([sys.executable, "-c", "import batchfit; print(batchfit.workflow_snakefile())"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=project)
    snakefile = Path(where.stdout.strip())
    assert snakefile.is_relative_to(site) and snakefile.is_file() and not snakefile.is_symlink()
    dry = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "2"], env=env, cwd=project,
                         capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-3000:]
    assert re.search(r"^fit\s+1$", dry.stdout, re.M) and re.search(r"^collect\s+1$", dry.stdout, re.M)


# --- a real sweep in a project folder ------------------------------------------------------------------------

USER_RULE = """

rule summary_lines:
    input:
        rules.collect.output.summary,
    output:
        "results/summary_lines.txt",
    shell:
        "wc -l < {input} > {output}"
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, hierarchical_entry: Path) -> Path:
    """`batchfit init` in a temporary folder, one dataset that fails added, swept with `snakemake --cores 2`.

    Short chains, and the session cache (the example model is the bundled one: its compile is shared).
    """
    root = tmp_path_factory.mktemp("project") / "my-project"
    init = subprocess.run([str(BIN / "batchfit"), "init", str(root)], capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    bad = pd.read_csv(root / "data" / "dataset_000.csv").astype({"y": object})
    bad.loc[3, "y"] = "oops"
    bad.to_csv(root / "data" / f"{BAD}.csv", index=False)
    with open(root / "config.yaml", "a") as f:  # the user's settings, below the generated ones
        f.write(f"sampler: {{draws: 150, tune: 150, chains: 2}}\nbatch_size: 2\ncache_dir: {hierarchical_entry}\n")
    with open(root / "Snakefile", "a") as f:  # a rule of the user's own, on batchfit's output
        f.write(USER_RULE)
    # --keep-going: the user's rule runs whatever else fails.
    run = subprocess.run([str(BIN / "snakemake"), "--cores", "2", "--keep-going", "all", "summary_lines"], cwd=root,
                         capture_output=True, text=True, timeout=900)
    # The failed dataset makes the run exit 1 (the project's onsuccess, batchfit.end_run), batchfit's lines last.
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-3000:]
    assert f"  1 dataset ({BAD}): " in run.stderr and "Error in rule" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.rstrip().splitlines()[-1].startswith("batchfit: each failure"), run.stderr[-3000:]
    return root


@pytest.mark.slow
def test_snakemake_in_the_project_folder_fits_every_dataset(project):
    summary = pd.read_csv(project / "results" / "summary.csv")
    datasets = pd.read_csv(project / "results" / "datasets.csv")
    fitted = summary[summary["dataset"].isin(datasets.loc[datasets["status"] != "failed", "dataset"])]
    assert sorted(fitted["dataset"].unique()) == IDS
    for d in IDS:  # a row per parameter of the model, for every dataset
        assert {"mu_a", "sigma_a", "b", "sigma"} <= set(fitted.loc[fitted["dataset"] == d, "parameter"])
        with xr.open_datatree(project / "results" / "fits" / f"{d}.nc") as fit:
            assert fit["posterior"].sizes["draw"] == 150 and fit["posterior"].sizes["chain"] == 2
    assert list(datasets.loc[datasets["status"] == "failed", "dataset"]) == [BAD]
    assert list(pd.read_csv(project / "results" / "failures.csv")["dataset"]) == [BAD]
    assert not (project / "results" / "fits" / f"{BAD}.nc").exists()
    lines = (project / "results" / "summary.csv").read_text().count("\n")
    assert int((project / "results" / "summary_lines.txt").read_text()) == lines  # the user's own rule ran
    # The sweep's own plan was recorded by the project's onstart (cluster jobs read it).
    plan = json.loads((project / "results" / "plan.json").read_text())
    assert sorted(plan["datasets"]) == sorted([*IDS, BAD])


# --- batchfit status -----------------------------------------------------------------------------------------

def status(project: Path, *args: str, config: str = "config.yaml") -> str:
    run = subprocess.run([str(BIN / "batchfit"), "status", "--config", config, *args], cwd=project,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.slow
def test_status_counts_what_collect_reported(project):
    datasets = pd.read_csv(project / "results" / "datasets.csv")
    fitted = int((datasets["status"] != "failed").sum())
    failed = pd.read_csv(project / "results" / "failures.csv")["dataset"].nunique()
    out = status(project)
    assert f"{fitted + failed} dataset(s): {fitted} fitted, 0 pending, {failed} failed" in out
    assert f"failed:\n  1 dataset ({BAD}): at " in out
    assert "time left: none, nothing is pending" in out


@pytest.mark.slow
def test_status_of_a_sweep_with_new_and_changed_datasets_reads_only(project, tmp_path):
    # Another config of the same project: one more dataset, in a folder of its own.
    shutil.copy(project / "data" / "dataset_001.csv", tmp_path / "dataset_new.csv")
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["datasets"].append(str(tmp_path / "*.csv"))
    write_config(tmp_path / "more.yaml", config)
    before = {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*")}
    out = status(project, config=str(tmp_path / "more.yaml"))
    assert "5 dataset(s): 3 fitted, 1 pending, 1 failed" in out
    assert "pending: dataset_new" in out
    # Timed from the sweep's fits (written since its plan.json): some estimate, never "unknown".
    assert re.search(r"time left: about \d+ (s|min|h) for 1 pending dataset", out), out
    assert "never fitted" in status(project, "--dataset", "dataset_new", config=str(tmp_path / "more.yaml"))
    assert {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*")} == before  # nothing written

    # Other sampler settings: every fit's provenance differs, so every dataset is pending again.
    config["sampler"]["draws"] = 151
    write_config(tmp_path / "changed.yaml", config)
    out = status(project, "--dataset", "dataset_001", config=str(tmp_path / "changed.yaml"))
    assert out.startswith("dataset_001: pending (its fit's provenance differs from the config's")


@pytest.mark.slow
def test_status_of_one_dataset_shows_its_state_and_log_lines(project):
    row = pd.read_csv(project / "results" / "datasets.csv").set_index("dataset").loc["dataset_001"]
    out = status(project, "--dataset", "dataset_001")
    assert out.startswith(f"dataset_001: fitted ({row['status']}; {row['rows']} rows, {row['groups']}")
    log = [line for line in out.splitlines() if line.startswith("  ")]
    assert any(re.search(r"INFO batch-\w+ holds 2 dataset\(s\): dataset_000 dataset_001$", line) for line in log), out
    assert any(re.search(r"INFO dataset_001: fitted in [\d.]+ s(, sampler warning: .+)?$", line) for line in log), out
    assert not any("dataset_002" in line for line in log if " holds " not in line)

    failure = json.loads((project / "results" / "failures" / f"{BAD}.json").read_text())
    out = status(project, "--dataset", BAD)
    assert out.startswith(f"{BAD}: failed (at {failure['stage']}: {failure['message']})")
    assert re.search(rf"INFO {BAD}: failed in [\d.]+ s", out) and "oops" in out


def test_status_of_an_unknown_dataset_names_it_and_the_config(tmp_path):
    init_project(tmp_path)
    run = subprocess.run([str(BIN / "batchfit"), "status", "--config", "config.yaml", "--dataset", "nope"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "dataset 'nope'" in run.stderr and "config.yaml" in run.stderr
    out = status(tmp_path)  # a sweep not started: everything pending, nothing timed
    assert "3 dataset(s): 0 fitted, 3 pending, 0 failed" in out and "time left: unknown" in out


# --- notebook entry points -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_build_model_gives_the_model_and_data_the_sweep_fitted(project, monkeypatch):
    monkeypatch.chdir(project)  # the config's paths are relative to the project
    config = load_config("config.yaml")
    for d in IDS:
        model = batchfit.build_model("config.yaml", d)
        data = batchfit.load_dataset(config, d)
        with xr.open_datatree(config.layout.fit(d)) as fit:
            assert structure_of(model) == fit.attrs["structure"]
            stored = {**fit["constant_data"].to_dataset().data_vars, **fit["observed_data"].to_dataset().data_vars}
            containers = data_containers(model)
            for name, container in containers.items():
                value = container.get_value()
                np.testing.assert_array_equal(value, data[name])  # load_dataset: the file as read, not cast
                if name in stored:  # build_model: cast to the model's dtypes as the fit was
                    np.testing.assert_array_equal(value, stored[name].values)
                    assert value.dtype == stored[name].dtype, name
            assert {"x", "group"} <= set(containers) & set(stored)  # compared above
            np.testing.assert_array_equal(fit["observed_data"]["y_obs"].values, data["y"])
            assert list(model.coords["groups"]) == list(data.coords["group"])
            assert list(fit["posterior"]["a"].coords["groups"].values) == list(data.coords["group"])


@pytest.mark.slow
def test_build_model_raises_what_the_fit_recorded_and_load_dataset_reads_the_file(project, monkeypatch):
    monkeypatch.chdir(project)
    recorded = json.loads((project / "results" / "failures" / f"{BAD}.json").read_text())
    with pytest.raises(BatchfitError) as raised:
        batchfit.build_model("config.yaml", BAD)
    assert str(raised.value) == recorded["message"]
    data = batchfit.load_dataset("config.yaml", BAD)  # builds no model, so checks nothing the model needs
    assert list(data["y"].astype(str)) == list(pd.read_csv(project / "data" / f"{BAD}.csv")["y"].astype(str))
    with pytest.raises(BatchfitError, match="no dataset 'nope'"):
        batchfit.load_dataset("config.yaml", "nope")
