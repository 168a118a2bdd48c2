"""Test-session set-up: one compile cache for the whole session, empty when the session starts.

PyTensor reads its compile directory at import time, so the environment is set here, before
any test module imports pytensor. The cache is new for every session, so no test can
pass on an entry an older session or older code left; tests that need a compiled model ask for a
fixture that compiles it. pytest-xdist's workers inherit the variable below from the controller,
so they share its cache, and the controller removes it at the end. Set BATCHFIT_TEST_CACHE
yourself to keep a cache across sessions while developing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from testkit import HIERARCHICAL, REPO, snakemake, venvs, write_config, write_variant_sweep

# Property-based tests draw the same examples in every run (hypothesis' derandomize: examples from a seed
# fixed by each test), so a failure found once is found again in any clone, CI's included, and a run
# never fails by the luck of its draws. To explore new examples: HYPOTHESIS_PROFILE=explore.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))

_KEEP = "BATCHFIT_TEST_CACHE" in os.environ  # given by the user, or inherited by an xdist worker
_NEW_CACHE = Path(tempfile.gettempdir()) / f"batchfit-tests-{os.getpid()}"
SESSION_CACHE = Path(os.environ.get("BATCHFIT_TEST_CACHE", _NEW_CACHE))
SESSION_CACHE.mkdir(parents=True, exist_ok=True, mode=0o700)
os.environ["BATCHFIT_TEST_CACHE"] = str(SESSION_CACHE)
os.environ["PYTENSOR_FLAGS"] = f"base_compiledir={SESSION_CACHE / 'pytensor'}"
os.environ["NUMBA_CACHE_DIR"] = str(SESSION_CACHE / "numba")

NES_DIR = Path(os.environ.get("BATCHFIT_NES_DIR", REPO.parent / "shared" / "data" / "posteriordb-nes"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the session's cache (by the process that made it: the xdist controller, or the only one)."""
    if not _KEEP:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def session_cache() -> Path:
    """The compile cache shared by every test in the session."""
    return SESSION_CACHE


@pytest.fixture(scope="session")
def hierarchical_entry(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled hierarchical model compiled into the session cache (as `batchfit compile` does)."""
    root = tmp_path_factory.mktemp("hierarchical-entry")
    config = write_config(root / "config.yaml", {
        "model": str(HIERARCHICAL), "datasets": [str(REPO / "data" / "example" / "*.csv")],
        "columns": {"group": {"scope": "dataset"}}, "cache_dir": str(session_cache),
        "results_dir": str(root / "results")})
    run = subprocess.run([str(Path(sys.executable).with_name("batchfit")), "compile", "--config", str(config)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"compiling the hierarchical model failed:\n{run.stdout}\n{run.stderr[-3000:]}"
    return session_cache


@pytest.fixture(scope="session")
def variant_sweep(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished sweep of two variants (testkit.VARIANTS) of 3 datasets, run by Snakemake: its config file.
    Left as it is: a test that changes it works on a copy."""
    root = tmp_path_factory.mktemp("variant-sweep")
    config = write_variant_sweep(root, session_cache, 3)
    run = snakemake(root, config)
    assert run.returncode == 0, f"the variant sweep failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    return config


@pytest.fixture
def small_project(tmp_path: Path) -> Path:
    """A project directory with three good datasets (data/d_000.csv to d_002.csv) and two broken
    model files (models/no_build.py, models/broken.py)."""
    from batchfit.model.simulate import simulate_datasets  # not at the top, which runs before the env is set

    simulate_datasets(HIERARCHICAL, tmp_path / "data", 3, seed=11, prefix="d")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "no_build.py").write_text("import math\n\ndef build(data):\n    return None\n")
    (tmp_path / "models" / "broken.py").write_text("def build_model(data) return 1\n")
    return tmp_path


@pytest.fixture(scope="session")
def user_bin() -> Path:
    """bin/ of .venv-user: batchfit as a user installs it (no extras), from this working tree (testkit.venvs)."""
    return venvs.user_venv()


@pytest.fixture(scope="session")
def reference_python() -> Path:
    """The python of .venv-reference, which has JAX for the parity corpus's reference side (tests/testkit/venvs.py)."""
    return venvs.reference_venv()


@pytest.fixture(scope="session")
def nes_dir() -> Path:
    """The posteriordb NES datasets shipped beside the repository (read-only)."""
    if not NES_DIR.is_dir():
        pytest.fail(f"NES data not found at {NES_DIR}; set BATCHFIT_NES_DIR")
    return NES_DIR
