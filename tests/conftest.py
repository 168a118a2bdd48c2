"""Test-session set-up: one shared compile cache for the whole session.

PyTensor reads its compile directory at import time, so the environment is set here, before
any test module imports pytensor. Re-using the directory across sessions keeps the suite fast;
tests that need an empty cache make their own temporary one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SESSION_CACHE = Path(os.environ.get("BATCHFIT_TEST_CACHE", REPO / ".batchfit-cache" / "tests"))
SESSION_CACHE.mkdir(parents=True, exist_ok=True, mode=0o700)
os.environ["BATCHFIT_TEST_CACHE"] = str(SESSION_CACHE)
os.environ["PYTENSOR_FLAGS"] = f"base_compiledir={SESSION_CACHE / 'pytensor'}"
os.environ["NUMBA_CACHE_DIR"] = str(SESSION_CACHE / "numba")

NES_DIR = Path(os.environ.get("BATCHFIT_NES_DIR", REPO.parent / "shared" / "data" / "posteriordb-nes"))


@pytest.fixture(scope="session")
def session_cache() -> Path:
    """The compile cache shared by every test in the session."""
    return SESSION_CACHE


@pytest.fixture(scope="session")
def nes_dir() -> Path:
    """The posteriordb NES datasets shipped beside the repository (read-only)."""
    if not NES_DIR.is_dir():
        pytest.fail(f"NES data not found at {NES_DIR}; set BATCHFIT_NES_DIR")
    return NES_DIR
