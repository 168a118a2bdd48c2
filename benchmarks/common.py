"""Helpers shared by the benchmarks: paths, child processes with peak-RSS tracking, environment info.

Only public tools: time.perf_counter, subprocess, psutil, importlib.metadata. Every benchmark
keeps its caches and outputs under benchmarks/results/<name>/ (git-ignored).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MODEL = REPO / "models" / "hierarchical.py"
EXAMPLE_DATA = REPO / "data" / "example"
PY = sys.executable


def example_sampler() -> dict:
    """The bundled example's sampler settings (config/config.yaml), so every benchmark matches it."""
    return dict(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["sampler"])


def example_columns() -> dict:
    """The bundled example's column coding (config/config.yaml): groups coded per dataset, as a
    process fitting one dataset codes them, so every method fits the same parameters."""
    return dict(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["columns"])


def fresh_dir(path: Path) -> Path:
    """An empty directory (removed first if present)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def child_env(pytensor_dir: Path | None = None) -> dict[str, str]:
    """The environment for a child process: no inherited PyTensor compile directory, or exactly ``pytensor_dir``.

    Python's bytecode cache on, as in a user's environment: a ``PYTHONDONTWRITEBYTECODE`` set where the
    benchmark runs (a sandbox's setting) would make every process compile batchfit's sources again
    (its editable install has no ``.pyc`` files but those Python writes), which an installed package,
    whose ``.pyc`` files pip writes, never does. Every method gets the same environment.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    flags = [f for f in env.get("PYTENSOR_FLAGS", "").split(",") if f and not f.startswith("base_compiledir=")]
    if pytensor_dir is not None:
        flags.append(f"base_compiledir={pytensor_dir}")
    if flags:
        env["PYTENSOR_FLAGS"] = ",".join(flags)
    else:
        env.pop("PYTENSOR_FLAGS", None)
    bindir = str(Path(PY).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def simulate(n: int, out_dir: Path, prefix: str = "store", seed: int = 2026) -> list[Path]:
    """Write ``n`` example datasets with ``batchfit simulate`` (in a child, keeping this process small)."""
    fresh_dir(out_dir)
    subprocess.run([PY, "-m", "batchfit.cli", "simulate", "--model", str(MODEL), "--n", str(n),
                    "--out", str(out_dir), "--prefix", prefix, "--seed", str(seed)],
                   check=True, capture_output=True, text=True, env=child_env())
    return sorted(out_dir.glob(f"{prefix}_*.csv"))


@dataclass
class Run:
    """One child process (tree): wall seconds, exit code, output and peak resident memory."""

    cmd: list[str]
    wall: float
    returncode: int
    stdout: str
    stderr: str
    peak_rss_largest: int  # bytes: the largest single process of the tree at any poll
    peak_rss_tree: int  # bytes: the whole tree's sum at any poll
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (command line, peak RSS bytes)

    def peak_of(self, part: str) -> int:
        """The largest peak RSS (bytes) of the tree's processes whose command line contains ``part``."""
        return max((rss for cmdline, rss in self.peaks.values() if part in cmdline), default=0)

    def json(self) -> dict:
        """The last line of stdout that is a JSON object (how the child scripts report)."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"no JSON result from {' '.join(self.cmd)}:\n{self.stderr[-3000:]}")

    def check(self) -> Run:
        if self.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, self.cmd))} failed ({self.returncode}):\n"
                               f"{self.stdout[-2000:]}\n{self.stderr[-4000:]}")
        return self


def run_tracked(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                poll: float = 0.2) -> Run:
    """Run ``cmd``, polling the RSS of its whole process tree with psutil until it exits.

    Each poll walks /proc (~1 ms of a core) on the cores the run measured uses: every 0.05 s
    that took 0.25-0.30 s of CPU over a 10 s warm sweep of 100 datasets on 2 cores, every 0.2 s
    0.08 s (measured side by side, 2026-12-04). The memory goals are for runs whose jobs last
    many polls; a job shorter than a poll may be missed (reported as not measured).
    """
    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=err, env=env, cwd=cwd)
        largest = tree = 0
        peaks: dict[int, tuple[str, int]] = {}
        stop = threading.Event()

        def watch() -> None:
            nonlocal largest, tree
            try:
                root = psutil.Process(proc.pid)
            except psutil.NoSuchProcess:
                return
            while not stop.is_set():
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    break
                total = 0
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        cmdline = " ".join(p.cmdline())
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    # Read at every poll: a process first seen between fork and exec (Snakemake
                    # starting a job) still shows its parent's command line; once it has exec'd,
                    # it is another program, whose peak starts anew.
                    seen, peak = peaks.get(p.pid, (cmdline, 0))
                    peaks[p.pid] = (cmdline, max(peak if seen == cmdline else 0, rss))
                    largest = max(largest, rss)
                    total += rss
                tree = max(tree, total)
                stop.wait(poll)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        rc = proc.wait()
        wall = time.perf_counter() - start
        stop.set()
        watcher.join()
        out.seek(0)
        err.seek(0)
        return Run(list(map(str, cmd)), wall, rc, out.read(), err.read(), largest, tree, peaks)


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """Date, machine and library versions, for the tables pasted into benchmarks/README.md."""
    libs = ", ".join(f"{name} {version(name)}" for name in ("batchfit", "pymc", "pytensor", "nutpie", "numba"))
    return (f"{datetime.date.today().isoformat()}; {os.cpu_count()} cores ({cpu_model()}); "
            f"Python {platform.python_version()}; {libs}")


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ---- the bundled example as a user loads it by hand (children) ------------------------------------

class ExampleData:
    """The ``data`` object models/hierarchical.py's build_model expects: columns plus coords."""

    def __init__(self, arrays: dict, coords: dict):
        self.arrays, self.coords = arrays, coords

    def __getitem__(self, name: str):
        return self.arrays[name]


def load_example(path: str | Path) -> ExampleData:
    import numpy as np
    import pandas as pd

    df = pd.read_csv(path)
    labels = np.array(sorted(df["group"].unique()))
    codes = np.searchsorted(labels, df["group"].to_numpy()).astype("int64")
    return ExampleData({"x": df["x"].to_numpy("float64"), "y": df["y"].to_numpy("float64"), "group": codes},
                       {"group": tuple(labels)})


def example_build_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hierarchical", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model
