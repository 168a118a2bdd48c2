"""One coding of text columns for the whole sweep, and data types checked against the model.

Expected codes are computed here from the files' own text (the label a code points to must be
the label the file holds), never copied from batchfit's output.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from batchfit.config import Config, config_from_dict
from batchfit.data.coding import sweep_coding
from batchfit.data.dataset import DataRequirement, check_dataset, load_dataset
from batchfit.data.labels import Coding
from batchfit.errors import ConfigError, DatasetError

INT = DataRequirement(ndim=1, dtype=np.dtype("int64"))

POISSON_MODEL = textwrap.dedent('''
    import pymc as pm

    def build_model(data):
        with pm.Model(coords={"sexes": data.coords["sex"]}) as model:
            sex = pm.Data("sex", data["sex"])
            count = pm.Data("count", data["count"])
            rate = pm.Normal("rate", 0.0, 1.0, dims="sexes")
            pm.Poisson("obs", pm.math.exp(rate[sex]), observed=count)
        return model
''')


def write(directory: Path, tables: dict[str, str]) -> dict[str, Path]:
    """CSV files from text, by dataset id, in id order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for dataset_id, text in sorted(tables.items()):
        paths[dataset_id] = directory / f"{dataset_id}.csv"
        paths[dataset_id].write_text(textwrap.dedent(text).lstrip())
    return paths


def sweep(tmp_path: Path, columns: dict | None = None, *, model: str = "m.py", started: bool = True) -> Config:
    """A sweep's config; ``started``: its results directory exists (a job has run), so the registry is kept."""
    if started:
        (tmp_path / "results").mkdir(exist_ok=True)
    return config_from_dict({"model": model, "datasets": [str(tmp_path / "data" / "*.csv")],
                             "results_dir": str(tmp_path / "results"), "columns": columns or {}},
                            source="sweep.yaml")


def test_a_sweep_that_has_not_started_writes_nothing_and_codes_from_the_data(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"s1": "sex\nM\n", "s2": "sex\nF\nM\n"})
    config = sweep(tmp_path, started=False)
    assert sweep_coding(config.data_sources, paths).labels["sex"].levels == ("F", "M")
    assert not (tmp_path / "results").exists()


def decoded(dataset, column: str) -> list[str]:
    """The labels a dataset's codes point to."""
    return [dataset.coords[column][code] for code in dataset[column]]


# --- one coding for the sweep ----------------------------------------------------------------------


def test_a_dataset_with_only_one_level_gets_that_levels_sweep_wide_code(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "sex,y\nF,1\nM,2\n", "b": "sex,y\nM,3\nM,4\n"})
    coding = sweep_coding(sweep(tmp_path).data_sources, paths)
    a, b = (load_dataset(d, p, coding) for d, p in paths.items())
    assert a.coords["sex"] == b.coords["sex"] == ("F", "M")  # sorted, from all datasets
    for data, path in ((a, paths["a"]), (b, paths["b"])):
        assert decoded(data, "sex") == pd.read_csv(path)["sex"].tolist()
    # per dataset (no sweep coding) "M" alone would be code 0, "F"'s code in dataset a
    assert load_dataset("b", paths["b"])["sex"].tolist() == [0, 0]


def test_listed_levels_fix_the_order(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "week\nW10\nW2\n", "b": "week\nW1\n"})
    default = sweep_coding(sweep(tmp_path).data_sources, paths)
    assert default.labels["week"].levels == tuple(sorted(["W10", "W2", "W1"]))  # text order: W1, W10, W2
    listed = sweep_coding(sweep(tmp_path, {"week": {"levels": ["W1", "W2", "W10"]}}).data_sources, paths)
    a = load_dataset("a", paths["a"], listed)
    assert a["week"].tolist() == [2, 1] and a.coords["week"] == ("W1", "W2", "W10")


