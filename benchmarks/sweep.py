"""A sweep four ways, side by side in one run: naive per-process pm.sample, nutpie in-process, batchfit cold and warm.

    python benchmarks/sweep.py [--n 20]

The same N simulated example datasets (``batchfit simulate``, 3-8 groups, 40-200 rows), the same
sampler settings (config/config.yaml: 2 chains x 1000 tune + 1000 draws, target_accept 0.9),
every fit written as a NetCDF file, 2 cores for everyone:

1. naive: one fresh ``python`` per dataset running plain ``pm.sample(nuts_sampler="nutpie")``
   (numba backend) on models/hierarchical.py and ``idata.to_netcdf`` -- a hand-rolled Snakemake
   rule's job. Run one after another, each with its 2 chains on 2 cores (what
   ``snakemake --cores 2`` does with ``threads: 2``; running two 1-core jobs at a time would
   only halve the chain parallelism). Snakemake's own overhead is not added. PyTensor's numba
   cache is warm (one unmeasured warm-up process first), which favours naive.
2. nutpie in-process: one process, ``nutpie.compile_pymc_model`` once per distinct shape, then
   ``with_data`` + ``nutpie.sample`` + ``to_netcdf`` per dataset. ``with_data`` cannot change
   the number of parameters, and the datasets have 3-8 groups, so it compiles once per distinct
   group count (6 for N >= 6) and all compiles count as compile time. Same warm PyTensor cache
   as naive. Its ``nutpie.sample`` time alone is the "pure sampling" reference.
3. batchfit cold: ``snakemake --cores 2 --configfile <generated>`` on an empty cache directory.
4. batchfit warm: the same again after deleting the results but keeping the cache.
   For N > 20 also warm with ``batch_size`` N/2 (one fit job per core) beside the default 10,
   to show what larger batches save.

Also the fixed-cost floor of any Snakemake sweep whose jobs sample with nutpie: Snakemake's
start-up (a dry run of the finished sweep) plus one process importing pymc and nutpie (median of
3 each). The warm sweep cannot be faster than floor + sampling, whatever batchfit does.

For each: total wall time, median per-dataset wall time, compile seconds, peak RSS of the largest
process (psutil, polling the process tree). Also: all four posteriors of one dataset agree within
Monte Carlo error (means within 0.2 posterior sd of naive's). Writes benchmarks/results/sweep.csv,
benchmarks/results/sweep.png and prints a Markdown table for the README.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# ---- what a user writes by hand (children) ----------------------------------------------------

class _Data:
    """The ``data`` object models/hierarchical.py's build_model expects: columns plus coords."""

    def __init__(self, arrays: dict, coords: dict):
        self.arrays, self.coords = arrays, coords

    def __getitem__(self, name: str):
        return self.arrays[name]


def _load(path: str) -> _Data:
    import numpy as np
    import pandas as pd

    df = pd.read_csv(path)
    labels = np.array(sorted(df["group"].unique()))
    codes = np.searchsorted(labels, df["group"].to_numpy()).astype("int64")
    return _Data({"x": df["x"].to_numpy("float64"), "y": df["y"].to_numpy("float64"), "group": codes},
                 {"group": tuple(labels)})


def _build_model_fn():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hierarchical", REPO / "models" / "hierarchical.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model


