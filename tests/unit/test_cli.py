"""The ``batchfit`` command explains itself: a version, and help with defaults for every option."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from testkit import HIERARCHICAL, REPO, write_config

from batchfit.cli import _parser

BATCHFIT = str(Path(sys.executable).with_name("batchfit"))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version_is_the_installed_distributions() -> None:
    run = subprocess.run([BATCHFIT, "--version"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"batchfit {version('batchfit')}"


def test_every_command_has_help() -> None:
    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helped = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(helped) == set(sub.choices)
    for name, text in helped.items():
        assert text and len(text) > 20, f"command {name} has no help text"
        assert sub.choices[name].description, f"command {name} has no description"


@pytest.mark.parametrize("command", sorted(_subparsers(_parser())))
def test_every_option_says_what_it_does_and_its_default(command: str) -> None:
    parser = _subparsers(_parser())[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"batchfit {command} {name} has no help text"
        shown = formatter._expand_help(action)
        if not action.required:
            assert "default" in shown or "required" in shown, (
                f"batchfit {command} {name}: the help does not say its default: {shown!r}")


def test_help_runs_for_every_command() -> None:
    for command in _subparsers(_parser()):
        run = subprocess.run([BATCHFIT, command, "--help"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "usage: batchfit " + command in run.stdout, run.stderr


def test_a_config_error_exits_2_with_its_message_on_stderr(tmp_path: Path) -> None:
    """The console script ends through `batchfit.common.quick_exit`: its code and message still arrive."""
    run = subprocess.run([BATCHFIT, "status", "--config", str(tmp_path / "missing.yaml")], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "missing.yaml" in run.stderr and "cannot read the config file" in run.stderr


def test_quick_exit_flushes_logs_and_streams_and_keeps_the_exit_code(tmp_path: Path) -> None:
    """What the interpreter's teardown would have flushed is flushed: a log file, buffered stdout and
    stderr (a pipe, so fully buffered), and the code is the process's exit code."""
    code = f"""
import logging, sys
from batchfit.common.quick_exit import quick_exit
logging.getLogger().addHandler(logging.FileHandler({str(tmp_path / "job.log")!r}))
logging.getLogger().warning("logged line")
print("to stdout", end="")
sys.stderr.write("to stderr")
quick_exit(3)
print("never")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (3, "to stdout", "to stderr")
    assert (tmp_path / "job.log").read_text() == "logged line\n"


def test_output_closed_early_ends_quietly_as_unix_tools_do(tmp_path: Path) -> None:
    """``batchfit status ... | head``: the reader is gone before batchfit writes (its end of the pipe
    closed at once, so the test does not race it): no traceback, the exit status of a process SIGPIPE
    ended (what a shell shows for ``yes | head -1``'s ``yes``)."""
    (tmp_path / "data").mkdir()
    shutil.copy(REPO / "data" / "example" / "store_000.csv", tmp_path / "data")
    write_config(tmp_path / "config.yaml", {"model": str(HIERARCHICAL), "datasets": ["data/*.csv"]})
    args = [BATCHFIT, "status", "--config", "config.yaml"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE, stderr
    assert stderr == "", stderr
    # the same command with its output read is whole and exits 0
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout and not done.stderr, done
