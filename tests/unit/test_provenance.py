"""Provenance: a fit is redone exactly when what determines it changes (content, never mtimes).

Three tiny datasets are fitted once per module (50 + 50 draws, one chain); each test copies that
project, changes one thing and asks `plan` (what Snakemake runs at every parse) which datasets are
pending. References are computed independently: sha256 of the files with hashlib, the sampler
settings from the config dict.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr
from testkit import HIERARCHICAL as MODEL
from testkit import planned_jobs, snakemake, sweep_settings, write_config

from batchfit.config import Config, config_from_dict
from batchfit.errors import BatchfitError
from batchfit.model.simulate import simulate_datasets
from batchfit.schema import config_schema
from batchfit.sweep.collect_job import run_collect
from batchfit.sweep.plan import compile_stamp_path, compiled_bundle_path, plan
from batchfit.sweep.stages import run_compile, run_fit

IDS = ["shop_000", "shop_001", "shop_002"]
SAMPLER = {"draws": 50, "tune": 50, "chains": 1, "target_accept": 0.8, "seed": 5}


def settings(root: Path, cache: Path, **changes: object) -> dict:
    """The sweep's config (absolute paths, so the project can be copied); ``changes`` override keys,
    a section's settings one by one."""
    return sweep_settings(cache, model=str(root / "model.py"), datasets=[str(root / "data" / "*.csv")],
                          sampler=dict(SAMPLER), batch_size=2, results_dir=str(root / "results"), update=changes)


def pending(config: Config) -> list[str]:
    return sorted(d for members in plan(config).batches.values() for d in members)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """A project (model.py, data/, results/) whose three datasets are fitted."""
    root = tmp_path_factory.mktemp("fitted")
    shutil.copy(MODEL, root / "model.py")
    simulate_datasets(MODEL, root / "data", len(IDS), seed=3, prefix="shop")
    assert run_fit(config_from_dict(settings(root, session_cache))) == 0
    return root


@pytest.fixture
def project(fitted: Path, tmp_path: Path) -> Path:
    """A private copy of the fitted project (timestamps kept), for a test to change."""
    root = tmp_path / "project"
    shutil.copytree(fitted, root)
    return root


