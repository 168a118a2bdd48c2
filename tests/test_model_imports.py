"""The user modules a model file imports, found from its source, are the ones Python loads.

The reference is Python itself: a child process with the helpers on ``PYTHONPATH`` runs the
model file and calls ``build_model`` (which imports one more module), and lists the modules it
loaded from the helpers' directory. The static scan must find exactly those, with their files'
sha256, and nothing from the standard library or installed packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchfit.model_imports import user_imports

FILES = {
    # a package whose __init__ pulls a module by a relative import, which imports a plain module
    "bfh_pkg/__init__.py": "from .scales import NOISE\n",
    "bfh_pkg/scales.py": "import math\n\nfrom bfh_plain import BASE\n\nNOISE = math.sqrt(BASE) * 2\n",
    # a subpackage reached only from inside build_model, two relative levels deep
    "bfh_pkg/sub/__init__.py": "",
    "bfh_pkg/sub/deep.py": "from ..scales import NOISE as _NOISE\n\nDEEP = _NOISE\n",
    "bfh_plain.py": "BASE = 1.0\n",
    "bfh_unused.py": "UNUSED = 1\n",  # on the path, never imported: must not count
}

MODEL = """
import os
from collections import OrderedDict

import numpy as np

from bfh_pkg import NOISE

try:
    import bfh_not_installed_anywhere
except ImportError:
    bfh_not_installed_anywhere = None


def build_model(data):
    from bfh_pkg.sub import deep
    return NOISE + deep.DEEP
"""

LOADED = """
import json, runpy, sys
namespace = runpy.run_path(sys.argv[1])
namespace["build_model"](None)
lib = sys.argv[2]
print(json.dumps({name: m.__file__ for name, m in sys.modules.items()
                  if (getattr(m, "__file__", None) or "").startswith(lib)}))
"""


@pytest.fixture
def helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The helper files under ``lib/`` (on this process's path) and a model file importing them."""
    lib = tmp_path / "lib"
    for name, text in FILES.items():
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(text)
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(lib))
    return tmp_path


def test_the_scan_finds_exactly_the_user_modules_python_loads(helpers: Path) -> None:
    lib = helpers / "lib"
    env = {**os.environ, "PYTHONPATH": str(lib)}
    run = subprocess.run([sys.executable, "-c", LOADED, str(helpers / "model.py"), str(lib)],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    loaded = json.loads(run.stdout)
    assert set(loaded) == {"bfh_pkg", "bfh_pkg.scales", "bfh_pkg.sub", "bfh_pkg.sub.deep", "bfh_plain"}

    found = user_imports(helpers / "model.py")
    assert found == {name: hashlib.sha256(Path(path).read_bytes()).hexdigest() for name, path in loaded.items()}


def test_an_edit_to_a_helper_two_imports_away_changes_the_result(helpers: Path) -> None:
    before = user_imports(helpers / "model.py")
    plain = helpers / "lib" / "bfh_plain.py"
    plain.write_text("BASE = 4.0\n")
    after = user_imports(helpers / "model.py")
    assert after["bfh_plain"] != before["bfh_plain"]
    assert {k: v for k, v in after.items() if k != "bfh_plain"} == {k: v for k, v in before.items()
                                                                   if k != "bfh_plain"}


def test_the_scan_imports_nothing(helpers: Path) -> None:
    """The plan runs the scan at every Snakemake parse: it must not execute the user's code."""
    (helpers / "lib" / "bfh_pkg" / "__init__.py").write_text("raise RuntimeError('executed')\n")
    assert "bfh_pkg" in user_imports(helpers / "model.py")
    assert not any(name.startswith("bfh_") for name in sys.modules)
