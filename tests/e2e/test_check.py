"""``batchfit check`` reports, before any sampling, what the fit stage would run into: every bad
dataset (with its file and column), every baked-in value at once (with fixes that work as written),
the structure buckets and what differs between them, and the path each structure takes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from testkit import sweep_settings, table, write_config, write_variant_sweep

from batchfit import cli
from batchfit.config import config_from_dict
from batchfit.sweep.check import check_model

BAKED = textwrap.dedent("""\
    import numpy as np
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"severity": data.coords["severity"]}) as model:
            age = (data["age"] - 60) / 10                     # a derived array, baked in
            mu = pm.Normal("mu", 0.0, 1.0)
            beta = pm.Normal("beta", 0.0, 1.0)
            effect = pm.Normal("effect", 0.0, 1.0, dims="severity")
            pm.Normal("y", mu + beta * age + effect[data["severity"]], 1.0, observed=data["y"])
        return model
""")
# Following the first check's advice literally: pm.Data named after each column, the dimension renamed.
FIXED = textwrap.dedent("""\
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"severity_levels": data.coords["severity"]}) as model:
            age = pm.Data("age", data["age"])
            severity = pm.Data("severity", data["severity"])
            y = pm.Data("y", data["y"])
            mu = pm.Normal("mu", 0.0, 1.0)
            beta = pm.Normal("beta", 0.0, 1.0)
            effect = pm.Normal("effect", 0.0, 1.0, dims="severity_levels")
            pm.Normal("obs", mu + beta * (age - 60) / 10 + effect[severity], 1.0, observed=y, shape=y.shape)
        return model
