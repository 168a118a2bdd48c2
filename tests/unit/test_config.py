"""Tests for batchfit.config: schema defaults, validation messages, file checks, round trips."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from snakemake.utils import validate as snakemake_validate
from testkit import REPO, write_config

from batchfit import cli
from batchfit.config import Config, config_from_dict, config_to_dict, load_config
from batchfit.errors import ConfigError
from batchfit.schema import config_schema
from batchfit.settings import CacheSettings, HealthSettings, OutputSettings, SamplerSettings, plain

MINIMAL = {"model": "models/m.py", "datasets": ["data/*.csv"]}
FULL = {
    "model": "models/m.py",
    "datasets": ["data/*.csv", "more/a.parquet"],
    "sampler": {"draws": 200, "tune": 300, "chains": 2, "target_accept": 0.9, "seed": 7, "max_treedepth": 8,
                "adaptation": "low_rank", "mass_matrix_eigval_cutoff": 10.0, "mass_matrix_gamma": 0.001,
                "mass_matrix_switch_freq": 50, "early_window_switch_freq": 5, "store_divergences": True,
                "store_unconstrained": True, "store_gradient": True, "store_mass_matrix": True,
                "initvals": {"mu": 0.5, "sigma_log__": [0.0, 1.0], "a": "prior"}, "jitter_rvs": ["mu"],
                "discard_tuned_samples": False, "step": {"k": "metropolis"}},
    "batch_size": 3,
    "cache_dir": "cache",
    "results_dir": "out",
    "on_error": "stop",
    "outputs": {"log_likelihood": True, "posterior_predictive": True},
    "health": {"max_r_hat": 1.05, "min_ess_bulk": 100, "max_divergences": 5},
    "max_structures": 3,
    "cache": {"lock_timeout": 30, "trust_shared": True},
    "columns": {"sex": {"levels": ["F", "M"]}, "store": {"order": "appearance", "scope": "dataset"}},
}


def with_change(path: str, value: object) -> dict:
    """MINIMAL with one (possibly nested, dotted) key set to `value`."""
    data = copy.deepcopy(MINIMAL)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def config_error(data: object, source: str = "<dict>") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source=source)
    return info.value


# --- defaults and the Python API -------------------------------------------------------------


def test_minimal_config_gets_every_default() -> None:
    config = config_from_dict(MINIMAL)
    assert config == Config(
        model=Path("models/m.py"),
        datasets=("data/*.csv",),
        sampler=SamplerSettings(draws=1000, tune=1000, chains=4, target_accept=0.8, seed=2026),
        batch_size="auto",
        cache_dir=Path(".batchfit-cache"),
        results_dir=Path("results"),
        on_error="continue",
        outputs=OutputSettings(log_likelihood=False, posterior_predictive=False),
        health=HealthSettings(max_r_hat=1.01, min_ess_bulk=400, max_divergences=0),
        max_structures=8,
        cache=CacheSettings(lock_timeout=600, trust_shared=False),
        source="<dict>",
    )


def test_partial_nested_section_keeps_given_values_and_fills_the_rest() -> None:
    config = config_from_dict(with_change("sampler.draws", 5))
    assert config.sampler == SamplerSettings(draws=5, tune=1000, chains=4, target_accept=0.8, seed=2026)


def test_full_config_values_are_kept_with_python_types() -> None:
    config = config_from_dict(FULL, source="run.yaml")
    assert config.source == "run.yaml"
    assert config.datasets == ("data/*.csv", "more/a.parquet")
    assert config.sampler.target_accept == 0.9 and isinstance(config.sampler.draws, int)
    assert config.on_error == "stop" and config.max_structures == 3
    assert isinstance(config.health.min_ess_bulk, float) and isinstance(config.cache.lock_timeout, float)
    assert config.cache_dir == Path("cache")


def test_input_mapping_is_not_modified() -> None:
    data = copy.deepcopy(MINIMAL)
    config_from_dict(data)
    assert data == MINIMAL


def test_config_is_frozen() -> None:
    config = config_from_dict(MINIMAL)
    with pytest.raises(AttributeError):
        config.batch_size = 3  # type: ignore[misc]


def test_path_helpers_live_under_results_dir() -> None:
    config = config_from_dict(FULL)
    assert config.layout.fit("store_07") == Path("out/fits/store_07.nc")
    assert config.layout.failure("store_07") == Path("out/failures/store_07.json")
    assert config.layout.batch_manifest("batch_003") == Path("out/batches/batch_003.json")
    assert config.layout.posteriors == Path("out/posteriors.nc")
    assert config.layout.summary == Path("out/summary.csv")
    assert config.layout.failures_csv == Path("out/failures.csv")


def test_sampler_dict_is_plain_data() -> None:
    assert config_from_dict(FULL).sampler_dict() == FULL["sampler"]


@pytest.mark.parametrize("data", [MINIMAL, FULL])
def test_config_to_dict_round_trips_through_json(data: dict) -> None:
    config = config_from_dict(data)
    plain = json.loads(json.dumps(config_to_dict(config)))
    assert config_from_dict(plain) == config


# --- validation messages ----------------------------------------------------------------------


def test_wrong_type_names_key_source_and_value() -> None:
    error = config_error(with_change("sampler.draws", "abc"), source="cfg.yaml")
    assert error.key == "sampler.draws" and error.source == "cfg.yaml"
    assert "sampler.draws" in str(error) and "cfg.yaml" in str(error)
    assert "must be an integer, got 'abc'" in str(error)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("sampler.draws", 0, ">= 1"),
        ("sampler.tune", -1, ">= 0"),
        ("sampler.chains", 0, ">= 1"),
        ("sampler.target_accept", 0, "> 0"),
        ("sampler.target_accept", 1, "< 1"),
        ("sampler.seed", -5, ">= 0"),
        ("batch_size", 0, ">= 1"),
        ("cache.lock_timeout", 0, "> 0"),
        ("health.max_r_hat", 1.0, "> 1"),
        ("health.min_ess_bulk", -1, ">= 0"),
        ("health.max_divergences", -1, ">= 0"),
        ("sampler.max_treedepth", 0, ">= 1"),
        ("sampler.mass_matrix_eigval_cutoff", 1, "> 1"),
        ("sampler.mass_matrix_gamma", 0, "> 0"),
        ("sampler.mass_matrix_switch_freq", 0, ">= 1"),
        ("sampler.early_window_switch_freq", 0, ">= 1"),
    ],
)
def test_out_of_range_values_are_rejected(key: str, value: object, expected: str) -> None:
    error = config_error(with_change(key, value))
    assert error.key == key
    assert f"must be {expected}, got {value}" in str(error)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("sampler.seed", 1.5, "must be an integer"),
        ("sampler.draws", True, "must be an integer, got true"),
        ("sampler.target_accept", "high", "must be a number, got 'high'"),
        ("outputs.log_likelihood", "yes", "must be true or false"),
        ("max_structures", 0, "must be >= 1"),
        ("datasets", "data/*.csv", "must be a list"),
        ("sampler", None, "must be a mapping"),
        ("model", 3, "must be a string"),
        ("on_error", "ignore", "must be one of 'continue', 'stop', got 'ignore'"),
        ("model", "", "must not be empty"),
        ("sampler.adaptation", "flow", "must be one of 'diag', 'draw_diag', 'low_rank', got 'flow'"),
        ("sampler.store_gradient", "yes", "must be true or false"),
        ("sampler.discard_tuned_samples", 0, "must be true or false"),
        ("sampler.initvals", [1.0], "must be a mapping"),
        ("sampler.initvals.mu", "mean", "must be a number or a list or 'support_point' or 'prior', got 'mean'"),
        ("sampler.jitter_rvs", "mu", "must be a list or null"),
        ("sampler.jitter_rvs", ["mu", "mu"], "non-unique"),
        ("sampler.step.z", "gibbs", "must be one of 'nuts', 'hmc', 'metropolis'"),
    ],
)
def test_wrong_types_and_values_are_explained(key: str, value: object, fragment: str) -> None:
    error = config_error(with_change(key, value))
    assert error.key == key
    assert fragment in str(error)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_rejected(value: float) -> None:
    error = config_error(with_change("health.max_r_hat", value))
    assert error.key == "health.max_r_hat" and "finite" in str(error)


def test_empty_dataset_list_and_empty_pattern_are_rejected() -> None:
    assert config_error(with_change("datasets", [])).key == "datasets"
    error = config_error(with_change("datasets", ["data/*.csv", ""]))
    assert error.key == "datasets[1]" and "must not be empty" in str(error)


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("batchsize", "batch_size"), ("sampler.drawz", "draws"), ("health.max_rhat", "max_r_hat")],
)
def test_unknown_key_suggests_the_closest_allowed_key(key: str, suggestion: str) -> None:
    error = config_error(with_change(key, 1), source="cfg.yaml")
    assert error.key == key
    name = key.rsplit(".", 1)[-1]
    assert f"unknown key '{name}'; did you mean '{suggestion}'?" in str(error)
    assert "cfg.yaml" in str(error)


@pytest.mark.parametrize(
    ("key", "hint"),
    [("sampler.maxdepth", "under PyMC's name, max_treedepth"),
     ("sampler.low_rank_modified_mass_matrix", "did you mean 'adaptation: low_rank'?"),
     ("sampler.save_warmup", "'discard_tuned_samples: false' keeps the warm-up"),
     ("sampler.init_mean", "give start values as initvals"),
     ("sampler.idata_kwargs", "log_likelihood is outputs.log_likelihood")],
)
def test_a_setting_under_pm_samples_or_nutpies_name_says_the_key_to_use(key: str, hint: str) -> None:
    error = config_error(with_change(key, True))
    assert error.key == key and hint in str(error)


def test_a_start_value_of_no_number_names_its_entry() -> None:
    error = config_error(with_change("sampler.initvals", {"mu": [0.5, "a"]}))
    assert error.key == "sampler.initvals.mu[1]" and "must be a number or a list, got 'a'" in str(error)


@pytest.mark.parametrize("name", ["mass_matrix_eigval_cutoff", "mass_matrix_gamma"])
@pytest.mark.parametrize("adaptation", ["diag", "draw_diag"])
def test_a_low_rank_setting_needs_the_low_rank_adaptation(name: str, adaptation: str) -> None:
    """nutpie refuses these with another adaptation ("not available for diag adaptation"): said at load."""
    error = config_error(with_change("sampler", {"adaptation": adaptation, name: 5.0}))
    assert error.key == f"sampler.{name}" and "set adaptation: low_rank" in str(error)
    assert config_from_dict(with_change("sampler", {"adaptation": "low_rank", name: 5.0}))


def _dataclass_defaults(cls: type, schema: dict, where: str = "") -> Iterator[tuple[str, object, object]]:
    """(key, the dataclass's default as a config file writes it, the schema's) of every field of ``cls`` with a
    default, and of its sections' fields (a field without a default or not in the schema: none)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        sub = schema.get("properties", {}).get(field.name)
        if sub is None:
            continue
        key = f"{where}{field.name}"
        if field.default is not dataclasses.MISSING:
            yield key, plain(field.default), sub.get("default")
        elif field.default_factory is not dataclasses.MISSING:
            yield key, plain(field.default_factory()), sub.get("default")
        if dataclasses.is_dataclass(hints[field.name]):
            yield from _dataclass_defaults(hints[field.name], sub, f"{key}.")