def test_a_fit_records_its_provenance(fitted: Path, session_cache: Path) -> None:
    config = config_from_dict(settings(fitted, session_cache))
    for dataset_id in IDS:
        data = fitted / "data" / f"{dataset_id}.csv"
        with xr.open_datatree(config.layout.fit(dataset_id)) as tree:
            attrs = dict(tree.attrs)
            assert tree["posterior"].ds.sizes["draw"] == SAMPLER["draws"]
        recorded = json.loads(attrs["sampler"])  # every sampler setting: those given, the schema's defaults
        specs = config_schema()["properties"]["sampler"]["properties"]
        defaults = {name: spec["default"] for name, spec in specs.items()}
        assert recorded == {**defaults, **SAMPLER} and set(recorded) == set(defaults)
        assert json.loads(attrs["outputs"]) == {"log_likelihood": False, "posterior_predictive": False,
                                                  "var_names": None, "filter_vars": None, "sensitivity": False}
        assert json.loads(attrs["params"]) == {}  # build_model's keyword parameters (#48)
        assert attrs["model_hash"] == hashlib.sha256(MODEL.read_bytes()).hexdigest()
        assert attrs["data_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
        versions = json.loads(attrs["versions"])
        assert versions["pymc"] == __import__("pymc").__version__
        assert versions["nutpie"] == __import__("nutpie").__version__
        assert versions["batchfit"] == __import__("batchfit").__version__
        assert re.fullmatch(r"[0-9a-f]{64}", attrs["provenance"]) and attrs["compile_key"]
        sidecar = json.loads(config.layout.fit(dataset_id).with_suffix(".json").read_text())
        assert sidecar["provenance"] == attrs["provenance"]
    digests = {dataset_id: xr.open_datatree(config.layout.fit(dataset_id)).attrs["provenance"] for dataset_id in IDS}
    assert len(set(digests.values())) == len(IDS)  # each dataset's own data


def test_nothing_is_pending_after_the_fit(fitted: Path, session_cache: Path) -> None:
    assert pending(config_from_dict(settings(fitted, session_cache))) == []


@pytest.mark.parametrize("changes", [
    pytest.param({"sampler": {"draws": 60}}, id="draws"),
    pytest.param({"sampler": {"tune": 60}}, id="tune"),
    pytest.param({"sampler": {"chains": 2}}, id="chains"),
    pytest.param({"sampler": {"target_accept": 0.9}}, id="target_accept"),
    pytest.param({"sampler": {"seed": 6}}, id="seed"),
    *(pytest.param({"sampler": {name: value}}, id=name) for name, value in [
        ("max_treedepth", 8), ("adaptation", "low_rank"), ("mass_matrix_switch_freq", 40),
        ("early_window_switch_freq", 5), ("store_divergences", True), ("store_unconstrained", True),
        ("store_gradient", True), ("store_mass_matrix", True), ("initvals", {"mu": 0.5}), ("jitter_rvs", []),
        ("discard_tuned_samples", False), ("step", {"mu": "slice"})]),
    pytest.param({"sampler": {"adaptation": "low_rank", "mass_matrix_eigval_cutoff": 10.0}}, id="eigval_cutoff"),
    pytest.param({"sampler": {"adaptation": "low_rank", "mass_matrix_gamma": 1e-3}}, id="gamma"),
    pytest.param({"outputs": {"log_likelihood": True}}, id="log_likelihood"),
    pytest.param({"outputs": {"posterior_predictive": True}}, id="posterior_predictive"),
    pytest.param({"outputs": {"log_likelihood": True, "sensitivity": True}}, id="sensitivity"),
    pytest.param({"params": {"prior_scale": 2.0}}, id="params"),
])
def test_a_changed_setting_makes_every_dataset_pending(fitted: Path, session_cache: Path, changes: dict) -> None:
    assert pending(config_from_dict(settings(fitted, session_cache, **changes))) == IDS


def test_settings_that_do_not_shape_a_fit_leave_it_alone(fitted: Path, session_cache: Path) -> None:
    config = settings(fitted, session_cache, batch_size=1, on_error="stop",
                      health={"max_r_hat": 1.5, "min_ess_tail": 10, "max_treedepth_fraction": 0.5, "min_bfmi": 0.1})
    assert pending(config_from_dict(config)) == []


def test_a_changed_model_file_makes_every_dataset_pending(project: Path, session_cache: Path) -> None:
    config = config_from_dict(settings(project, session_cache))
    model = project / "model.py"
    model.write_text(model.read_text() + "\n# a comment is a change of content\n")
    assert pending(config) == IDS


def test_the_model_file_counts_by_content_not_by_name(project: Path, session_cache: Path) -> None:
    shutil.copy(project / "model.py", project / "renamed.py")
    assert pending(config_from_dict(settings(project, session_cache, model=str(project / "renamed.py")))) == []


def test_an_edited_helper_module_of_the_model_makes_every_dataset_pending(
        project: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model taking a prior scale from the user's own package (on PYTHONPATH, as an editable
    install would be): editing that package's module refits every dataset, as editing the model
    file does; writing back the same content refits nothing."""
    lib = project / "lib"
    (lib / "bf_prov_priors").mkdir(parents=True)
    (lib / "bf_prov_priors" / "__init__.py").write_text("from .scales import SLOPE_SD\n")
    scales = lib / "bf_prov_priors" / "scales.py"
    scales.write_text("SLOPE_SD = 2.0\n")
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.setenv("PYTHONPATH", str(lib))  # for a compile worker, should the entry be missing
    model = project / "model.py"
    text = model.read_text().replace("import pymc as pm\n", "import pymc as pm\nfrom bf_prov_priors import SLOPE_SD\n")
    model.write_text(text.replace('pm.Normal("b", 0.0, 2.0)', 'pm.Normal("b", 0.0, SLOPE_SD)'))
    assert "SLOPE_SD)" in model.read_text()
    config = config_from_dict(settings(project, session_cache))
    try:
        assert run_fit(config) == 0
        assert pending(config) == []
        with xr.open_datatree(config.layout.fit(IDS[0])) as tree:
            assert sorted(json.loads(tree.attrs["model_imports"])) == ["bf_prov_priors", "bf_prov_priors.scales"]
        scales.write_text("SLOPE_SD = 2.5\n")
        assert pending(config) == IDS
        scales.write_text("SLOPE_SD = 2.0\n")
        assert pending(config) == []
    finally:  # the fit imported them into this process
        for name in [n for n in sys.modules if n.startswith("bf_prov_priors")]:
            monkeypatch.delitem(sys.modules, name)


def test_an_edited_module_beside_the_model_makes_every_dataset_pending(project: Path, session_cache: Path) -> None:
    """A model taking a prior scale from ``priors.py`` beside it (no PYTHONPATH): the fit imports it,
    records it, and editing it refits every dataset and compiles again; writing back the same content
    refits nothing."""
    priors = project / "priors.py"
    priors.write_text("SLOPE_SD = 2.0\n")
    model = project / "model.py"
    text = model.read_text().replace("import pymc as pm\n", "import pymc as pm\nfrom priors import SLOPE_SD\n")
    model.write_text(text.replace('pm.Normal("b", 0.0, 2.0)', 'pm.Normal("b", 0.0, SLOPE_SD)'))
    config = config_from_dict(settings(project, session_cache))
    assert run_fit(config) == 0
    assert pending(config) == []
    with xr.open_datatree(config.layout.fit(IDS[0])) as tree:
        assert json.loads(tree.attrs["model_imports"]) == {"priors": hashlib.sha256(priors.read_bytes()).hexdigest()}
    stamp = compile_stamp_path(config)
    priors.write_text("SLOPE_SD = 2.5\n")
    assert pending(config) == IDS
    assert compile_stamp_path(config) != stamp
    priors.write_text("SLOPE_SD = 2.0\n")
    assert pending(config) == [] and compile_stamp_path(config) == stamp


@pytest.mark.parametrize("subpackage",
                         ["common", "compat", "records", "data", "model", "cache", "numba_ops", "compile", "fitting"])
def test_the_code_digest_covers_every_subpackage_a_fit_runs(tmp_path: Path, subpackage: str) -> None:
    """Editing any module of a subpackage on the fitting path changes every fit's code digest (so
    the plan refits); editing collect or the sweep's code (outputs/, sweep/) changes none."""
    import batchfit
    from batchfit.common.hashing import package_sources, sources_digest
    from batchfit.fitting.provenance import FIT_CODE, code_sha256

    def digest(package: Path) -> str:  # what code_sha256 computes of a package
        return sources_digest(package_sources(*FIT_CODE, package=package), root=package)

    package = Path(batchfit.__file__).parent
    assert digest(package) == code_sha256()
    copy = shutil.copytree(package, tmp_path / "batchfit", ignore=shutil.ignore_patterns("__pycache__"))
    modules = sorted((copy / subpackage).rglob("*.py"))
    assert len(modules) > 1, f"no modules in {subpackage}"
    for module in modules:  # every module: one the digest left out would be a fit that is never redone
        before = module.read_text()
        module.write_text(before + "\n# an edit\n")
        assert digest(copy) != digest(package), f"editing {module.relative_to(copy)} leaves the fits' digest"
        module.write_text(before)
    for outside in ("outputs/collect.py", "sweep/plan.py", "cli.py"):
        (copy / outside).write_text((copy / outside).read_text() + "\n# an edit\n")
    assert digest(copy) == digest(package)