""")
# A constant computed from the data (a prior centred on the data's mean): each dataset its own structure.
DATA_CONSTANT = FIXED.replace('mu = pm.Normal("mu", 0.0, 1.0)',
                              'mu = pm.Normal("mu", float(np.log(data["y"].mean())), 1.0)')
DATA_CONSTANT = "import numpy as np\n" + DATA_CONSTANT


def project(tmp_path: Path, source: str, n: int = 3, **overrides) -> object:
    """Three small datasets and a model file; the session's cache (checks compile into the config's cache)."""
    from conftest import SESSION_CACHE

    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for i in range(n):
        rng = np.random.default_rng(i)
        rows = 12 + i
        pd.DataFrame({"age": rng.integers(20, 90, rows), "severity": rng.choice(["low", "mid", "high"], rows),
                      "y": rng.gamma(2.0, 1.0, rows).round(3)}).to_csv(data / f"d{i}.csv", index=False)
    (tmp_path / "model.py").write_text(source)
    return config_from_dict({"model": str(tmp_path / "model.py"), "datasets": [str(data / "*.csv")],
                             "cache_dir": str(SESSION_CACHE), "results_dir": str(tmp_path / "results"),
                             **overrides})


def test_every_baked_in_value_is_reported_at_once_with_a_fix_that_works(tmp_path):
    report = check_model(project(tmp_path, BAKED))
    assert not report.ok and not report.dataset_problems
    assert set(report.own_compiles) == {"d0", "d1", "d2"}  # fitted, each by a compile of its own
    message = report.own_compiles["d1"]
    # the observed array and the index array, both at once, each with its variable
    assert "column 'y'" in message and "column 'severity'" in message, message
    assert "one entry per row, computed from the data" in message and "3 value(s)" in message, message
    assert "pm.Data('severity', data['severity'])" in message and "rename the dimension 'severity'" in message
    # Following the advice literally gives a model that passes.
    fixed = check_model(project(tmp_path, FIXED))
    assert fixed.ok, "\n".join(fixed.lines())
    [bucket] = fixed.buckets.values()
    assert sorted(bucket.datasets) == ["d0", "d1", "d2"] and bucket.path == "cached"


def test_a_constant_computed_from_the_data_is_named_as_a_structure_difference(tmp_path):
    report = check_model(project(tmp_path, DATA_CONSTANT, max_structures=2))
    assert len(report.buckets) == 3
    lines = "\n".join(report.lines())
    assert "variable 'mu'" in lines and "a value computed from the data" in lines, lines
    assert "more than max_structures: 2" in lines
    assert not report.ok


def test_check_names_the_path_of_a_structure_the_cached_path_cannot_take(tmp_path):
    source = FIXED.replace("import pymc as pm\n", "import pymc as pm\nimport pytensor\n").replace(
        'mu = pm.Normal("mu", 0.0, 1.0)', 'mu = pm.Normal("mu", pytensor.shared(0.0, name="centre"), 1.0)')
    report = check_model(project(tmp_path, source))
    [bucket] = report.buckets.values()
    assert bucket.path == "nutpie"
    assert any("centre" in reason for reason in bucket.reasons), bucket.reasons
    assert "nutpie's own compile" in "\n".join(report.lines())


@pytest.mark.parametrize("source", [FIXED])
def test_a_model_that_passes_check_compiles(tmp_path, source):
    from batchfit.sweep.stages import run_compile

    config = project(tmp_path, source)
    assert check_model(config).ok
    stamp = run_compile(config)
    assert stamp.path == "cached" and stamp.key


def _sized_model(n_groups: int, centres: np.ndarray) -> object:
    """A model taking a group count from the data as a Python int (a new structure per count)."""
    import pymc as pm

    with pm.Model() as model:
        pm.Normal("a", 0.0, 1.0, shape=(n_groups,))
        pm.Normal("b", centres, 1.0)
    return model


def test_a_structure_difference_names_the_values_of_constants_of_one_shape():
    """3 groups against 4: the differing constant has shape (1,) in both, so only its values tell."""
    from batchfit.sweep.check import structure_differences

    centres = np.arange(20.0)
    [line] = structure_differences(_sized_model(3, centres), _sized_model(4, centres))
    assert line.startswith("variable 'a': a constant is [4] here but [3] in the reference"), line


def test_a_structure_difference_in_a_long_array_names_its_first_differing_entry():
    from batchfit.sweep.check import structure_differences

    centres = np.arange(20.0)
    moved = centres.copy()
    moved[[7, 12]] = [7.5, -1.0]
    [line] = structure_differences(_sized_model(3, centres), _sized_model(3, moved))
    assert line.startswith("variable 'b': a constant is an array of shape (20,) holding 7.5 at [7] here but 7.0 "
                           "in the reference (2 of its 20 entries differ)"), line


# --- dataset problems: each bad dataset, with its file and column ---------------------------------


def test_check_lists_every_bad_dataset_with_file_and_column(small_project: Path, session_cache: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    data = small_project / "data"
    good = table(1, 30, 3)
    (data / "empty.csv").write_bytes(b"")
    (data / "latin1.csv").write_bytes(b"group,x,y\n\xe9t\xe9,1.0,2.0\n")
    (data / "notparquet.parquet").write_text("group,x,y\na,1,2\n")
    (data / "notes.txt").write_text("not a dataset\n")
    good.drop(columns="y").to_csv(data / "nocol.csv", index=False)
    good.assign(y=good["y"].astype(object).where(good.index != 4, "abc")).to_csv(data / "text.csv", index=False)
    good.assign(y=good["y"].where(good.index != 2, np.nan)).to_csv(data / "nan.csv", index=False)
    good.assign(x=good["x"].where(good.index != 5, np.inf)).to_csv(data / "inf.csv", index=False)
    good.to_csv(data / "a..b.csv", index=False)
    good.to_csv(data / "ctl\x01x.csv", index=False)
    (small_project / "other").mkdir()
    good.to_csv(small_project / "other" / "d_001.csv", index=False)  # same id as data/d_001.csv
    config = write_config(small_project / "sweep.yaml",
                          sweep_settings(session_cache, datasets=["data/*", "other/*.csv"]))
    monkeypatch.chdir(small_project)

    code = cli.main(["check", "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    expected = {  # a line of the report -> what it must say
        "data/empty.csv": ["dataset 'empty'", "the file is empty"],
        "data/latin1.csv": ["dataset 'latin1'", "cannot read the file as CSV"],
        "data/notparquet.parquet": ["dataset 'notparquet'", "cannot read the file as Parquet"],
        "data/notes.txt": ["dataset 'notes'", "unsupported file type '.txt'"],
        "data/nocol.csv": ["column 'y'", "is missing", "available columns: 'group', 'x'"],
        "data/text.csv": ["column 'y'", "non-numeric values such as 'abc'"],
        "data/nan.csv": ["column 'y'", "missing (NaN) values", "first at row index 2"],
        "data/inf.csv": ["column 'x'", "infinite values", "first at row index 5"],
    }
    renamed = {  # files whose names are no usable ids: fitted under a safe id, which check names (#45)
        "data/a..b.csv": ["dataset 'a.b'", "cannot name output files"],
        "data/ctl\x01x.csv": ["dataset 'ctl_x'", repr("ctl\x01x")],
    }
    for file, fragments in {**expected, **renamed}.items():
        matching = [line for line in lines if file in line]
        assert len(matching) == 1, (file, out)
        assert all(f in matching[0] for f in fragments), (fragments, matching[0])
    shared = [line for line in lines if "other/d_001.csv" in line]  # one name, two files: both renamed
    assert len(shared) == 2 and all("data/d_001.csv" in line and "also the name of" in line for line in shared), out
    assert (f"check: {len(expected)} dataset(s) with {len(expected)} distinct problem(s), 0 sweep problem(s), "
            "0 structure(s)") in out
    assert not any("'d_000'" in line or "'d_002'" in line for line in lines), out
    assert "reference dataset: a.b" in out  # the first id, a renamed file's
    assert not (small_project / "results").exists()


BROKEN_VARIANT_MODEL = "def build_model(data, noise='normal'):\n    raise ValueError('this variant cannot build')\n"


def test_check_of_a_sweep_of_variants_checks_every_variant_or_the_one_named(tmp_path: Path, session_cache: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """One section a variant, each the report a check of that variant alone gives; exit 1 when any has a
    problem, and a last line naming those that have one."""
    config = write_variant_sweep(tmp_path, session_cache, 2)
    (tmp_path / "broken.py").write_text(BROKEN_VARIANT_MODEL)
    settings = yaml.safe_load(config.read_text())
    settings["variants"]["broken"] = {"model": "broken.py"}
    write_config(config, settings)
    monkeypatch.chdir(tmp_path)

    alone = {}
    for variant in ("normal", "student", "broken"):
        code = cli.main(["check", "--config", config.name, "--variant", variant])
        alone[variant] = capsys.readouterr().out.splitlines()
        assert code == (1 if variant == "broken" else 0), alone[variant]
        assert alone[variant][0] == f"variant {variant} (results/{variant}):", alone[variant]
    assert alone["normal"][-1] == alone["student"][-1] == "  check: ok"
    assert "this variant cannot build" in "\n".join(alone["broken"])

    code = cli.main(["check", "--config", config.name])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1, lines
    assert lines == [*alone["normal"], *alone["student"], *alone["broken"],
                     "check: 3 variants, problems in 1: broken"]
