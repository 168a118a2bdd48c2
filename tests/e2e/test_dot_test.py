"""The .test/ configs, swept whole as Snakemake catalog workflows' CI sweeps theirs: each a few datasets of
the bundled data with short chains, run as its comment says (the repository's Snakefile, ``--directory
.test``), in a copy of .test/, models/ and data/ so that the run writes nothing into the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import REPO, output_of, snakemake

CONFIGS = sorted((REPO / ".test" / "config").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_the_test_config_sweeps_every_dataset(config: Path, tmp_path: Path, session_cache: Path):
    for name in (".test", "models", "data"):
        shutil.copytree(REPO / name, tmp_path / name)
    test_dir = tmp_path / ".test"
    # The session's compile cache: a model another test compiled is not compiled again.
    run = snakemake(test_dir, test_dir / "config" / config.name, "--config", f"cache_dir={session_cache}")
    assert run.returncode == 0, output_of(run)[-5000:]
    status = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "status", "--config",
                             f"config/{config.name}"], cwd=test_dir, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, output_of(status)
    counts = re.search(r"(\d+) dataset\(s\): (\d+) fitted, 0 pending, 0 failed", status.stdout)
    assert counts and int(counts[1]) == int(counts[2]) >= 2, status.stdout