def test_a_changed_data_file_makes_only_its_dataset_pending(project: Path, session_cache: Path) -> None:
    config = config_from_dict(settings(project, session_cache))
    data = project / "data" / "shop_001.csv"
    text = data.read_text()
    data.write_text(text + text.splitlines()[-1] + "\n")  # one more row
    assert pending(config) == ["shop_001"]


def test_touching_files_refits_nothing(project: Path, session_cache: Path) -> None:
    config = config_from_dict(settings(project, session_cache))
    files = [project / "model.py", *sorted((project / "data").glob("*.csv"))]
    past = time.time() - 3600
    for path in files:
        os.utime(path, (past, past))
    assert pending(config) == []  # now the digests of the data files are cached ...
    cached = json.loads((config.results_dir / "data_sha256.json").read_text())
    assert len(cached) == len(IDS)
    for path in files:  # ... and touching them invalidates the cache entries, not the fits
        path.touch()
    assert pending(config) == []


def test_a_rewrite_within_one_timestamp_tick_is_seen(project: Path, session_cache: Path) -> None:
    """A file rewritten with the same size and modification time just after it was hashed
    (coarse file-system clocks) is hashed again, not taken from the digest cache."""
    config = config_from_dict(settings(project, session_cache))
    data = project / "data" / "shop_002.csv"
    text = data.read_text()
    data.write_text(text)  # modified now: too recent for its digest to be cached
    stat = data.stat()
    assert pending(config) == []
    changed = text.replace("1", "2", 1)
    assert len(changed) == len(text) and changed != text
    data.write_text(changed)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert pending(config) == ["shop_002"]