def test_the_settings_defaults_are_the_schemas() -> None:
    """The dataclasses' defaults (for code that builds one by hand) equal what a config without them gets: the
    schema is the one source of a default, the dataclasses are checked against it."""
    checked = list(_dataclass_defaults(Config, config_schema()))
    assert {"sampler.max_treedepth", "rows", "compare.kfold.k", "sbc.envelope_prob"} <= {key for key, *_ in checked}
    for key, default, schemas in checked:
        assert default == schemas, key


def test_unknown_key_without_close_match_lists_allowed_keys() -> None:
    error = config_error(with_change("zzzzzz", 1))
    assert "did you mean" not in str(error)
    assert "batch_size" in str(error)


@pytest.mark.parametrize("missing", ["model", "datasets"])
def test_missing_required_key(missing: str) -> None:
    data = copy.deepcopy(MINIMAL)
    del data[missing]
    error = config_error(data)
    assert error.key == missing and f"missing required key '{missing}'" in str(error)


def test_all_problems_are_reported_at_once() -> None:
    data = with_change("sampler.draws", 0)
    data["batchsize"] = 2
    message = str(config_error(data))
    assert "sampler.draws" in message and "batchsize" in message


def test_top_level_must_be_a_mapping() -> None:
    assert "must be a mapping" in str(config_error(["model"]))


