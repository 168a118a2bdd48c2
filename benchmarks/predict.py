"""Predictions for many datasets, side by side in one run: batchfit's predict stage against a loop calling
``pm.sample_posterior_predictive(..., predictions=True)`` per dataset in one process.

    python benchmarks/predict.py [--n 1000] [--points 100] [--cores 2]

Both predict the same ``--n`` fits of the bundled example model (simulated example datasets, fitted by
batchfit with 4 chains x 1000 draws: 4,000 draws each) on a curve of ``--points`` new rows (the grid
``x`` from -2 to 2 in the dataset's first group), and write one NetCDF file per dataset with the groups
``predictions`` and ``predictions_constant_data``:

1. batchfit: ``snakemake predict --cores C`` on the finished sweep (the forward function compiled by
   the sweep's compile job already, as in any sweep with ``predict:``): the predict jobs, predictions.csv
   and the report's curves. Also ``batchfit predict`` (the whole stage in one process, one core), and
   each predict job's median time per dataset (from its log).
2. PyMC: one process looping over the datasets as a user would by hand: build the dataset's model from
   the model file, ``pm.set_data`` the grid, ``pm.sample_posterior_predictive(fit, predictions=True,
   random_seed=...)`` on the fit file, ``to_netcdf``. Each call compiles PyMC's forward function again.

The fits (not timed) come first; before each timed run the files written so far are synced to disk, so
that no run pays for writing back the run before it. Both sides use each dataset's own seed, and the first datasets'
predictions are checked to be the same draws. Prints the wall times, their ratio, the load average
before and after (the machine may be shared) and a Markdown table for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402
    MODEL,
    PY,
    RESULTS,
    child_env,
    example_build_model,
    example_columns,
    fresh_dir,
    load_average,
    load_example,
    machine_line,
    run_tracked,
    simulate,
)

SAMPLER = {"draws": 1000, "tune": 500, "chains": 4, "target_accept": 0.9, "seed": 2026}
CHECKED = 3  # datasets whose predictions both sides must draw alike


def pymc_child(project: str, ids: list[str], points: int, out: str) -> None:
    """The loop a user writes: per dataset, the model on the grid, PyMC's predictions on the fit, NetCDF."""
    import logging
    import warnings

    import numpy as np
    import pymc as pm
    import xarray as xr

    from batchfit.fitting.fitter import dataset_seed

    logging.getLogger("pymc").setLevel(logging.ERROR)
    build_model = example_build_model()
    seconds = []
    root = Path(project)
    grid = np.linspace(-2.0, 2.0, points)
    for dataset_id in ids:
        start = time.perf_counter()
        model = build_model(load_example(root / "data" / f"{dataset_id}.csv"))
        with model:
            pm.set_data({"x": grid, "group": np.zeros(points, dtype="int64"), "y": np.zeros(points)})
        with xr.open_datatree(root / "results" / "fits" / f"{dataset_id}.nc") as fit, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predictions = pm.sample_posterior_predictive(fit.load(), model=model, predictions=True, progressbar=False,
                                                         random_seed=dataset_seed(2026, dataset_id))
        predictions.to_netcdf(Path(out) / f"{dataset_id}.nc")
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="datasets")
    parser.add_argument("--points", type=int, default=100, help="new rows of each dataset's curve")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        project, out, ids = args.child
        pymc_child(project, ids.split(","), args.points, out)
        return

    import numpy as np
    import xarray as xr
    import yaml

    root = fresh_dir(RESULTS / "predict")
    ids = [p.stem for p in simulate(args.n, root / "data", prefix="store")]
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(MODEL), "datasets": ["data/*.csv"], "sampler": SAMPLER, "columns": example_columns(),
        "cache_dir": str(root / "cache"), "results_dir": "results",
        "predict": {"grid": {"group": ["g00"], "x": {"start": -2.0, "stop": 2.0, "num": args.points}}}}))
    snakemake = [str(Path(PY).with_name("snakemake")), "--snakefile", str(REPO / "Snakefile"), "--directory",
                 str(root), "--configfile", str(config), "--cores", str(args.cores)]
    print(f"fitting {args.n} datasets ({SAMPLER['chains']} x {SAMPLER['draws']} draws), not timed ...", flush=True)
    run_tracked([*snakemake, "results/datasets.csv"], env=child_env(), cwd=root).check()
    # Once more, untimed: a run after a run that fitted collects again (its inputs, the fit jobs' manifests, are
    # gone), which is the fits' cost, not the predictions'.
    run_tracked([*snakemake, "results/datasets.csv"], env=child_env(), cwd=root).check()

    # Before each timed run the files written so far go to disk (os.sync): a run must not pay for writing back
    # what the run before it wrote (0.9 GB of fits for 1,000 datasets; 3 GB of predictions).
    os.sync()
    load_before = load_average()
    print("batchfit: snakemake predict ...", flush=True)
    batchfit = run_tracked([*snakemake, "predict"], env=child_env(), cwd=root).check()
    ours = root / "results" / "predictions"
    kept = root / "batchfit-predictions"
    shutil.rmtree(kept, ignore_errors=True)
    ours.rename(kept)  # kept for the check below; `batchfit predict` writes its own
    os.sync()
    print("batchfit: batchfit predict (one process) ...", flush=True)
    one = run_tracked([str(Path(PY).with_name("batchfit")), "predict", "--config", str(config)], env=child_env(),
                      cwd=root).check()
    print("PyMC: a loop of pm.sample_posterior_predictive ...", flush=True)
    out = fresh_dir(root / "pymc-predictions")
    os.sync()
    pymc = run_tracked([PY, __file__, "--points", str(args.points), "--child", str(root), str(out), ",".join(ids)],
                       env=child_env(), cwd=root).check()
    load_after = load_average()

    per_dataset = pymc.json()["seconds"]
    ours_per_dataset = [float(s) for log in (root / "results" / "logs" / "predict").glob("*.log")
                        for s in re.findall(r": ok in ([0-9.]+) s", log.read_text())[1:]]
    for dataset_id in ids[:CHECKED]:
        with xr.open_datatree(kept / f"{dataset_id}.nc") as a, xr.open_datatree(out / f"{dataset_id}.nc") as b:
            if not np.array_equal(a["predictions"]["y_obs"].values, b["predictions"]["y_obs"].values):
                raise RuntimeError(f"{dataset_id}: batchfit's and PyMC's predictions differ")
    rows = [("batchfit, snakemake predict", args.cores, batchfit.wall),
            ("batchfit predict, one process", 1, one.wall),
            ("pm.sample_posterior_predictive loop, one process", 1, pymc.wall)]
    print(f"\n{args.n} datasets x {args.points} new rows, {SAMPLER['chains'] * SAMPLER['draws']} draws each; "
          f"the first {CHECKED} datasets' predictions identical on both sides")
    print(f"PyMC per dataset: first {per_dataset[0]:.2f} s, median of the others "
          f"{float(np.median(per_dataset[1:])) if len(per_dataset) > 1 else float('nan'):.3f} s; batchfit's predict "
          f"jobs per dataset (their first left out): median {float(np.median(ours_per_dataset)):.3f} s")
    print("\n| method | cores | wall (s) | per dataset (ms) | PyMC loop / this |\n|---|---|---|---|---|")
    for name, cores, wall in rows:
        print(f"| {name} | {cores} | {wall:.1f} | {1000 * wall / args.n:.1f} | {pymc.wall / wall:.1f}x |")
    print(f"\nload average (1, 5, 15 min) before: {load_before}; after: {load_after}")
    print(f"machine: {machine_line()}")


if __name__ == "__main__":
    main()
