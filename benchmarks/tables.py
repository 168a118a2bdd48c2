"""One table of many groups against one file per dataset: planning, checking and a real sweep, side by side.

    python benchmarks/tables.py [--plan-n 100000] [--sweep-n 20000] [--skip-files-check]

The data: a tiny regression (``y ~ Normal(a + b x, sigma)``, 8 rows per dataset, ``benchmarks/tiny_model.py``),
written once as one Parquet table split by a ``gene`` key (the table source ``{table: genes.parquet, by:
gene}``) and as one CSV file per gene (what users wrote splitter scripts for), under
benchmarks/results/tables/ (git-ignored).

Planning (``--plan-n``, default 100,000 datasets): ``snakemake -n`` of a fresh sweep, wall time and peak
resident memory of the Snakemake process, for the table and for the files; then ``batchfit check`` of
each (every dataset's data checked; past 2000 datasets the models of one dataset per distinct shape and
a sample are built). Goals: the table's ``snakemake -n`` <= 30 s and <= 1 GiB, its check <= 60 s.

A real sweep (``--sweep-n``, default 20,000): ``snakemake --cores 2`` of the table and of the files,
one after the other on a warm cache (the model compiled before either), printing seconds per dataset
of each and their ratio (goal: the table's no slower), and collect's peak memory against a sweep of a
tenth as many datasets (goal: flat).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import (  # noqa: E402
    PY,
    REPO,
    RESULTS,
    child_env,
    fresh_dir,
    load_average,
    machine_line,
    mib,
    run_tracked,
)

OUT = RESULTS / "tables"
MODEL = HERE / "tiny_model.py"
ROWS = 8
SNAKEMAKE = Path(PY).with_name("snakemake")
BATCHFIT = Path(PY).with_name("batchfit")
SAMPLER = {"draws": 300, "tune": 300, "chains": 2, "seed": 2026}


def write_data(n: int, directory: Path) -> None:
    """``genes.parquet`` (n groups) and ``files/g{i}.csv`` (the same rows, a file per gene), once per n."""
    import numpy as np
    import pandas as pd

    done = directory / "written.json"
    if done.exists() and json.loads(done.read_text()) == {"n": n}:
        return
    fresh_dir(directory)
    rng = np.random.default_rng(2026)
    genes = np.repeat([f"g{i:06d}" for i in range(n)], ROWS)
    x = rng.normal(size=n * ROWS).round(4)
    y = (1.0 + 0.5 * x + rng.normal(0.0, 0.3, n * ROWS)).round(4)
    frame = pd.DataFrame({"gene": genes, "x": x, "y": y})
    frame.to_parquet(directory / "genes.parquet", row_group_size=100_000)
    files = directory / "files"
    files.mkdir()
    for gene, rows in frame.groupby("gene", sort=False):
        rows[["x", "y"]].to_csv(files / f"{gene}.csv", index=False)
    done.write_text(json.dumps({"n": n}))


def config(directory: Path, source: object, name: str) -> Path:
    import yaml

    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"model": str(MODEL), "datasets": [source], "sampler": SAMPLER,
                                    "cache_dir": str(OUT / "cache"), "results_dir": f"results-{name}"}))
    return path


def snakemake(directory: Path, configfile: Path, *args: str):
    return run_tracked([SNAKEMAKE, *args, "--cores", "2", "--snakefile", REPO / "Snakefile", "--directory",
                        directory, "--configfile", configfile], env=child_env(), cwd=directory)


def plan_and_check(n: int, check_files: bool) -> None:
    directory = OUT / f"plan-{n}"
    started = time.perf_counter()
    write_data(n, directory)
    print(f"data: {n} datasets of {ROWS} rows, as one Parquet table and as {n} CSV files "
          f"({time.perf_counter() - started:.0f} s to write or find)")
    sources = {"table": {"table": "genes.parquet", "by": "gene"}, "files": "files/*.csv"}
    dry = {}
    for name, source in sources.items():
        configfile = config(directory, source, name)
        run = snakemake(directory, configfile, "-n").check()
        dry[name] = run
        print(f"snakemake -n, {name:5s}: {run.wall:6.1f} s, peak RSS {mib(run.peak_rss_largest):6.0f} MiB")
    print(f"snakemake -n, files/table: {dry['files'].wall / dry['table'].wall:.1f}x the time, "
          f"{dry['files'].peak_rss_largest / dry['table'].peak_rss_largest:.1f}x the memory")
    for name in sources if check_files else ["table"]:
        run = run_tracked([BATCHFIT, "check", "--config", f"{name}.yaml"], env=child_env(), cwd=directory)
        verdict = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-300:]
        print(f"batchfit check, {name:5s}: {run.wall:6.1f} s, peak RSS {mib(run.peak_rss_largest):6.0f} MiB "
              f"({verdict})")


def sweep(n: int) -> None:
    sizes = [max(1, n // 10), n]
    per_dataset: dict[tuple[str, int], float] = {}
    collect_peak: dict[tuple[str, int], float] = {}
    for size in sizes:
        directory = OUT / f"sweep-{size}"
        write_data(size, directory)
        for name, source in {"table": {"table": "genes.parquet", "by": "gene"}, "files": "files/*.csv"}.items():
            configfile = config(directory, source, name)
            fresh_dir(directory / f"results-{name}")
            run = snakemake(directory, configfile).check()
            per_dataset[name, size] = run.wall / size
            collect_peak[name, size] = mib(run.peak_of("scripts/collect.py") or run.peak_of("collect"))
            print(f"sweep of {size:6d} datasets, {name:5s}: {run.wall:7.1f} s, {1000 * run.wall / size:6.1f} ms per "
                  f"dataset; collect's peak RSS {collect_peak[name, size]:.0f} MiB")
    print(f"per dataset, table/files at {n}: {per_dataset['table', n] / per_dataset['files', n]:.2f} "
          "(goal: <= 1)")
    print(f"collect's peak RSS, table, {n} against {sizes[0]} datasets: "
          f"{collect_peak['table', n] / max(collect_peak['table', sizes[0]], 1):.2f}x (goal: flat)")


def warm_cache() -> None:
    """Compile the model once, so that neither sweep pays it."""
    directory = OUT / "warm"
    write_data(20, directory)
    configfile = config(directory, {"table": "genes.parquet", "by": "gene"}, "table")
    fresh_dir(directory / "results-table")
    snakemake(directory, configfile).check()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan-n", type=int, default=100_000)
    parser.add_argument("--sweep-n", type=int, default=20_000)
    parser.add_argument("--skip-files-check", action="store_true", help="check the table only (the files' check "
                        "reads every file: minutes)")
    args = parser.parse_args()
    print(f"# benchmarks/tables.py: {machine_line()}; load {load_average()}")
    if args.plan_n:
        plan_and_check(args.plan_n, not args.skip_files_check)
    if args.sweep_n:
        warm_cache()
        sweep(args.sweep_n)
    print(f"# load at the end: {load_average()}")


if __name__ == "__main__":
    main()
