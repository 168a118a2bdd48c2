"""The two virtual environments the suite runs programs in, beside the test venv (.venv) it runs in.

* ``.venv-user``: batchfit installed as a user installs it (README, "Start a project"):
  ``python3.12 -m venv`` and ``pip install ./batchfit``, not editable and without extras. The
  end-to-end sweeps (tests/e2e/test_user_install.py) run its ``snakemake`` and ``batchfit``, so a
  package only the test extra installs (JAX changed what a sweep does, issue #43) cannot change
  what they see. batchfit is reinstalled from the working tree once per test session (and by
  ``setup.sh``), so it never tests stale code.
* ``.venv-reference``: the parity corpus's reference side (tests/testkit/parity_run.py), which compiles
  through PyTensor's JAX backend so that it shares no op implementation with batchfit's numba.
  JAX is installed there only: pymc, pytensor, nutpie and the readers are pinned to the
  test venv's versions. batchfit is not installed: the reference reads its files itself.

``PYTHONPATH=tests python -m testkit.venvs`` (what ``setup.sh`` runs) builds both; the suite's session fixtures
(tests/conftest.py) build a missing one. Every step holds a file lock beside the venv, since
pytest-xdist's workers ask for them at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from importlib.metadata import version
from pathlib import Path

from filelock import FileLock

from testkit import REPO

USER_VENV = REPO / ".venv-user"
REFERENCE_VENV = REPO / ".venv-reference"
# What the reference side imports (pymc, nutpie, pytensor's JAX backend, the readers of parity_run.table_data,
# posterior_checks) at the test venv's versions, so the two sides differ only in the backend.
REFERENCE_PINNED = ("pymc", "pytensor", "nutpie", "numba", "numpy", "scipy", "pandas", "xarray", "h5netcdf", "h5py",
                    "arviz", "arviz-base", "arviz-stats", "pyyaml")
REFERENCE_JAX = "jax>=0.4.30"
# Not part of a clone: what .gitignore lists, the git metadata and these venvs (a copy of the working tree
# is installed, as `pip install ./batchfit` installs a clone, without the build/ an in-tree build left).
NOT_IN_A_CLONE = (".git", ".venv*", "__pycache__", "*.egg-info", ".snakemake", ".batchfit-cache", "results",
                  ".pytest_cache", ".hypothesis", ".ruff_cache", "build", "dist")
LOCK_TIMEOUT = 3600  # seconds: a first build downloads every dependency
PIP_TIMEOUT = 3000
# One pytest run: its xdist workers share the controller's id, so batchfit is reinstalled once per run.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def _run(*args: str | Path) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=PIP_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")


def _create(venv: Path) -> Path:
    """The venv's python; the venv is made first if it has none (from the base Python of this one)."""
    python = venv / "bin" / "python"
    if not python.exists():
        shutil.rmtree(venv, ignore_errors=True)  # a build that stopped before the venv was whole
        _run(sys.executable, "-m", "venv", venv)
    return python


def user_venv(run_id: str = _RUN_ID) -> Path:
    """``.venv-user`` with this working tree's batchfit in it (installed once per `run_id`); its bin/."""
    stamp = USER_VENV / "batchfit-installed-for"
    with FileLock(f"{USER_VENV}.lock", timeout=LOCK_TIMEOUT):
        if stamp.exists() and stamp.read_text() == run_id:
            return USER_VENV / "bin"
        python = _create(USER_VENV)
        with tempfile.TemporaryDirectory(prefix="batchfit-clone-") as tmp:
            clone = Path(tmp) / "batchfit"
            shutil.copytree(REPO, clone, symlinks=True, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
            _run(python, "-m", "pip", "install", "--quiet", clone)  # what the README says: the dependencies too
            # pip keeps an installed batchfit of the same version; this tree's is the one to test
            _run(python, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", clone)
        stamp.write_text(run_id)
    return USER_VENV / "bin"


def reference_requirements() -> list[str]:
    """The reference venv's requirements: the test venv's versions of `REFERENCE_PINNED`, and JAX."""
    return [f"{name}=={version(name)}" for name in REFERENCE_PINNED] + [REFERENCE_JAX]


def reference_venv() -> Path:
    """``.venv-reference``, installed or brought to the test venv's versions; its python."""
    requirements = "\n".join(reference_requirements()) + "\n"
    stamp = REFERENCE_VENV / "batchfit-requirements.txt"
    with FileLock(f"{REFERENCE_VENV}.lock", timeout=LOCK_TIMEOUT):
        python = _create(REFERENCE_VENV)
        if not (stamp.exists() and stamp.read_text() == requirements):
            _run(python, "-m", "pip", "install", "--quiet", *requirements.split())
            stamp.write_text(requirements)
    return python


if __name__ == "__main__":
    print(f"batchfit as a user installs it: {user_venv()}", flush=True)
    print(f"the parity corpus's reference side (JAX): {reference_venv()}", flush=True)
