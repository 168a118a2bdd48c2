"""A real SLURM: the README's cluster command on a single-node slurmctld + slurmd on loopback.

The fixture installs Debian's SLURM and munge (apt-get, as root), starts the daemons it needs and
stops exactly those by PID. Locally it skips when it cannot (not root, no apt-get, no SLURM
executor plugin: ``./setup.sh --slurm`` installs it); in CI
(``CI=true``) it fails instead, so a cluster test never silently stops running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from testkit import REPO, write_config

# The README's command for a cluster without accounting (no slurmdbd, as here), run in a copy of
# the project: the test's own settings come from a user profile (SNAKEMAKE_PROFILE), as a
# user's account and partition would.
PROFILES = Path("src", "batchfit", "workflow", "profiles")
README_COMMAND = ["--workflow-profile", str(PROFILES / "slurm"), "--configfile", "config/test-sweep.yaml"]
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
SLURM_CONF = Path("/etc/slurm/slurm.conf")
PID_FILES = {"slurmctld": Path("/run/slurm/slurmctld.pid"), "slurmd": Path("/run/slurm/slurmd.pid")}


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: CI must run this test."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the SLURM test cannot run in CI: {reason}")
    pytest.skip(reason)


def run(*cmd: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900, **kwargs)


def install() -> None:
    """Debian's SLURM and munge, unless installed (``./setup.sh --install`` stays Python-only)."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if shutil.which("apt-get") is None:
        unavailable("no apt-get to install SLURM")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", env=env)
    run("apt-get", "install", "-y", "--no-install-recommends", *PACKAGES, env=env)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_from(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def start_munge() -> int | None:
    """munged as user munge with a 1024-byte key; its PID if this test started it."""
    pid_file = Path("/run/munge/munged.pid")
    if pid_from(pid_file):
        return None  # someone else's: used, not stopped
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    run("runuser", "-u", "munge", "--", "/usr/sbin/munged")
    return wait_for(lambda: pid_from(pid_file), "munged to start")


def slurm_conf(memory_mb: int) -> str:
    host = socket.gethostname()
    return f"""ClusterName=batchfit-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=86400
ReturnToService=2
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile={PID_FILES['slurmctld']}
SlurmdPidFile={PID_FILES['slurmd']}
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def wait_for(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def node_idle() -> bool:
    proc = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.split() == ["idle"]


@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    """A single-node SLURM on loopback, for this module; its daemons stopped by PID afterwards."""
    if os.geteuid() != 0:
        unavailable("starting SLURM needs root")
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        unavailable("Snakemake's SLURM executor plugin is not installed (./setup.sh --slurm)")
    if any(pid_from(p) for p in PID_FILES.values()):
        unavailable("a SLURM is already running on this machine")
    install()
    started = [pid for pid in [start_munge()] if pid]
    previous_conf = SLURM_CONF.read_text() if SLURM_CONF.exists() else None
    try:
        for d in ("/var/spool/slurmd", "/var/spool/slurmctld", "/var/log/slurm", "/run/slurm"):
            Path(d).mkdir(parents=True, exist_ok=True)
        memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(slurm_conf(memory_mb))
        for daemon in ("slurmctld", "slurmd"):
            run(f"/usr/sbin/{daemon}")
            started.append(wait_for(lambda d=daemon: pid_from(PID_FILES[d]), f"{daemon} to start"))
        wait_for(node_idle, "the node to be idle in sinfo")
        yield
    finally:
        for pid in reversed(started):
            os.kill(pid, signal.SIGTERM)
        for pid in started:
            wait_for(lambda p=pid: not alive(p), f"process {pid} to stop", seconds=30)
        if previous_conf is None:
            SLURM_CONF.unlink(missing_ok=True)
        else:
            SLURM_CONF.write_text(previous_conf)


def project_copy(root: Path, cache: Path, extra_data: dict[str, pd.DataFrame] | None = None,
                 batch_size: int = 10) -> Path:
    """The Snakefile, profiles, models and example data under ``root``, and a small-sampler config of the example
    (the workflow is the installed package's)."""
    root.mkdir()
    shutil.copy(REPO / "Snakefile", root / "Snakefile")
    for name in ("models", PROFILES):
        shutil.copytree(REPO / name, root / name)
    shutil.copytree(REPO / "data" / "example", root / "data" / "example")
    for dataset_id, table in (extra_data or {}).items():
        table.to_csv(root / "data" / "example" / f"{dataset_id}.csv", index=False)
    example = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    # batch_size 10: two fit jobs (the default, auto, gives a cluster one job for 20 datasets), so the
    # sweep shows one compile serving every job
    config = {**example, "sampler": {**example["sampler"], "draws": 200, "tune": 200}, "cache_dir": str(cache),
              "batch_size": batch_size}
    (root / "config").mkdir()
    write_config(root / "config" / "test-sweep.yaml", config)
    return root / config["results_dir"]


def user_profile(root: Path) -> Path:
    """What a user without accounting puts in their own profile, plus quick polling for a test."""
    profile = root / "user-profile"
    profile.mkdir()
    write_config(profile / "config.yaml", {
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 3,
        "slurm-keep-successful-logs": True,
    })
    return profile


def sweep(root: Path, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *README_COMMAND], cwd=root,
                          env={**os.environ, "SNAKEMAKE_PROFILE": str(profile)},
                          capture_output=True, text=True, timeout=1800)


def cache_events(cache: Path) -> list[str]:
    stats = cache / "batchfit" / "stats.jsonl"
    return [json.loads(line)["event"] for line in stats.read_text().splitlines()] if stats.exists() else []


def fit_logs(results: Path) -> list[str]:
    return [p.read_text() for p in sorted((results / "logs" / "fit").glob("*.log"))]


@pytest.mark.slow
def test_readme_cluster_command_runs_the_example_through_slurm(slurm, tmp_path):
    cache = tmp_path / "cache"
    results = project_copy(tmp_path / "project", cache)
    proc = sweep(tmp_path / "project", user_profile(tmp_path))
    assert proc.returncode == 0, proc.stderr[-5000:]

    summary = pd.read_csv(results / "summary.csv")
    example_ids = sorted(p.stem for p in (REPO / "data" / "example").glob("*.csv"))
    assert sorted(summary["dataset"].unique()) == example_ids
    assert (results / "posteriors.nc").stat().st_size > 0
    assert (results / "status.txt").read_text().startswith("ok: ")
    assert sorted(p.stem for p in (results / "fits").glob("*.nc")) == example_ids
    # Through SLURM: the compile and fit jobs have SLURM logs; collect and status ran here.
    slurm_logs = tmp_path / "project" / ".snakemake" / "slurm_logs"
    assert sorted(p.name for p in slurm_logs.iterdir()) == ["rule_compile", "rule_fit"]
    # One compile, then a cache hit in every fit job (two batches of ten).
    logs = fit_logs(results)
    assert len(logs) == 2 and all("cache hit" in log for log in logs), logs
    assert cache_events(cache).count("miss") == 1


@pytest.mark.slow
def test_a_broken_dataset_fails_the_slurm_sweep_with_one_line_and_keeps_the_rest(slurm, tmp_path):
    cache = tmp_path / "cache"
    table = pd.read_csv(sorted((REPO / "data" / "example").glob("*.csv"))[0])
    results = project_copy(tmp_path / "project", cache, {"store_broken": table.drop(columns="y")})
    proc = sweep(tmp_path / "project", user_profile(tmp_path))
    assert proc.returncode != 0
    assert "batchfit: 1 of 21 dataset(s) failed" in proc.stderr and "  1 dataset (store_broken): " in proc.stderr
    assert "results/example/failures.csv" in proc.stderr.rstrip().splitlines()[-1], proc.stderr[-3000:]
    summary = pd.read_csv(results / "datasets.csv").set_index("dataset")["status"]
    assert len(summary) == 21 and summary["store_broken"] == "failed"
    assert (summary.drop("store_broken") != "failed").all()
    assert pd.read_csv(results / "failures.csv")["dataset"].tolist() == ["store_broken"]
    assert not (results / "status.txt").exists()  # reported, and removed so that the next run checks again
    assert all("cache hit" in log for log in fit_logs(results))
    assert cache_events(cache).count("miss") == 1


@pytest.mark.slow
def test_many_batches_go_to_slurm_as_one_job_array(slurm, tmp_path):
    """The profile's slurm-array-jobs: ten fit jobs, ready together after the compile, are one sbatch."""
    cache = tmp_path / "cache"
    results = project_copy(tmp_path / "project", cache, batch_size=2)
    proc = sweep(tmp_path / "project", user_profile(tmp_path))
    assert proc.returncode == 0, proc.stderr[-5000:]
    logs = fit_logs(results)
    assert len(logs) == 10 and all("cache hit" in log for log in logs), logs
    assert cache_events(cache).count("miss") == 1
    # The plugin names an array task's log ARRAYID_TASK.log: one array of ten tasks.
    names = sorted(p.name for p in (tmp_path / "project" / ".snakemake" / "slurm_logs" / "rule_fit").iterdir())
    arrays = {name.split("_")[0] for name in names}
    assert len(names) == 10 and all(re.fullmatch(r"\d+_\d+\.log", n) for n in names), names
    assert len(arrays) == 1, names
    # SLURM's own account of it (finished jobs stay listed: MinJobAge): ten tasks of that one array job.
    tasks = run("squeue", "--noheader", "--states=all", "--array", "--jobs", arrays.pop(), "--format=%F %K").stdout
    assert len(tasks.splitlines()) == 10 and len({line.split()[0] for line in tasks.splitlines()}) == 1, tasks
