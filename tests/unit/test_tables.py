"""Tables split by key columns as dataset sources, per-dataset values, row rules and column bounds
(batchfit.data.tables, .reader, .values, .rows): what a dataset is when it is a table's group.

Each dataset is compared with the same rows given as a file of its own (what users did by hand before),
and each bad input with the error a user needs: the file, column, group and row.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchfit.config import config_from_dict
from batchfit.data.coding import sweep_coding
from batchfit.data.discovery import discover_datasets, table_scans
from batchfit.data.reader import DatasetReader
from batchfit.errors import ConfigError, DatasetError
from batchfit.fitting.provenance import expected_digests

PK = pd.DataFrame({
    "ID": [1, 1, 1, 1, 2, 2, 2, 3, 3, 3],
    "TIME": [0.0, 0.5, 1.0, 2.0, 0.0, 0.5, 1.5, 0.0, 1.0, 2.5],
    "DV": [np.nan, 4.1, 6.2, 5.0, np.nan, 3.3, 4.4, np.nan, 2.0, 1.5],
    "AMT": [320.0, 0, 0, 0, 250.0, 0, 0, 400.0, 0, 0],
    "EVID": [1, 0, 0, 0, 1, 0, 0, 1, 0, 0],
    "WT": [70.5, 70.5, 70.5, 70.5, 62.0, 62.0, 62.0, 81.2, 81.2, 81.2],
})


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "m.py").write_text("def build_model(data):\n    pass\n")  # hashed into provenance, never run
    return tmp_path


def sweep(**settings: object):
    return config_from_dict({"model": "m.py", "results_dir": "results", **settings}, source="sweep.yaml")


def reader_of(config) -> DatasetReader:
    paths = discover_datasets(config.data_sources)
    return DatasetReader(paths, config.data_sources.settings, sweep_coding(config.data_sources, paths))


def test_a_group_is_the_dataset_its_rows_make_as_a_file_of_their_own(cwd):
    """ID=12 gives id 12; the key column is no data of the model; rules, values and coding apply as to a file."""
    PK.to_csv("pk.csv", index=False)
    for subject, rows in PK.groupby("ID"):
        Path("files").mkdir(exist_ok=True)
        rows.to_csv(f"files/{subject}.csv", index=False)
    rules = {"rows": {"where": "EVID == 0"}}
    table = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], **rules))
    files = reader_of(sweep(datasets=["files/*.csv"], **rules))
    assert list(table.index) == list(files.index) == ["1", "2", "3"]
    for dataset_id in table.index:
        group, file = table.load(dataset_id), files.load(dataset_id)
        assert sorted(group.arrays) == sorted(set(file.arrays) - {"ID"})  # the key is no column of the data
        for name in group.arrays:
            np.testing.assert_array_equal(group[name], file[name])
        assert group.dropped.where == file.dropped.where == 1
    with pytest.raises(DatasetError, match="'ID' is a key column of the table pk.csv"):
        table.load("1")["ID"]


def test_key_values_name_the_datasets_several_keys_joined_unsafe_ones_mapped(cwd):
    frame = pd.DataFrame({"store": ["s01", "s01", "s 2", "s 2", "s_2"], "item": ["i007", "i008", "a/b", "a/b", "a/b"],
                          "y": [1.0, 2.0, 3.0, 4.0, 5.0]})
    frame.to_csv("sales.csv", index=False)
    renamed: dict[str, str] = {}
    config = sweep(datasets=[{"table": "sales.csv", "by": ["store", "item"]}])
    index = discover_datasets(config.data_sources, renamed=renamed)
    assert set(index) >= {"s01_i007", "s01_i008"}
    mapped = sorted(d for d in index if d.startswith("s_2"))
    assert len(mapped) == 2 and len(set(mapped)) == 2  # 's 2'/'a/b' and 's_2'/'a/b' both ask for s_2_a_b
    assert all("sales.csv" in renamed[d] and "cannot name output files" in renamed[d] or "also" in renamed[d]
               for d in mapped if d in renamed)
    assert any("'s 2_a/b'" in why for why in renamed.values())


def test_the_same_id_from_two_sources_names_both(cwd):
    PK.to_csv("pk.csv", index=False)
    Path("data").mkdir()
    PK[PK.ID == 2].to_csv("data/2.csv", index=False)
    with pytest.raises(ConfigError, match=r"dataset id '2' comes from two sources: file data/2.csv and table pk.csv"):
        discover_datasets(sweep(datasets=["data/*.csv", {"table": "pk.csv", "by": "ID"}]).data_sources)


def test_a_missing_key_column_an_empty_table_and_an_unreadable_one_are_config_errors(cwd):
    PK.to_csv("pk.csv", index=False)
    with pytest.raises(ConfigError, match=r"key 'datasets\[0\].by'.*no key column 'SUBJ'; its columns: ID, TIME"):
        discover_datasets(sweep(datasets=[{"table": "pk.csv", "by": "SUBJ"}]).data_sources)
    PK.iloc[:0].to_csv("empty.csv", index=False)
    with pytest.raises(ConfigError, match="the table empty.csv has no rows"):
        discover_datasets(sweep(datasets=[{"table": "empty.csv", "by": "ID"}]).data_sources)
    Path("pk.nc").write_text("x")
    with pytest.raises(ConfigError, match="no table batchfit splits"):
        discover_datasets(sweep(datasets=[{"table": "pk.nc", "by": "ID"}]).data_sources)


def test_rows_without_a_key_fail_as_a_dataset_of_their_own_naming_them(cwd):
    frame = PK.astype({"ID": "Int64"})
    frame.loc[4, "ID"] = pd.NA
    frame.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}]))
    assert "pk.ID-missing" in reader.index
    with pytest.raises(DatasetError, match=r"1 row\(s\) of the table have no value in key column\(s\) ID "
                                           r"\(row index 4"):
        reader.load("pk.ID-missing")
    assert reader.load("2").n_rows == 2  # the others lose only that row


def test_group_digests_follow_each_groups_own_rows(cwd, tmp_path):
    """A group's digest changes with its rows only: reordered groups, columns or a Parquet layout change none."""
    def digests(frame: pd.DataFrame, name: str) -> dict[str, str]:
        path = Path(name)
        if path.suffix == ".csv":
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, row_group_size=3)
        config = sweep(datasets=[{"table": name, "by": "ID"}], results_dir=str(tmp_path / name))
        return table_scans(config.data_sources)[0].digests

    base = digests(PK, "a.csv")
    round_robin = PK.assign(row=PK.groupby("ID").cumcount()).sort_values(["row", "ID"], kind="stable")
    reordered = round_robin.drop(columns="row")[PK.columns[::-1]]
    assert reordered.ID.tolist()[:3] == [1, 2, 3]
    assert digests(reordered, "b.csv") == base  # rows move between groups' places, columns turn round
    assert digests(PK.iloc[::-1].iloc[::-1], "c.parquet") == digests(PK, "d.parquet")
    changed = PK.copy()
    changed.loc[5, "DV"] = 3.4
    after = digests(changed, "e.csv")
    assert {d for d in base if after[d] != base[d]} == {"2"}