def test_a_replaced_fit_is_read_itself_not_through_its_sidecar(project: Path, session_cache: Path,
                                                               tmp_path: Path) -> None:
    """An old fit planted over a current one (a restored backup) is pending, and collect refuses it."""
    other = settings(project, session_cache, sampler={"draws": 60}, results_dir=str(tmp_path / "other"))
    assert run_fit(config_from_dict(other), ["shop_001"]) == 0
    config = config_from_dict(settings(project, session_cache))
    shutil.copyfile(tmp_path / "other" / "fits" / "shop_001.nc", config.layout.fit("shop_001"))
    assert pending(config) == ["shop_001"]
    with pytest.raises(BatchfitError, match=r"1 of 3 fit\(s\) were made with other settings.*'shop_001'"):
        run_collect(config)
    assert not config.layout.summary.exists()  # nothing mixed, nothing written


def test_collect_names_every_stale_fit(project: Path, session_cache: Path) -> None:
    """After a settings change every fit is stale: collect counts and names them instead of mixing,
    before it reads and summarises any of them (each fit's summary is cached in summaries/)."""
    config = config_from_dict(settings(project, session_cache, sampler={"draws": 60}))
    message = r"3 of 3 fit\(s\) were made with other settings.*'shop_000', 'shop_001', 'shop_002'"
    with pytest.raises(BatchfitError, match=message):
        run_collect(config)
    assert not list((project / "results" / "summaries").glob("*.json"))
    report = run_collect(config_from_dict(settings(project, session_cache)))  # the fits' own config
    assert report.n_datasets == 3 and report.n_failed == 0


def test_collect_starts_its_helpers_first_and_each_exits(project: Path, session_cache: Path, monkeypatch,
                                                         caplog) -> None:
    """run_collect starts its helper processes before it knows which fits are new: they summarise
    their share when there are new fits, and are killed unused when there are none."""
    from batchfit.outputs import summary_pool

    monkeypatch.setattr(summary_pool, "FITS_PER_PROCESS", 1)
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(summary_pool.subprocess, "Popen", Recorded)
    config = config_from_dict(settings(project, session_cache))
    with caplog.at_level("INFO", logger="batchfit"):
        assert run_collect(config, workers=3).summarised_ids == list(IDS)
    assert "summarised 3 fits in 3 processes" in caplog.text
    assert len(started) == 2 and [proc.returncode for proc in started] == [0, 0]
    caplog.clear()
    with caplog.at_level("INFO", logger="batchfit"):
        assert run_collect(config, workers=3).summarised_ids == []  # every summary cached: nothing to share
    assert "processes" not in caplog.text
    assert len(started) == 4 and all(proc.returncode is not None for proc in started[2:])  # killed, unused