def test_appearance_order_is_datasets_by_id_then_rows(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"b2": "g\nm\na\n", "b1": "g\nz\na\n"})
    coding = sweep_coding(sweep(tmp_path, {"g": {"order": "appearance"}}).data_sources, paths)
    assert coding.labels["g"].levels == ("z", "a", "m")
    assert decoded(load_dataset("b2", paths["b2"], coding), "g") == ["m", "a"]


def test_listed_levels_missing_a_value_name_dataset_file_column_value_and_row(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "sex\nF\nM\n", "b": "sex\nM\nX\nF\n"})
    coding = sweep_coding(sweep(tmp_path, {"sex": {"levels": ["F", "M"]}}).data_sources, paths)
    assert load_dataset("a", paths["a"], coding)["sex"].tolist() == [0, 1]
    with pytest.raises(DatasetError) as info:
        load_dataset("b", paths["b"], coding)
    message = str(info.value)
    for part in ("dataset 'b'", str(paths["b"]), "column 'sex'", "'X'", "row index 1", "columns.sex.levels"):
        assert part in message, (part, message)


def test_a_new_dataset_with_a_new_level_never_changes_existing_codes(tmp_path: Path, caplog) -> None:
    data = tmp_path / "data"
    paths = write(data, {"s1": "sex\nF\nM\n", "s2": "sex\nM\n"})
    config = sweep(tmp_path)
    before = sweep_coding(config.data_sources, paths)
    codes_before = {d: load_dataset(d, p, before)["sex"].tolist() for d, p in paths.items()}
    paths = {**paths, **write(data, {"s0": "sex\nA\nM\n"})}  # sorts first, and first by id
    with caplog.at_level(logging.WARNING, logger="batchfit"):
        after = sweep_coding(config.data_sources, dict(sorted(paths.items())))
    assert after.labels["sex"].levels == ("F", "M", "A")
    assert "no longer sorted" in caplog.text and "'A'" in caplog.text
    for dataset_id, codes in codes_before.items():
        assert load_dataset(dataset_id, paths[dataset_id], after)["sex"].tolist() == codes
    assert decoded(load_dataset("s0", paths["s0"], after), "sex") == ["A", "M"]
    # the coding a provenance digest sees changes with the levels, and is JSON
    assert before.for_dataset("s1") != after.for_dataset("s1")
    assert json.loads(config.layout.coding_registry.read_text())["levels"]["sex"]["levels"] == ["F", "M", "A"]
    # a fresh process reading the registry agrees
    assert sweep_coding(config.data_sources, dict(sorted(paths.items()))) == after


def test_a_changed_file_is_scanned_again(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "g\nx\n"})
    config = sweep(tmp_path)
    assert sweep_coding(config.data_sources, paths).labels["g"].levels == ("x",)
    paths["a"].write_text("g\nx\nnew-level\n")
    assert sweep_coding(config.data_sources, paths).labels["g"].levels == ("x", "new-level")


def test_per_dataset_scope_codes_within_each_file(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "g\nk\nb\n", "b": "g\nz\n"})
    coding = sweep_coding(sweep(tmp_path, {"g": {"scope": "dataset"}}).data_sources, paths)
    assert load_dataset("b", paths["b"], coding).coords["g"] == ("z",)
    assert load_dataset("a", paths["a"], coding).coords["g"] == ("b", "k")


def test_dataset_coding_is_json_and_loads_the_same(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "sex,n\nF,1\n", "b": "sex,n\nM,2\n"})
    coding = sweep_coding(sweep(tmp_path).data_sources, paths)
    value = json.loads(json.dumps(coding.for_dataset("b")))
    assert set(value) == {"sex"}  # numeric columns need no coding
    again = load_dataset("b", paths["b"], Coding.from_json(value))
    assert again["sex"].tolist() == load_dataset("b", paths["b"], coding)["sex"].tolist() == [1]