def test_a_parquet_directory_with_hive_partitions_reads_as_one_table(cwd):
    PK.to_parquet("one.parquet")
    PK.to_parquet("parts", partition_cols=["ID"])
    one = reader_of(sweep(datasets=[{"table": "one.parquet", "by": "ID"}]))
    parts = reader_of(sweep(datasets=[{"table": "parts", "by": "ID"}], results_dir="results/p"))
    assert list(one.index) == list(parts.index) == ["1", "2", "3"]
    assert table_scans(sweep(datasets=[{"table": "parts", "by": "ID"}]).data_sources)[0].digests == \
        table_scans(sweep(datasets=[{"table": "one.parquet", "by": "ID"}]).data_sources)[0].digests
    for dataset_id in one.index:
        a, b = one.load(dataset_id), parts.load(dataset_id)
        for name in a.arrays:
            np.testing.assert_array_equal(a[name], b[name])


def test_a_job_reads_only_its_groups_of_a_partitioned_parquet_table(cwd):
    """The keys go to pyarrow: partitions of other groups are never opened (here one is no Parquet at all)."""
    big = pd.concat([PK.assign(ID=PK.ID + 10 * k) for k in range(5)], ignore_index=True)
    big.to_parquet("big", partition_cols=["ID"])
    config = sweep(datasets=[{"table": "big", "by": "ID"}])
    paths = discover_datasets(config.data_sources)
    coding = sweep_coding(config.data_sources, paths)
    for part in Path("big", "ID=43").iterdir():
        part.write_bytes(b"not parquet")  # damaged after the sweep was planned: a job never reads it
    reader = DatasetReader(paths, config.data_sources.settings, coding, wanted=["12", "13"])
    assert reader.load("12").n_rows == 3 and reader.load("13").n_rows == 3
    with pytest.raises(Exception, match="(?i)parquet"):
        DatasetReader(paths, config.data_sources.settings, coding).load("43")


def test_scalar_takes_a_columns_one_value_and_names_two_rows_that_differ(cwd):
    frame = PK.copy()
    frame.loc[6, "WT"] = 63.0
    frame.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}]))
    weight = reader.load("1").scalar("WT")
    assert weight.shape == () and weight == 70.5
    with pytest.raises(DatasetError, match=r"dataset '2'.*column 'WT' holds more than one value: 62.0 at row index 4 "
                                           r"and 63.0 at row index 6"):
        reader.load("2").scalar("WT")