def snakemake_dry_run(root: Path, config: dict) -> dict[str, int]:
    """Jobs `snakemake -n` plans for ``config`` in ``root``, by rule."""
    proc = snakemake(root, write_config(root / "sweep.yaml", config), "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return planned_jobs(proc)


@pytest.mark.slow
def test_snakemake_dry_run_shows_exactly_the_affected_fits(project: Path, session_cache: Path) -> None:
    """After a sweep: batch manifests and the compile stamp exist, each newer than its inputs."""
    config = config_from_dict(settings(project, session_cache))
    # the compile rule's two outputs: its stamp, and the bundle fit jobs take as an input
    run_compile(config, bundle=compiled_bundle_path(config)).write(compile_stamp_path(config))
    manifests = min(p.stat().st_mtime for p in config.layout.batches.glob("*.json"))
    for output in (compile_stamp_path(config), compiled_bundle_path(config)):
        os.utime(output, (manifests - 1, manifests - 1))  # written before the fits
    for path in [project / "model.py", *(project / "data").glob("*.csv")]:
        os.utime(path, (manifests - 2, manifests - 2))
    jobs = snakemake_dry_run(project, settings(project, session_cache))
    assert "fit" not in jobs and "compile" not in jobs, jobs  # collect and status only: nothing to refit

    jobs = snakemake_dry_run(project, settings(project, session_cache, sampler={"draws": 300}))
    assert jobs.get("fit") == 2 and "compile" not in jobs, jobs  # all three datasets, in batches of 2
    # a setting that changes no compiled code, only how the datasets are sampled: the fits alone again
    jobs = snakemake_dry_run(project, settings(project, session_cache, sampler={"adaptation": "low_rank"}))
    assert jobs.get("fit") == 2 and "compile" not in jobs, jobs

    for path in [project / "model.py", *(project / "data").glob("*.csv")]:
        path.touch()
    jobs = snakemake_dry_run(project, settings(project, session_cache))
    assert "fit" not in jobs and "compile" not in jobs, jobs

    data = project / "data" / "shop_002.csv"
    data.write_text(data.read_text() + data.read_text().splitlines()[-1] + "\n")
    jobs = snakemake_dry_run(project, settings(project, session_cache))
    assert jobs.get("fit") == 1, jobs


def test_planning_a_known_sweep_imports_no_pandas(project: Path, session_cache: Path) -> None:
    """Every `snakemake` start parses the Snakefile, whose rules import batchfit's planning, and plans the
    sweep; once a plan has read the data files' columns (the coding registry), planning reads no table,
    so batchfit adds no import of pandas to a start. Run in a plain Python with the rules' own imports:
    Snakemake's plugins may import pandas themselves (the SLURM executor's does)."""
    from batchfit.project import workflow_snakefile

    config = write_config(project / "sweep.yaml", settings(project, session_cache))
    rules = (workflow_snakefile().parent / "rules" / "common.smk").read_text()
    imports = re.findall(r"^from batchfit[\w.]* import .+$", rules, re.M)
    assert any(" plan," in line for line in imports), imports  # the rules plan with batchfit.sweep.plan.plan
    code = "\n".join([*imports, "import sys", "from batchfit.config import load_config",
                      f"plan(load_config({str(config)!r}))", "print('pandas' in sys.modules)"])

    def pandas_imported() -> bool:
        run = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        return run.stdout.split()[-1] == "True"

    assert pandas_imported()  # the first plan reads the files' columns
    assert not pandas_imported()
