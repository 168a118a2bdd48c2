"""Config errors: reported before any work, in one line naming the key and the config file, through
`batchfit check` and Snakemake's dry run alike; keys a config file leaves out get the schema's
defaults; fuzzed configs give only config errors (or a valid config).

The Snakemake tests run the real ``snakemake`` on the repository's Snakefile (tests/testkit/).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testkit import HIERARCHICAL, REPO, output_of, snakemake, sweep_settings, write_config

from batchfit import cli
from batchfit.config import Config, config_from_dict, load_config
from batchfit.errors import ConfigError

CONFIG_ERRORS = [
    pytest.param({"sampeler": {"draws": 10}}, "sampeler", "did you mean 'sampler'", id="unknown-key"),
    pytest.param({"batch_size": "two"}, "batch_size", "must be an integer or 'auto', got 'two'", id="wrong-type"),
    pytest.param({"batch_size": 0}, "batch_size", "must be >= 1, got 0", id="zero-batch-size"),
    pytest.param({"sampler": {"draws": -5}}, "sampler.draws", "must be >= 1, got -5", id="negative-draws"),
    pytest.param({"sampler": {"chains": 0}}, "sampler.chains", "must be >= 1, got 0", id="zero-chains"),
    pytest.param({"health": {"max_r_hat": 0.5}}, "health.max_r_hat", "must be > 1", id="bad-threshold"),
    pytest.param({"model": "models/missing.py"}, "model", "does not exist", id="model-missing"),
    pytest.param({"model": "models/no_build.py"}, "model", "defines no function build_model", id="no-build-model"),
    pytest.param({"model": "models/broken.py"}, "model", "cannot be read as Python at line 1", id="model-syntax"),
    pytest.param({"datasets": ["nodata/*.csv"]}, "datasets[0]", "matches no file", id="glob-matches-nothing"),
]


@pytest.mark.parametrize(("change", "key", "fragment"), CONFIG_ERRORS)
def test_config_error_via_cli_check(small_project: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture, change: dict, key: str, fragment: str) -> None:
    monkeypatch.chdir(small_project)
    config = write_config(small_project / "sweep.yaml", sweep_settings(session_cache, **change))
    code = cli.main(["check", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert f"key '{key}'" in err and str(config) in err and fragment in err, err
    assert not (small_project / "results").exists()


@pytest.mark.parametrize(("change", "key", "fragment"), CONFIG_ERRORS)
def test_config_error_via_snakemake_dry_run(small_project: Path, session_cache: Path, change: dict, key: str,
                                            fragment: str) -> None:
    config = write_config(small_project / "sweep.yaml", sweep_settings(session_cache, **change))
    run = snakemake(small_project, config, "-n")
    out = output_of(run)
    assert run.returncode != 0
    assert f"key '{key}'" in out and str(config) in out and fragment in out, out
    assert "On instance" not in out, "Snakemake's schema dump instead of batchfit's message"
    assert not (small_project / "results").exists()


def test_valid_config_dry_run_plans_batches_and_writes_nothing(small_project: Path, session_cache: Path) -> None:
    config = write_config(small_project / "sweep.yaml", sweep_settings(session_cache))
    run = snakemake(small_project, config, "-n")
    assert run.returncode == 0, output_of(run)
    assert re.search(r"fit batch-\w+: \d+ dataset\(s\); log results/logs/fit/batch-", run.stdout), run.stdout
    assert not (small_project / "results").exists()


def test_config_file_defaults_are_the_schema_defaults_not_the_example(small_project: Path, session_cache: Path) -> None:
    """A --configfile replaces config/config.yaml: keys it omits get the documented defaults."""
    minimal = write_config(small_project / "minimal.yaml", {
        "model": str(HIERARCHICAL), "datasets": [str(small_project / "data/*.csv")], "cache_dir": str(session_cache)})
    run = snakemake(REPO, minimal, "-n", "--nolock", cores=1, timeout=300)  # in the repository, beside the example
    assert run.returncode == 0, output_of(run)
    assert "log results/logs/fit/batch-" in run.stdout  # the default results_dir, not results/example
    assert "results/example" not in run.stdout


_yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
_yaml_values = st.recursive(
    _yaml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()),
                                               children, max_size=3)),
    max_leaves=8,
)
_KEYS = ["model", "datasets", "sampler", "sampler.draws", "sampler.tune", "sampler.chains", "sampler.seed",
         "sampler.target_accept", "batch_size", "cache_dir", "results_dir", "on_error", "outputs",
         "outputs.log_likelihood", "health", "health.max_r_hat", "health.min_ess_bulk", "max_structures",
         "cache", "cache.lock_timeout", "cache.trust_shared"]


@settings(max_examples=60, deadline=None)
@given(changes=st.lists(st.tuples(st.one_of(st.sampled_from(_KEYS), st.text(max_size=6)), _yaml_values), max_size=3),
       top=st.one_of(st.none(), _yaml_values))
def test_fuzzed_configs_give_config_errors_or_a_config(changes, top) -> None:
    data: object = {"model": "m.py", "datasets": ["d/*.csv"]}
    for key, value in changes:
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else {}
        node[last] = value
    if top is not None and not changes:
        data = top
    try:
        config = config_from_dict(data, source="fuzz.yaml")
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("config error (") and "in fuzz.yaml" in message
        assert "\n" not in message.replace(exc.key or "", "")  # one line, but for a key with a newline
        return
    assert isinstance(config, Config)
    assert config.sampler.draws >= 1 and config.model == Path("m.py")
    assert config.batch_size == "auto" or config.batch_size >= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=120),
                     st.builds(yaml.safe_dump, _yaml_values)))
def test_fuzzed_config_files_give_config_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:  # never a valid config: no model file exists here
        load_config(path)
    assert str(path) in str(info.value)
