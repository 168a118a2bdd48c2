"""Only a job's main thread imports: no module is ever first imported in another thread.

Imports that libraries make lazily (a module imported inside a function, ``lazy_loader``'s lazy
modules) are not safe in a second thread: two threads importing the same package can meet a
partially initialised module (issue #43: ``cannot import name 'rcParams' from partially
initialized module 'arviz_base'``). batchfit's processes run other threads (the compile job's
worker waiters, a fit job's lane readers, collect's helper feeders, nutpie's chain threads, which
call back into Python for initial points); this test runs a real sweep that starts each of them,
with an import hook in every process, and fails if any module is first imported outside the
main thread of a batchfit process.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from testkit import HIERARCHICAL, snakemake, sweep_settings, write_config

from batchfit.model.simulate import simulate_datasets

# Put first on sys.meta_path of every process of the sweep (through PYTHONPATH): records, for each
# module looked up (= not yet imported), the thread that looks it up, in a file per process.
HOOK = textwrap.dedent('''
    import json, os, sys, threading

    _OUT = os.environ["BATCHFIT_IMPORT_AUDIT"]

    class _Audit:
        def find_spec(self, name, path=None, target=None):
            thread = threading.current_thread()
            main = thread is threading.main_thread()
            if not main or name == "nutpie":
                with open(os.path.join(_OUT, f"{os.getpid()}.jsonl"), "a") as fh:
                    fh.write(json.dumps({"argv": sys.argv, "thread": thread.name, "main": main,
                                         "module": name}) + "\\n")
            return None

    sys.meta_path.insert(0, _Audit())
''')


def _batchfit_process(argv: list[str]) -> bool:
    """A rule script that Snakemake runs, or one of batchfit's helper processes (``python -m batchfit.x``)."""
    first = argv[0] if argv else ""
    return ".snakemake/scripts/" in first or f"{os.sep}batchfit{os.sep}" in first or first == "-m"


@pytest.mark.slow
def test_a_sweep_imports_only_in_main_threads(tmp_path: Path) -> None:
    hook_dir, audit = tmp_path / "hook", tmp_path / "audit"
    hook_dir.mkdir()
    audit.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    # 50 datasets: collect then shares summaries out to a helper process (batchfit.outputs.summary_pool)
    simulate_datasets(HIERARCHICAL, tmp_path / "data", 50, seed=3, prefix="shop")
    config = write_config(tmp_path / "config.yaml", sweep_settings(
        tmp_path / "cache",  # a cold cache: the compile job runs two workers
        # one chain and two cores: a fit job runs two lanes
        sampler={"draws": 100, "tune": 100, "chains": 1, "seed": 5}, batch_size=50,
        columns={"group": {"scope": "dataset"}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook_dir), os.environ.get("PYTHONPATH")])),
           "BATCHFIT_IMPORT_AUDIT": str(audit)}
    run = snakemake(tmp_path, config, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    log = (tmp_path / "results" / "logs" / "fit").glob("*.log")
    assert any("this process and 1 helper process" in path.read_text() for path in log), "no fit job ran two lanes"
    assert "in 2 processes" in (tmp_path / "results" / "logs" / "collect.log").read_text(), "collect used no helper"

    records = [json.loads(line) for path in audit.glob("*.jsonl") for line in path.read_text().splitlines()]
    ours = [r for r in records if _batchfit_process(r["argv"])]
    assert any(r["main"] and r["module"] == "nutpie" for r in ours), "the hook saw no batchfit process import nutpie"
    off_main = sorted({(r["thread"], r["module"], " ".join(r["argv"])[:120]) for r in ours if not r["main"]})
    assert off_main == [], "modules imported outside a main thread:\n" + "\n".join(map(str, off_main))