def test_a_columns_entry_naming_no_column_is_a_config_error(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "sex\nF\n"})
    with pytest.raises(ConfigError) as info:
        sweep_coding(sweep(tmp_path, {"sx": {"order": "appearance"}}).data_sources, paths)
    assert info.value.key == "columns.sx" and "did you mean 'sex'" in str(info.value)


def test_levels_cannot_be_combined_with_an_order(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        sweep(tmp_path, {"sex": {"levels": ["F"], "order": "sorted"}})
    assert info.value.key == "columns.sex.order" and "sweep.yaml" in str(info.value)


# --- types checked against the model -----------------------------------------------------------------


def test_text_in_a_column_with_numbers_elsewhere_names_row_and_value(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "count\n1\n2\n", "b": "count\n1\n3\nmany\n3\n"})
    coding = sweep_coding(sweep(tmp_path).data_sources, paths)
    assert "count" not in coding.labels
    with pytest.raises(DatasetError) as info:
        check_dataset(load_dataset("b", paths["b"], coding), {"count": INT})
    message = str(info.value)
    for part in ("dataset 'b'", str(paths["b"]), "column 'count'", "'many'", "row index 2"):
        assert part in message, (part, message)


def test_labels_that_are_numbers_in_one_file_and_text_in_another(tmp_path: Path) -> None:
    """Text in a column makes it labels (numbers can be labels, text cannot be numbers): the file of numbers
    fails alone, naming the setting that reads its numbers as labels too; a few words among numbers are typos."""
    paths = write(tmp_path / "data", {"a": "group\n1\n2\n", "b": "group\nx\ny\n"})
    coding = sweep_coding(sweep(tmp_path).data_sources, paths)
    assert decoded(load_dataset("b", paths["b"], coding), "group") == ["x", "y"]
    with pytest.raises(DatasetError) as info:
        load_dataset("a", paths["a"], coding)
    assert "dataset 'a'" in str(info.value) and "holds only numbers here (e.g. 1)" in str(info.value)
    assert "columns: {group: {}}" in str(info.value)
    typo = write(tmp_path / "t" / "data", {"a": "count\n1\n2\n", "b": "count\n3\nmany\n4\n"})
    typo_coding = sweep_coding(sweep(tmp_path / "t").data_sources, typo)
    with pytest.raises(DatasetError) as info:
        check_dataset(load_dataset("b", typo["b"], typo_coding), {"count": INT})
    assert "'many'" in str(info.value) and "row index 1" in str(info.value) and "columns:" in str(info.value)
    # listing the column makes it labels in every file, numeric-looking or not
    listed = sweep_coding(sweep(tmp_path, {"group": {}}).data_sources, paths)
    a, b = (load_dataset(d, p, listed) for d, p in paths.items())
    assert a.coords["group"] == b.coords["group"] == ("x", "y", "1", "2")  # appended to the levels recorded before
    assert decoded(a, "group") == ["1", "2"] and decoded(b, "group") == ["x", "y"]


def test_fractional_values_where_the_model_indexes_name_the_row(tmp_path: Path) -> None:
    paths = write(tmp_path / "data", {"a": "g\n0\n1\n1.5\n"})
    with pytest.raises(DatasetError) as info:
        check_dataset(load_dataset("a", paths["a"], sweep_coding(sweep(tmp_path).data_sources, paths)), {"g": INT})
    assert "fractional values such as 1.5" in str(info.value) and "row index 2" in str(info.value)


# --- in batchfit check and in the fit job ------------------------------------------------------------


@pytest.fixture
def poisson_sweep(tmp_path: Path, session_cache: Path) -> Config:
    model = tmp_path / "poisson.py"
    model.write_text(POISSON_MODEL)
    write(tmp_path / "data", {"s1": "sex,count\nF,1\nM,3\nF,2\n", "s2": "sex,count\nM,4\nM,5\n",
                              "s3": "sex,count\nF,1\nM,3\nF,many\nM,3\n"})
    return config_from_dict({
        "model": str(model), "datasets": [str(tmp_path / "data" / "*.csv")], "results_dir": str(tmp_path / "r"),
        "cache_dir": str(session_cache), "sampler": {"draws": 50, "tune": 50, "chains": 1, "seed": 1},
    })