def naive_child(dataset: str, out: str, seed: int, sampler: dict) -> None:
    """One dataset, one process: build, pm.sample with nutpie, write NetCDF."""
    t0 = time.perf_counter()
    import nutpie
    import pymc as pm

    t_import = time.perf_counter()
    times = {"compile_s": 0.0, "sample_s": 0.0}
    real_compile, real_sample = nutpie.compile_pymc_model, nutpie.sample

    def compile_timed(*a, **k):  # only measures; pm.sample calls it as usual
        start = time.perf_counter()
        try:
            return real_compile(*a, **k)
        finally:
            times["compile_s"] += time.perf_counter() - start

    def sample_timed(*a, **k):
        start = time.perf_counter()
        try:
            return real_sample(*a, **k)
        finally:
            times["sample_s"] += time.perf_counter() - start

    nutpie.compile_pymc_model, nutpie.sample = compile_timed, sample_timed
    model = _build_model_fn()(_load(dataset))
    idata = pm.sample(draws=sampler["draws"], tune=sampler["tune"], chains=sampler["chains"], cores=2,
                      target_accept=sampler["target_accept"], random_seed=seed, nuts_sampler="nutpie",
                      progressbar=False, model=model)
    t_write = time.perf_counter()
    idata.to_netcdf(out)
    end = time.perf_counter()
    print(json.dumps({"import_s": t_import - t0, "write_s": end - t_write, "in_process_s": end - t0, **times}))


def nutpie_child(datasets: list[str], out_dir: str, seeds: list[int], sampler: dict) -> None:
    """All datasets in one process: compile once per distinct shape, with_data, sample, write."""
    import nutpie
    import pymc  # noqa: F401

    build_model = _build_model_fn()
    compiled: dict[int, object] = {}
    rows = []
    for path, seed in zip(datasets, seeds, strict=True):
        start = time.perf_counter()
        data = _load(path)
        n_groups = len(data.coords["group"])
        compile_s = 0.0
        if n_groups not in compiled:
            t = time.perf_counter()
            compiled[n_groups] = nutpie.compile_pymc_model(build_model(data))
            compile_s = time.perf_counter() - t
            model = compiled[n_groups]
        else:
            model = compiled[n_groups].with_data(**data.arrays)
        t = time.perf_counter()
        tree = nutpie.sample(model, draws=sampler["draws"], tune=sampler["tune"], chains=sampler["chains"], cores=2,
                             seed=seed, target_accept=sampler["target_accept"], progress_bar=False)
        sample_s = time.perf_counter() - t
        tree.to_netcdf(str(Path(out_dir) / f"{Path(path).stem}.nc"))
        rows.append({"dataset": Path(path).stem, "wall_s": time.perf_counter() - start, "compile_s": compile_s,
                     "sample_s": sample_s, "n_groups": n_groups})
    print(json.dumps({"rows": rows}))


# ---- the benchmark ----------------------------------------------------------------------------

def posterior_of(path: Path):
    """Posterior group of a written fit (DataTree NetCDF, any of the four writers)."""
    import xarray as xr

    with xr.open_datatree(path) as tree:
        return tree["posterior"].to_dataset().load()


