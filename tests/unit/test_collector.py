"""batchfit.common.collector: a job's process keeps Python's garbage collector off its imports, never off its work.

Each check runs in a process of its own, as a job does: freezing the objects alive (``gc.freeze``) is for a
process batchfit owns, and pytest's is not one.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from batchfit.project import workflow_snakefile

# The rule scripts whose jobs resume the collector where their work begins.
PAUSING_SCRIPTS = ("compile", "fit", "predict", "collect", "plots", "collect_predictions", "prediction_plots")


def run_python(code: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


def test_resume_collects_again_without_what_was_alive_and_does_nothing_unless_paused() -> None:
    code = """
import gc, weakref
from batchfit.common import collector

class Node:
    pass

def cycle():
    node = Node(); node.self = node
    return weakref.ref(node)

before = gc.get_freeze_count()  # Python's own, from its start
collector.resume()  # not paused: a notebook's or a test's process is left as it is
print(gc.isenabled(), gc.get_freeze_count() == before)
collector.pause()
print(gc.isenabled())
kept = cycle()  # garbage created while paused: frozen by resume, never collected
collector.resume()
print(gc.isenabled(), gc.get_freeze_count() > before)
freed = cycle()  # garbage of the work: collected again
gc.collect()
print(kept() is not None, freed() is None)
"""
    assert run_python(code) == ["True", "True", "False", "True", "True", "True", "True"]


def test_the_rule_scripts_pause_the_collector_before_any_other_import() -> None:
    scripts = workflow_snakefile().parent / "scripts"
    for name in PAUSING_SCRIPTS:
        body = ast.parse((scripts / f"{name}.py").read_text()).body[1:]  # after the docstring
        assert ast.unparse(body[0]) == "from batchfit.common import collector", name
        assert ast.unparse(body[1]) == "collector.pause()", name


def test_paused_runs_its_block_without_the_collector_and_leaves_it_as_it_was() -> None:
    code = """
import gc
from batchfit.common import collector

with collector.paused():
    print(gc.isenabled())
print(gc.isenabled())
gc.disable()
with collector.paused():
    pass
print(gc.isenabled())
"""
    assert run_python(code) == ["False", "True", "False"]