def test_check_reports_the_typo_with_file_column_row_and_value(poisson_sweep: Config) -> None:
    from batchfit.sweep.check import check_model

    report = check_model(poisson_sweep)
    assert set(report.dataset_problems) == {"s3"}
    message = report.dataset_problems["s3"]
    for part in ("s3.csv", "column 'count'", "'many'", "row index 2"):
        assert part in message, (part, message)


def test_fit_fails_the_typo_before_sampling_and_stores_labels_with_codes(poisson_sweep: Config) -> None:
    from batchfit.fitting.batch import fit_batch

    report = fit_batch(poisson_sweep, ["s1", "s2", "s3"], batch_id="b")
    outcomes = {o.dataset: o for o in report.outcomes}
    assert outcomes["s1"].status == outcomes["s2"].status == "ok"
    assert outcomes["s3"].status == "failed" and outcomes["s3"].stage == "build"
    assert "'many'" in outcomes["s3"].message and "row index 2" in outcomes["s3"].message
    assert not poisson_sweep.layout.fit("s3").exists()
    with xr.open_datatree(poisson_sweep.layout.fit("s2")) as tree:
        constant = tree["constant_data"].ds
        labels = constant["sex_labels"].values.tolist()
        assert labels == ["F", "M"]
        assert [labels[c] for c in constant["sex"].values] == ["M", "M"]  # "M" keeps M's sweep-wide code
        assert tree["posterior"].ds["sexes"].values.tolist() == ["F", "M"]
        assert tree["observed_data"].ds["obs"].values.tolist() == [4, 5]


def test_a_planned_sweep_writes_its_registry_and_digests_when_its_run_starts(tmp_path: Path, monkeypatch) -> None:
    """Planned before its results directory exists, a sweep writes nothing; its run's start (write_plan)
    writes the coding registry and data digests planning computed, the files a job writes itself,
    and the next job scans and hashes no data file again."""
    import os
    import shutil

    import batchfit.data.coding as coding_module
    import batchfit.fitting.provenance as provenance
    from batchfit.data.discovery import discover_datasets
    from batchfit.sweep.plan import plan, write_plan

    write(tmp_path / "data", {"s1": "sex,y\nM,1\n", "s2": "sex,y\nF,2\nM,3\n"})
    for path in (tmp_path / "data").iterdir():  # older than a racy write: their digests are kept
        os.utime(path, (1e9, 1e9))
    (tmp_path / "m.py").write_text("def build_model(data):\n    pass\n")
    config = sweep(tmp_path, model=str(tmp_path / "m.py"), started=False)
    results = tmp_path / "results"
    names = (config.layout.coding_registry.name, config.layout.data_digests.name)

    write_plan(config, plan(config, cores=2))
    planned = {name: json.loads((results / name).read_text()) for name in names}
    shutil.rmtree(results)
    results.mkdir()
    provenance.expected_digests(config, discover_datasets(config.data_sources))  # what a job computes and records
    assert {name: json.loads((results / name).read_text()) for name in names} == planned

    def not_again(*args):
        raise AssertionError(f"a data file was read again: {args}")

    hash_file = provenance.file_sha256
    monkeypatch.setattr(coding_module, "_scan", not_again)
    monkeypatch.setattr(provenance, "file_sha256",
                        lambda path: (not_again if Path(path).parent.name == "data" else hash_file)(path))
    for name, content in planned.items():
        (results / name).write_text(json.dumps(content))
    assert sweep_coding(config.data_sources).labels["sex"].levels == ("F", "M")
    provenance.expected_digests(config, discover_datasets(config.data_sources))
