"""An untrusted cache directory (another user's, writable by everyone) is refused before anything
is written into it, by every command and by the pipeline, unless the config says `trust_shared`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import output_of, snakemake, sweep_settings, write_config

from batchfit import cli

OTHER_UID = 54321  # owner of the "shared" cache directories (not the user running the tests)


def untrusted(path: Path) -> Path:
    """A directory owned by another user that everyone can write to."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chown(path, OTHER_UID, -1)
    except PermissionError:
        pytest.skip("making a directory owned by another user needs root")
    path.chmod(0o777)
    return path


@pytest.mark.parametrize("command", [["check"], ["compile"], ["run"], ["cache", "info"]])
def test_untrusted_cache_is_refused_by_the_cli(small_project: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture, command: list[str]) -> None:
    shared = untrusted(small_project / "shared-cache")
    config = write_config(small_project / "sweep.yaml", sweep_settings(shared))
    monkeypatch.chdir(small_project)
    code = cli.main([*command, "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cache directory {shared}" in err and "writable by other users" in err
    assert f"owned by uid {OTHER_UID}" in err and "trust_shared: true" in err
    assert list(shared.iterdir()) == []  # refused before anything was written into it
    assert not (small_project / "results").exists()


def test_trust_shared_overrides_the_refusal(small_project: Path) -> None:
    shared = untrusted(small_project / "shared-cache")
    config = sweep_settings(shared, cache={"trust_shared": True})
    path = write_config(small_project / "sweep.yaml", config)
    env = {k: v for k, v in os.environ.items() if k != "PYTENSOR_FLAGS"}  # a separate process: its own cache
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "cache", "info", "--config", str(path)],
                         cwd=small_project, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, output_of(run)
    assert (shared / "batchfit" / "entries").is_dir()
    refused = write_config(small_project / "refused.yaml", sweep_settings(shared))
    run = subprocess.run([sys.executable, "-m", "batchfit.cli", "cache", "info", "--config", str(refused)],
                         cwd=small_project, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and "trust_shared" in run.stderr


@pytest.mark.slow
def test_untrusted_cache_stops_the_pipeline_and_trust_shared_lets_it_run(small_project: Path,
                                                                         session_cache: Path) -> None:
    shared = small_project / "shared-cache"
    shutil.copytree(session_cache, shared, symlinks=True)  # the session's entries: no cold compile
    untrusted(shared)
    config = write_config(small_project / "sweep.yaml", sweep_settings(shared))
    run = snakemake(small_project, config)
    assert run.returncode != 0
    logs = "\n".join(p.read_text() for p in (small_project / "results" / "logs").rglob("*.log"))
    assert f"cache directory {shared} is writable by other users" in logs and "trust_shared: true" in logs, logs
    results = small_project / "results"
    assert not list(results.glob("fits/*.nc")) and not (results / "summary.csv").exists()

    config = write_config(small_project / "sweep.yaml", sweep_settings(shared, cache={"trust_shared": True}))
    run = snakemake(small_project, config)
    assert run.returncode == 0, output_of(run)
    assert sorted(p.stem for p in (results / "fits").glob("*.nc")) == ["d_000", "d_001", "d_002"]