def test_side_table_values_are_0d_values_of_files_and_groups_alike(cwd):
    PK.to_csv("pk.csv", index=False)
    Path("data").mkdir()
    PK[PK.ID == 2].to_csv("data/extra.csv", index=False)
    pd.DataFrame({"ID": [1, 2, 3, "extra"], "dose": [320.0, 250.0, 400.0, 100.0], "site": ["a", "b", "a", "c"]}
                 ).to_csv("doses.csv", index=False)
    config = sweep(datasets=[{"table": "pk.csv", "by": "ID"}, "data/*.csv"], values={"table": "doses.csv", "by": "ID"})
    reader = reader_of(config)
    assert reader.load("2").scalar("dose") == 250.0 and reader.load("2")["dose"].shape == ()
    assert reader.load("extra").scalar("dose") == 100.0
    assert str(reader.load("3")["site"]) == "a"
    before = expected_digests(config, discover_datasets(config.data_sources))
    pd.DataFrame({"ID": [1, 2, 3, "extra"], "dose": [320.0, 260.0, 400.0, 100.0], "site": ["a", "b", "a", "c"]}
                 ).to_csv("doses.csv", index=False)
    after = expected_digests(config, discover_datasets(config.data_sources))
    assert {d for d in before if before[d] != after[d]} == {"2"}  # a value is part of its dataset's provenance only


def test_side_table_problems_name_the_table(cwd):
    PK.to_csv("pk.csv", index=False)
    pd.DataFrame({"ID": [1, 1], "dose": [1.0, 2.0]}).to_csv("twice.csv", index=False)
    with pytest.raises(ConfigError, match=r"twice.csv has 2 rows for dataset '1' \(row indexes 0 and 1"):
        reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], values={"table": "twice.csv", "by": "ID"})
                  ).load("1")
    pd.DataFrame({"ID": [1], "WT": [1.0]}).to_csv("clash.csv", index=False)
    with pytest.raises(DatasetError, match="the side table clash.csv has a column 'WT', which the dataset's rows have"):
        reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], values={"table": "clash.csv", "by": "ID"})
                  ).load("1")


def test_row_rules_count_what_they_drop_and_a_dataset_left_without_rows_fails(cwd):
    PK.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}],
                             rows={"where": "EVID == 0 and TIME < 2", "drop_missing": ["DV"]}))
    first = reader.load("1")
    assert (first.dropped.where, first.dropped.missing, first.n_rows) == (2, 0, 2)
    assert first.row_index.tolist() == [1, 2]  # the rows' numbers in pk.csv
    nothing = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], rows={"where": "TIME > 99"}))
    with pytest.raises(DatasetError, match=r"no rows are left once the row rules dropped 4 \(rows.where\)"):
        nothing.load("1")


def test_a_rule_naming_an_unknown_column_fails_each_dataset_naming_it_and_the_columns(cwd):
    PK.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], rows={"where": "EVD == 0"}))
    with pytest.raises(DatasetError, match=r"rows.where \('EVD == 0'\) names column 'EVD'.*its columns: ID, TIME"):
        reader.load("1")
    with pytest.raises(ConfigError, match=r"key 'rows.where'.*'EVID = 0' is no expression"):
        sweep(datasets=["x.csv"], rows={"where": "EVID = 0"})


def test_bounds_fail_the_dataset_naming_column_row_and_value(cwd):
    frame = PK.copy()
    frame.loc[8, "TIME"] = -1.0
    frame.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], columns={"TIME": {"min": 0}}))
    assert reader.load("1").n_rows == 4
    with pytest.raises(DatasetError, match=r"dataset '3'.*column 'TIME' has 1 value\(s\) below its min 0 "
                                           r"\(columns.TIME.min\), the first -1 at row index 8"):
        reader.load("3")


def test_text_after_the_rules_is_typed_as_a_file_of_the_kept_rows_would_be(cwd):
    """NONMEM writes '.' for a dosing record's DV: once `EVID == 0` drops those rows, DV is numbers."""
    frame = PK.astype({"DV": object})
    frame.loc[frame.EVID == 1, "DV"] = "."
    frame.to_csv("pk.csv", index=False)
    reader = reader_of(sweep(datasets=[{"table": "pk.csv", "by": "ID"}], rows={"where": "EVID == 0"}))
    assert reader.load("1")["DV"].dtype == np.float64


def test_one_odd_file_does_not_change_what_a_column_is_for_the_sweep(cwd):
    """A text column holding numbers in one file fails that file alone, naming the setting that fixes it."""
    Path("data").mkdir()
    for k in range(4):
        pd.DataFrame({"group": ["a", "b", "a"], "y": [1.0, 2.0, 3.0]}).to_csv(f"data/ok_{k}.csv", index=False)
    pd.DataFrame({"group": [0.0, 1.0, 0.0], "y": [1.0, 2.0, 3.0]}).to_csv("data/odd.csv", index=False)
    config = sweep(datasets=["data/*.csv"])
    reader = reader_of(config)
    assert reader.load("ok_0").coords["group"] == ("a", "b")
    with pytest.raises(DatasetError, match=r"dataset 'odd'.*column 'group' holds only numbers here \(e.g. 0.0\).*"
                                           r"columns: \{group: \{\}\}"):
        reader.load("odd")
    listed = reader_of(dataclasses.replace(config, columns=sweep(datasets=["x"], columns={"group": {}}).columns,
                                           results_dir=Path("results/listed")))
    assert listed.load("odd").coords["group"] == ("0.0", "1.0", "a", "b")