def agreement(posteriors: dict[str, object], reference: str, tol: float = 0.2) -> tuple[bool, list[str]]:
    """Posterior means of every shared variable within ``tol`` posterior sd of the reference's."""
    import numpy as np

    ref = posteriors[reference]
    names = sorted(set.intersection(*(set(p.data_vars) for p in posteriors.values())))
    ok, lines = True, []
    for method, post in posteriors.items():
        if method == reference:
            continue
        worst = 0.0
        for name in names:
            sd = ref[name].std(("chain", "draw")).values
            diff = np.abs(post[name].mean(("chain", "draw")).values - ref[name].mean(("chain", "draw")).values)
            worst = max(worst, float(np.max(diff / sd)))
        ok &= worst <= tol
        lines.append(f"{method} vs {reference}: max |mean difference| = {worst:.3f} posterior sd "
                     f"({'ok' if worst <= tol else 'TOO LARGE'}, tolerance {tol})")
    return ok, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="number of datasets (default 20)")
    parser.add_argument("--naive-child", nargs=3, metavar=("DATASET", "OUT", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--nutpie-child", nargs=2, metavar=("DATASETS_JSON", "OUT_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--sampler", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_child:
        dataset, out, seed = args.naive_child
        naive_child(dataset, out, int(seed), json.loads(args.sampler))
        return
    if args.nutpie_child:
        spec = json.loads(Path(args.nutpie_child[0]).read_text())
        nutpie_child(spec["datasets"], args.nutpie_child[1], spec["seeds"], json.loads(args.sampler))
        return

    sys.path.insert(0, str(HERE))
    import yaml
    from common import (
        MODEL,
        PY,
        RESULTS,
        child_env,
        example_sampler,
        fresh_dir,
        load_average,
        machine_line,
        median,
        mib,
        run_tracked,
        simulate,
    )

    from batchfit.fit import dataset_seed

    root = fresh_dir(RESULTS / "sweep")
    sampler = example_sampler()
    sampler_json = json.dumps(sampler)
    data = simulate(args.n, root / "data")
    seeds = [dataset_seed(sampler["seed"], p.stem) for p in data]
    machine = machine_line()
    print(f"# sweep: {args.n} datasets; {machine}")
    check_id = data[0].stem
    results: dict[str, dict] = {}
    fit_of: dict[str, Path] = {}

    def phase(name: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name} (load average {load_average()})", flush=True)

    # 1. naive --------------------------------------------------------------------------------
    naive_pt = root / "naive-pytensor"  # PyTensor compile dir shared by naive and nutpie in-process
    naive_out = fresh_dir(root / "naive" / "fits")

    def naive(path: Path, seed: int, out: Path):
        return run_tracked([PY, __file__, "--naive-child", str(path), str(out), str(seed), "--sampler", sampler_json],
                           env=child_env(naive_pt)).check()

    phase("naive: warm-up process (fills PyTensor's numba cache; not measured)")
    warm = naive(data[0], seeds[0], root / "naive" / "warmup.nc")
    print(f"  warm-up: {warm.wall:.1f} s (cold compile {warm.json()['compile_s']:.1f} s)")
    phase(f"naive: {args.n} processes, one after another")
    start = time.perf_counter()
    runs = [naive(p, s, naive_out / f"{p.stem}.nc") for p, s in zip(data, seeds, strict=True)]
    total = time.perf_counter() - start
    results["naive"] = {
        "total_wall_s": total, "median_dataset_s": median(r.wall for r in runs),
        "compile_s": sum(r.json()["compile_s"] for r in runs),
        "peak_rss_mib": mib(max(r.peak_rss_largest for r in runs)),
        "median_sample_s": median(r.json()["sample_s"] for r in runs),
        "note": "1 process per dataset (2 chains on 2 cores), sequential; warm PyTensor cache",
    }
    fit_of["naive"] = naive_out / f"{check_id}.nc"

    # 2. nutpie in-process ----------------------------------------------------------------------
    phase("nutpie in-process: compile once per distinct group count, with_data, sample, write")
    nut_out = fresh_dir(root / "nutpie" / "fits")
    spec = root / "nutpie" / "datasets.json"
    spec.write_text(json.dumps({"datasets": [str(p) for p in data], "seeds": seeds}))
    r = run_tracked([PY, __file__, "--nutpie-child", str(spec), str(nut_out), "--sampler", sampler_json],
                    env=child_env(naive_pt)).check()
    rows = r.json()["rows"]
    pure = [row["sample_s"] for row in rows]
    results["nutpie in-process"] = {
        "total_wall_s": r.wall, "median_dataset_s": median(row["wall_s"] for row in rows),
        "compile_s": sum(row["compile_s"] for row in rows), "peak_rss_mib": mib(r.peak_rss_largest),
        "median_sample_s": median(pure),
        "note": f"1 process; {len({row['n_groups'] for row in rows})} compiles (one per group count); "
                f"pure nutpie.sample total {sum(pure):.1f} s",
    }
    fit_of["nutpie in-process"] = nut_out / f"{check_id}.nc"

    # 3./4. batchfit via snakemake ---------------------------------------------------------------
    bf = root / "batchfit"
    cache, work, res_dir = fresh_dir(bf / "cache"), fresh_dir(bf / "work"), bf / "results"
    from batchfit.config import load_config
    from batchfit.pipeline import compile_stamp_path

    def snakemake_cmd(batch_size: int) -> tuple[Path, list]:
        config_path = bf / f"config-batch{batch_size}.yaml"
        config_path.write_text(yaml.safe_dump({
            "model": str(MODEL), "datasets": [str(root / "data" / "*.csv")], "sampler": sampler,
            "batch_size": batch_size, "cache_dir": str(cache), "results_dir": str(res_dir),
        }, sort_keys=False))
        return config_path, [Path(PY).parent / "snakemake", "-s", REPO / "Snakefile", "-d", work, "--cores", "2",
                             "--configfile", config_path, "--quiet", "all"]

    stamp_path = compile_stamp_path(load_config(snakemake_cmd(10)[0]))
    runs = [("batchfit cold", 10, "empty cache"), ("batchfit warm", 10, "results deleted, cache kept")]
    half = -(-args.n // 2)
    if half > 10:  # not one of the four methods: how much a larger batch_size saves (one job per core)
        runs.append((f"batchfit warm, batch_size {half}", half, "results deleted, cache kept"))
    for label, batch_size, state in runs:
        shutil.rmtree(res_dir, ignore_errors=True)
        phase(f"{label}: snakemake --cores 2 ({state})")
        before = stamp_path.stat().st_mtime_ns if stamp_path.exists() else None
        _, cmd = snakemake_cmd(batch_size)
        r = run_tracked(cmd, env=child_env(), cwd=REPO).check()
        stamp = json.loads(stamp_path.read_text())
        if stamp_path.stat().st_mtime_ns == before:  # the cache was filled: no compile job ran
            stamp = {**stamp, "hit": True, "line": "compile job skipped (cache already filled)"}
        manifests = [json.loads(p.read_text()) for p in sorted((res_dir / "batches").glob("*.json"))]
        per = [o["seconds"] for m in manifests for o in m["datasets"].values()]
        failed = [d for m in manifests for d, o in m["datasets"].items() if o["status"] != "ok"]
        if failed or len(per) != args.n:
            raise SystemExit(f"{label}: {len(per)} datasets fitted, failed: {failed}")
        loads = [float(m["compile"].split("ready in ")[1].split(" s")[0]) for m in manifests]
        compile_s = stamp["compile_seconds"] if not stamp["hit"] else 0.0
        results[label] = {
            "total_wall_s": r.wall, "median_dataset_s": median(per), "compile_s": compile_s,
            "peak_rss_mib": mib(r.peak_rss_largest), "median_sample_s": float("nan"),
            "note": f"{len(manifests)} fit jobs of <={batch_size} datasets; {stamp['line']}; "
                    f"cache loads in fit jobs {sum(loads):.2f} s",
        }
        keep = bf / f"{label.replace(' ', '_').replace(',', '')}-{check_id}.nc"
        shutil.copy(res_dir / "fits" / f"{check_id}.nc", keep)
        fit_of[label] = keep

    # 5. the fixed-cost floor of any Snakemake sweep that samples with nutpie in a job --------------
    phase("floor: snakemake start-up (dry run, nothing to do) and one job's imports (pymc, nutpie)")
    floor = {
        "snakemake start-up": median(run_tracked([*cmd, "--dry-run"], env=child_env(), cwd=REPO).check().wall
                                     for _ in range(3)),
        "import pymc + nutpie": median(run_tracked([PY, "-c", "import pymc, nutpie"], env=child_env()).check().wall
                                       for _ in range(3)),
    }
    phase("done")

    # ---- report ------------------------------------------------------------------------------
    import numpy as np

    posteriors = {m: posterior_of(p) for m, p in fit_of.items()}
    ok, lines = agreement(posteriors, "naive")
    cold_p, warm_p = posteriors["batchfit cold"], posteriors["batchfit warm"]
    identical = all(np.array_equal(cold_p[v].values, warm_p[v].values) for v in cold_p.data_vars)

    pure_total = sum(pure)
    warm_r = results["batchfit warm"]
    naive_ratio = results["naive"]["total_wall_s"] / warm_r["total_wall_s"]
    pure_ratio = warm_r["total_wall_s"] / pure_total
    pure_ratio_median = warm_r["median_dataset_s"] / median(pure)

    with open(RESULTS / "sweep.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", "n_datasets", "total_wall_s", "median_dataset_s", "compile_s", "peak_rss_mib",
                         "note", "date_machine"])
        for method, row in results.items():
            writer.writerow([method, args.n, f"{row['total_wall_s']:.2f}", f"{row['median_dataset_s']:.3f}",
                             f"{row['compile_s']:.2f}", f"{row['peak_rss_mib']:.0f}", row["note"], machine])
        for part, seconds in floor.items():
            writer.writerow([f"floor: {part}", args.n, f"{seconds:.2f}", "", "", "", "median of 3", machine])
        writer.writerow(["pure nutpie.sample (in-process)", args.n, f"{pure_total:.2f}", f"{median(pure):.3f}",
                         "0", "", "sum / median of the nutpie.sample calls of method 2", machine])
    plot(results, pure_total, median(pure), RESULTS / "sweep.png", args.n, machine)

    print(f"\n### Sweep of {args.n} example datasets (2 chains x 1000 tune + 1000 draws)\n")
    print(f"{machine}\n")
    print("| method | total wall (s) | median per dataset (s) | compile (s) | peak RSS, largest process (MiB) |")
    print("|---|---:|---:|---:|---:|")
    for method, row in results.items():
        print(f"| {method} | {row['total_wall_s']:.1f} | {row['median_dataset_s']:.2f} | {row['compile_s']:.1f} "
              f"| {row['peak_rss_mib']:.0f} |")
    print(f"| pure `nutpie.sample` (from method 2) | {pure_total:.1f} | {median(pure):.2f} | - | - |")
    print()
    for method, row in results.items():
        print(f"- {method}: {row['note']}")
    def goal(met: bool) -> str:
        return "met" if met else "NOT met"

    print(f"\nnaive / batchfit warm (total wall): {naive_ratio:.1f}x (goal >= 10: {goal(naive_ratio >= 10)})")
    print(f"batchfit warm / pure sampling (total wall / sum of nutpie.sample): {pure_ratio:.1f} "
          f"(goal <= 3: {goal(pure_ratio <= 3)}); per-dataset medians: {pure_ratio_median:.2f}")
    for method, row in results.items():
        if method.startswith("batchfit warm, "):
            print(f"{method} / pure sampling: {row['total_wall_s'] / pure_total:.1f}")
    floor_total = sum(floor.values())
    print(f"fixed-cost floor: {' + '.join(f'{k} {v:.2f} s' for k, v in floor.items())} = {floor_total:.2f} s; "
          f"floor + pure sampling = {(floor_total + pure_total) / pure_total:.1f} x pure sampling; "
          f"batchfit warm above floor + pure sampling: {warm_r['total_wall_s'] - floor_total - pure_total:.1f} s")
    print(f"\nposterior check on {check_id} (reference: naive):")
    for line in lines:
        print(f"  {line}")
    print(f"  all agree within Monte Carlo error: {'yes' if ok else 'NO'}; "
          f"batchfit cold and warm draws identical: {'yes' if identical else 'NO'}")
    print(f"\nwrote {RESULTS / 'sweep.csv'} and {RESULTS / 'sweep.png'}")


def plot(results: dict, pure_total: float, pure_median: float, path: Path, n: int, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [*results, "pure\nnutpie.sample"]
    totals = [r["total_wall_s"] for r in results.values()] + [pure_total]
    medians = [r["median_dataset_s"] for r in results.values()] + [pure_median]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, values, title in ((axes[0], totals, f"total wall time, {n} datasets (s)"),
                              (axes[1], medians, "median wall time per dataset (s)")):
        colors = ["#b0b0b0", "#8fb3d9", "#f0a35e", *["#d9534f"] * (len(values) - 4), "#5cb85c"]
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)), [label.replace(" ", "\n", 1) for label in labels], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    fig.suptitle(machine, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