# --- load_config: files -----------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a model file, as Snakemake would run in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.py").write_text("def build_model(data): ...\n")
    return tmp_path


def test_load_config_reads_yaml_and_records_the_file(project: Path) -> None:
    path = write_config(project / "config.yaml", FULL)
    config = load_config(path)
    assert config.source == str(path)
    assert config == config_from_dict(FULL, source=str(path))


def test_relative_paths_stay_relative_to_the_working_directory(project: Path) -> None:
    (project / "conf").mkdir()
    config = load_config(write_config(project / "conf" / "config.yaml", MINIMAL))
    assert config.model == Path("models/m.py")


def test_missing_model_file_names_key_and_config_file(project: Path) -> None:
    path = write_config(project / "config.yaml", with_change("model", "models/nope.py"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "model"
    assert str(path) in str(info.value) and "models/nope.py" in str(info.value)
    assert "does not exist" in str(info.value)


def test_model_that_is_a_directory_is_rejected(project: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(write_config(project / "config.yaml", with_change("model", "models")))


def test_yaml_syntax_error_names_file_and_line(project: Path) -> None:
    path = project / "config.yaml"
    path.write_text("model: models/m.py\ndatasets: [data/*.csv\nbatch_size: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "line" in str(info.value)


def test_yaml_syntax_error_reports_the_right_line(project: Path) -> None:
    path = project / "config.yaml"
    path.write_text("model: models/m.py\ndatasets:\n  - a\n bad: [\n")
    with pytest.raises(ConfigError, match="line 4"):
        load_config(path)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just a string\n"])
def test_empty_or_non_mapping_file_is_rejected(project: Path, text: str) -> None:
    path = project / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_unreadable_config_file(project: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file") as info:
        load_config(project / "missing.yaml")
    assert "missing.yaml" in str(info.value)


def test_schema_errors_from_a_file_name_that_file(project: Path) -> None:
    path = write_config(project / "config.yaml", with_change("batchsize", 3))
    with pytest.raises(ConfigError, match="did you mean 'batch_size'") as info:
        load_config(path)
    assert str(path) in str(info.value)


# --- the schema file itself -------------------------------------------------------------------


def _is_section(schema: dict) -> bool:
    """An object with fixed keys, or a map keyed by user names whose entries are such (`columns`); a map
    from user names to values (`sampler.initvals`, `sampler.step`) is one setting."""
    entry = schema.get("additionalProperties")
    return schema.get("type") == "object" and ("properties" in schema or
                                               (isinstance(entry, dict) and "properties" in entry))


def _objects(schema: dict, where: str = "") -> list[tuple[str, dict]]:
    """Every object with fixed keys; a map keyed by user names (`columns`) contributes its value schema."""
    if "properties" not in schema and isinstance(schema.get("additionalProperties"), dict):
        return _objects(schema["additionalProperties"], f"{where}.<name>")
    found = [(where, schema)]
    for name, sub in schema.get("properties", {}).items():
        if _is_section(sub):
            found += _objects(sub, f"{where}.{name}".lstrip("."))
    return found


def test_the_schema_reads_as_pythons_yaml_loader_reads_it() -> None:
    """config_schema reads the file with libyaml's loader (faster, every job reads it): the same value as the
    pure-Python safe loader's, types included (a libyaml difference would change a default)."""
    text = (REPO / "src" / "batchfit" / "workflow" / "schemas" / "config.schema.yaml").read_text("utf-8")
    expected = yaml.load(text, Loader=yaml.SafeLoader)
    assert yaml.__with_libyaml__  # PyYAML's wheels ship it: else this compares the pure-Python loader with itself
    assert json.dumps(config_schema(), sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert config_schema() == expected


def test_every_object_forbids_unknown_keys_and_every_key_is_described() -> None:
    for where, obj in _objects(config_schema()):
        assert obj.get("additionalProperties") is False, where
        for name, sub in obj["properties"].items():
            assert sub.get("description"), f"{where}.{name}"


def test_section_defaults_match_their_keys_defaults() -> None:
    for where, obj in _objects(config_schema())[1:]:
        if "default" not in obj and "<name>" in where:
            continue  # an entry of a map keyed by user names: no defaults of its own
        keys = {name: sub["default"] for name, sub in obj["properties"].items()}
        assert obj["default"] == keys, where


def test_every_setting_is_documented_in_the_config_readme() -> None:
    readme = (REPO / "config" / "README.md").read_text()
    for where, obj in _objects(config_schema()):
        for name, sub in obj["properties"].items():
            if not _is_section(sub):
                assert f"`{where}.{name}`".replace("`.", "`") in readme, f"{where}.{name}"


def workflow_schema() -> Path:
    """The schema file the workflow's Snakemake `validate` reads (rules/common.smk)."""
    rules = REPO / "src" / "batchfit" / "workflow" / "rules"
    [path] = re.findall(r'validate\(config, "([^"]+)"\)', (rules / "common.smk").read_text())
    return rules / path


def test_the_workflow_validates_against_the_schema_batchfit_reads() -> None:
    assert yaml.safe_load(workflow_schema().read_text()) == config_schema()


def test_the_readme_shows_the_defaults_batchfit_defaults_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """config/README.md's block of defaults is what `batchfit defaults` prints from the schema (regenerate it with
    that command): every key with its default, or a required key's example."""
    assert cli.main(["defaults"]) == 0
    printed = capsys.readouterr().out
    assert f"```yaml\n{printed}```" in (REPO / "config" / "README.md").read_text()
    expected = {name: sub.get("default", sub.get("examples", [None])[0])
                for name, sub in config_schema()["properties"].items()}
    assert yaml.safe_load(printed) == expected


def test_the_readme_keys_table_shows_the_schemas_defaults() -> None:
    """Each row of config/README.md's table of keys gives the schema's default (or says the key is required)."""
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]+) \|", (REPO / "config" / "README.md").read_text(), re.M)
    required = set(config_schema()["required"])
    checked = 0
    for key, cell in rows:
        node = config_schema()
        for part in key.split("."):
            node = node.get("properties", {}).get(part, {})
        if key in required:
            assert cell.strip() == "*required*", key
        elif "default" in node:
            assert yaml.safe_load(cell.strip().strip("`")) == node["default"], key
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("data", [MINIMAL, with_change("sampler.draws", 5), FULL])
def test_snakemake_validate_fills_the_same_defaults(data: dict) -> None:
    config = copy.deepcopy(data)
    snakemake_validate(config, str(workflow_schema()))
    assert config_from_dict(config) == config_from_dict(data)
    # the one default a config resolves: log_likelihood null is on with variants, off without (#48)
    resolved = config_to_dict(config_from_dict(data))
    filled = config["outputs"]["log_likelihood"]
    assert resolved["outputs"]["log_likelihood"] is (filled is True)
    assert config == resolved | {"outputs": resolved["outputs"] | {"log_likelihood": filled}}


# --- fuzzing ----------------------------------------------------------------------------------

_ANY_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
_KEYS = [
    (),
    *[(k,) for k in FULL],
    *[(section, k) for section in ("sampler", "outputs", "health", "cache") for k in FULL[section]],
]
_MUTATION = st.tuples(
    st.sampled_from(["delete", "set", "add_key"]),
    st.sampled_from(_KEYS),
    _ANY_VALUE,
    st.text(min_size=1, max_size=12),
)


def _mutate(data: dict, mutation: tuple) -> None:
    action, path, value, new_key = mutation
    parent = data
    for part in path[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
    if not isinstance(parent, dict):
        return
    if action == "add_key":
        target = parent.get(path[-1]) if path else parent
        if isinstance(target, dict):
            target[new_key] = value
    elif path and action == "delete":
        parent.pop(path[-1], None)
    elif path:
        parent[path[-1]] = value


@settings(max_examples=120, deadline=None)
@given(base=st.sampled_from([MINIMAL, FULL]), mutations=st.lists(_MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_configs_load_or_raise_config_error(base: dict, mutations: list) -> None:
    data = copy.deepcopy(base)
    for mutation in mutations:
        _mutate(data, mutation)
    try:
        config = config_from_dict(data)
    except ConfigError as error:
        assert str(error).startswith("config error")
    else:
        assert config_from_dict(json.loads(json.dumps(config_to_dict(config)))) == config


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80) | st.sampled_from(["model: [", "a: b: c", "{", "- 1", "!!python/name:os.system"]))
def test_fuzz_arbitrary_yaml_text_raises_only_config_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError):
            load_config(path)


def test_predictions_are_off_by_default_and_take_their_new_inputs_from_one_form() -> None:
    assert not config_from_dict(MINIMAL).predict.enabled
    grid = config_from_dict({**MINIMAL, "predict": {"grid": {"TIME": {"start": 0, "stop": 24, "num": 97},
                                                             "group": ["g1", "g2"]}}}).predict
    assert grid.enabled and grid.source == "grid" and grid.seed == 2026 and grid.var_names is None
    assert config_from_dict({**MINIMAL, "predict": {"data": "new/*.csv"}}).predict.data == ("new/*.csv",)
    with pytest.raises(ConfigError, match=r"key 'predict'.*one of data.*not grid and horizon"):
        config_from_dict({**MINIMAL, "predict": {"grid": {"x": [1.0]}, "horizon": 3}})


@pytest.mark.parametrize(("grid", "message"), [
    ({"x": {"start": 0, "stop": 1}}, r"key 'predict.grid.x.num'.*missing required key 'num'"),
    ({"x": {"start": 0, "stop": 1, "num": 3, "step": 1}}, r"key 'predict.grid.x.step'.*unknown key 'step'"),
    ({"x": 3}, r"key 'predict.grid.x'.*must be a mapping of keys to values or a list, got 3"),
    ({"x": {"start": 0, "stop": 1, "num": 0}}, r"key 'predict.grid.x.num'.*must be >= 1"),
])
def test_a_bad_grid_names_its_column_and_what_is_wrong(grid: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({**MINIMAL, "predict": {"grid": grid}})
