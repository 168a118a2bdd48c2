"""A sweep four ways, side by side in one run: naive per-process pm.sample, nutpie in-process, batchfit cold and warm;
and how batchfit's per-dataset cost scales with N.

    python benchmarks/sweep.py [--n 20 100] [--scaling 100 1000 10000] [--cores 2]

For each ``--n``: the same N simulated example datasets (``batchfit simulate``, 3-8 groups,
40-200 rows), the same sampler settings (config/config.yaml: 2 chains x 1000 tune + 1000 draws,
target_accept 0.9), every fit written as a NetCDF file, ``--cores`` cores for everyone:

1. naive: one fresh ``python`` per dataset running plain ``pm.sample(nuts_sampler="nutpie")``
   (numba backend) on models/hierarchical.py and ``idata.to_netcdf`` -- what a user with
   ``xargs -P`` or a job array runs: as many processes at once as there are cores, each with
   pm.sample's own chain parallelism. PyTensor's numba cache is warm (one unmeasured warm-up
   process first), which favours naive.
2. nutpie in-process: one process, ``nutpie.compile_pymc_model`` once per distinct shape, then
   ``with_data`` + ``nutpie.sample`` + ``to_netcdf`` per dataset. ``with_data`` cannot change
   the number of parameters, and the datasets have 3-8 groups, so it compiles once per distinct
   group count (6 for N >= 6) and all compiles count as compile time. Same warm PyTensor cache
   as naive. Its ``nutpie.sample`` time alone is the "pure sampling" reference.
3. batchfit cold: ``snakemake --cores C --configfile <generated>`` (default settings:
   ``batch_size: auto``) on an empty cache directory.
4. batchfit warm: the same again after deleting the results but keeping the cache, three times:
   right after cold and twice after naive and nutpie (batchfit runs first); the median of the
   three is the warm figure, all three are printed.

Also the fixed-cost floor of any Snakemake sweep whose jobs sample with nutpie: Snakemake's
start-up (a dry run of the finished sweep) plus one process importing pymc and nutpie (median of
3 each), and each batchfit run's per-rule breakdown from Snakemake's ``benchmark:`` files
(``results_dir/benchmarks/``: wall seconds and peak RSS of every compile, fit, collect and
status job).

For each: total wall time, median per-dataset wall time, compile seconds, peak RSS of the largest
process (psutil, polling the process tree). Also: all four posteriors of one dataset agree within
Monte Carlo error (means within 0.2 posterior sd of naive's). Writes benchmarks/results/sweep.csv,
benchmarks/results/sweep-N.png and prints a Markdown table for benchmarks/README.md.

``--scaling``: for each N, N tiny datasets (30 rows, 3 groups; 2 chains x 200 + 200 draws), a
warm ``snakemake --cores C`` sweep (the cache filled by Snakemake's compile job first, unmeasured)
beside pure sampling (``nutpie.sample`` in one process on up to 100 of them, per dataset). Two
ratios: the sweep's wall time over N times pure sampling's median (``ratio_to_pure``, the measure
of the --n table and of the throughput issue's goals: <= 2.0 at N=100, <= 1.3 at N=1,000), and
over that divided by the cores (``ratio_to_pure_over_cores``: stricter, as if pure sampling
used every core for every dataset). Writes benchmarks/results/scaling.csv and scaling.png:
per-dataset cost against N, with the peak RSS of the largest fit job, collect, plots and report
pages.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    example_sampler,
    fresh_dir,
    load_average,
    load_example,
    machine_line,
    median,
    mib,
    run_tracked,
    simulate,
)

# ---- what a user writes by hand (children) ----------------------------------------------------

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
    model = example_build_model()(load_example(dataset))
    idata = pm.sample(draws=sampler["draws"], tune=sampler["tune"], chains=sampler["chains"],
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

    build_model = example_build_model()
    compiled: dict[int, object] = {}
    rows = []
    for path, seed in zip(datasets, seeds, strict=True):
        start = time.perf_counter()
        data = load_example(path)
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
        tree = nutpie.sample(model, draws=sampler["draws"], tune=sampler["tune"], chains=sampler["chains"],
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
    parser.add_argument("--n", type=int, nargs="*", default=[20], help="datasets of each side-by-side run (20)")
    parser.add_argument("--scaling", type=int, nargs="*", default=[], help="N of tiny datasets for the scaling")
    parser.add_argument("--cores", type=int, default=2, help="cores for every method (2)")
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
    rows = [row for n in args.n for row in compare(n, args.cores)]
    if rows:
        write_csv(RESULTS / "sweep.csv", rows)
        print(f"\nwrote {RESULTS / 'sweep.csv'}")
    if args.scaling:
        scaling(args.scaling, args.cores)


def phase(name: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {name} (load average {load_average()})", flush=True)


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def snakemake_run(config: dict, root: Path, cores: int) -> tuple[Path, Callable[..., list]]:
    """A config file under ``root`` and the ``snakemake --cores`` command for a target of its sweep."""
    import yaml

    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = fresh_dir(root / "work")

    def command(target: str | Path = "all") -> list:
        # The target goes first: --configfile and --quiet take every value that follows them.
        return [Path(PY).parent / "snakemake", target, "-s", REPO / "Snakefile", "-d", workdir,
                "--cores", str(cores), "--configfile", path, "--quiet", "all"]

    return path, command


def rule_benchmarks(results_dir: Path) -> dict[str, dict[str, float]]:
    """Snakemake's ``benchmark:`` files of a sweep, per rule: jobs, summed and largest wall s, peak RSS MiB."""
    import pandas as pd

    stages: dict[str, dict[str, float]] = {}
    for path in sorted((results_dir / "benchmarks").rglob("*.tsv")):
        rule = path.parent.name if path.parent.name != "benchmarks" else path.stem
        row = pd.read_csv(path, sep="\t").iloc[0]
        rss = float(row["max_rss"]) if str(row["max_rss"]) not in ("-", "nan") else float("nan")
        stage = stages.setdefault(rule, {"jobs": 0, "sum_s": 0.0, "max_s": 0.0, "max_rss_mib": 0.0})
        stage["jobs"] += 1
        stage["sum_s"] += float(row["s"])
        stage["max_s"] = max(stage["max_s"], float(row["s"]))
        stage["max_rss_mib"] = max(stage["max_rss_mib"], rss)
    return stages


def stage_line(stages: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{rule}: {v['jobs']:.0f} job(s), {v['sum_s']:.1f} s (longest {v['max_s']:.1f} s), "
                     f"peak RSS {v['max_rss_mib']:.0f} MiB" for rule, v in stages.items())


def compare(n: int, cores: int) -> list[dict]:
    """The four methods side by side on ``n`` example datasets; rows for sweep.csv."""
    from batchfit.cache.store import CacheDir
    from batchfit.config import load_config
    from batchfit.fitting.fitter import dataset_seed
    from batchfit.records.compile_stamp import CompileStamp
    from batchfit.records.manifest import BatchManifest
    from batchfit.sweep.plan import compile_stamp_path

    root = fresh_dir(RESULTS / "sweep" / f"n{n}")
    sampler = example_sampler()
    sampler_json = json.dumps(sampler)
    data = simulate(n, root / "data")
    seeds = [dataset_seed(sampler["seed"], p.stem) for p in data]
    machine = machine_line()
    print(f"# sweep: {n} datasets, {cores} cores; {machine}")
    check_id = data[0].stem
    results: dict[str, dict] = {}
    fit_of: dict[str, Path] = {}

    # batchfit via snakemake, default settings: cold first (it fills the cache), then warm three times, one
    # run now and two after naive and nutpie, whose median is the warm figure: this machine's speed drifts
    # by a third over minutes, and a single ten-second run after two minutes of the others sampled one
    # moment of that drift against naive's two-minute sum.
    bf = root / "batchfit"
    cache, res_dir = fresh_dir(bf / "cache"), bf / "results"
    config_path, cmd = snakemake_run({"model": str(MODEL), "datasets": [str(root / "data" / "*.csv")],
                                      "sampler": sampler, "columns": example_columns(), "cache_dir": str(cache),
                                      "results_dir": str(res_dir)},
                                     bf, cores)
    stamp_path = compile_stamp_path(load_config(config_path))
    batchfit_runs: dict[str, list[dict]] = {"batchfit cold": [], "batchfit warm": []}

    def batchfit(label: str, state: str) -> None:
        """One ``snakemake --cores`` run of the sweep after deleting its results; its row in `batchfit_runs`."""
        shutil.rmtree(res_dir, ignore_errors=True)
        phase(f"{label}: snakemake --cores {cores} ({state})")
        before = stamp_path.stat().st_mtime_ns if stamp_path.exists() else None
        r = run_tracked(cmd(), env=child_env(), cwd=REPO).check()
        stamp = CompileStamp.read(stamp_path)
        line = stamp.line
        if stamp_path.stat().st_mtime_ns == before:  # the cache was filled: no compile job ran
            line = "compile job skipped (cache already filled)"
        # On the empty cache the compile job built the entry, which records what that took; warm compiles nothing.
        compile_s = (json.loads(CacheDir(cache).entry_path(stamp.key).read_text())["compile_seconds"]
                     if label == "batchfit cold" else 0.0)
        manifests = [BatchManifest.read(p) for p in sorted((res_dir / "batches").glob("*.json"))]
        per = [o.seconds for m in manifests for o in m.datasets.values()]
        failed = [d for m in manifests for d, o in m.datasets.items() if o.status != "ok"]
        if failed or len(per) != n:
            raise SystemExit(f"{label}: {len(per)} datasets fitted, failed: {failed}")
        keep = bf / f"{label.replace(' ', '_')}-{len(batchfit_runs[label])}-{check_id}.nc"
        shutil.copy(res_dir / "fits" / f"{check_id}.nc", keep)
        print(f"  {r.wall:.1f} s", flush=True)
        batchfit_runs[label].append({
            "total_wall_s": r.wall, "median_dataset_s": median(per), "compile_s": compile_s,
            "peak_rss_mib": mib(r.peak_rss_largest), "note": f"{len(manifests)} fit jobs (batch_size auto); {line}",
            "stages": rule_benchmarks(res_dir), "fit": keep})

    batchfit("batchfit cold", "empty cache")
    batchfit("batchfit warm", "results deleted, cache kept; 1 of 3")

    # naive ------------------------------------------------------------------------------------
    naive_pt = root / "naive-pytensor"  # PyTensor compile dir shared by naive and nutpie in-process
    naive_out = fresh_dir(root / "naive" / "fits")

    def naive(path: Path, seed: int, out: Path):
        return run_tracked([PY, __file__, "--naive-child", str(path), str(out), str(seed), "--sampler", sampler_json],
                           env=child_env(naive_pt)).check()

    phase("naive: warm-up process (fills PyTensor's numba cache; not measured)")
    warm = naive(data[0], seeds[0], root / "naive" / "warmup.nc")
    print(f"  warm-up: {warm.wall:.1f} s (cold compile {warm.json()['compile_s']:.1f} s)")
    phase(f"naive: {n} processes, {cores} at a time")
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=cores) as pool:
        runs = list(pool.map(lambda p, s: naive(p, s, naive_out / f"{p.stem}.nc"), data, seeds))
    total = time.perf_counter() - start
    results["naive"] = {
        "total_wall_s": total, "median_dataset_s": median(r.wall for r in runs),
        "compile_s": sum(r.json()["compile_s"] for r in runs),
        "peak_rss_mib": mib(max(r.peak_rss_largest for r in runs)),
        "note": f"1 process per dataset, {cores} at a time (as xargs -P {cores}); warm PyTensor cache",
    }
    fit_of["naive"] = naive_out / f"{check_id}.nc"

    # nutpie in-process --------------------------------------------------------------------------
    phase("nutpie in-process: compile once per distinct group count, with_data, sample, write")
    nut_out = fresh_dir(root / "nutpie" / "fits")
    spec = root / "nutpie" / "datasets.json"
    spec.write_text(json.dumps({"datasets": [str(p) for p in data], "seeds": seeds}))
    r = run_tracked([PY, __file__, "--nutpie-child", str(spec), str(nut_out), "--sampler", sampler_json],
                    env=child_env(naive_pt)).check()
    nut_rows = r.json()["rows"]
    pure = [row["sample_s"] for row in nut_rows]
    results["nutpie in-process"] = {
        "total_wall_s": r.wall, "median_dataset_s": median(row["wall_s"] for row in nut_rows),
        "compile_s": sum(row["compile_s"] for row in nut_rows), "peak_rss_mib": mib(r.peak_rss_largest),
        "note": f"1 process; {len({row['n_groups'] for row in nut_rows})} compiles (one per group count); "
                f"pure nutpie.sample total {sum(pure):.1f} s",
    }
    fit_of["nutpie in-process"] = nut_out / f"{check_id}.nc"

    batchfit("batchfit warm", "results deleted, cache kept; 2 of 3")
    batchfit("batchfit warm", "results deleted, cache kept; 3 of 3")
    stages_of = {}
    for label, label_runs in batchfit_runs.items():
        chosen = sorted(label_runs, key=lambda run: run["total_wall_s"])[(len(label_runs) - 1) // 2]  # the median
        stages_of[label] = chosen.pop("stages")
        fit_of[label] = chosen.pop("fit")
        results[label] = chosen
        if len(label_runs) > 1:
            walls = ", ".join(f"{run['total_wall_s']:.1f}" for run in label_runs)
            chosen["note"] += f"; the median of {len(label_runs)} runs ({walls} s, in the order run)"

    # 5. the fixed-cost floor of any Snakemake sweep that samples with nutpie in a job --------------
    phase("floor: snakemake start-up (dry run, nothing to do) and one job's imports (pymc, nutpie)")
    floor = {
        "snakemake start-up": median(run_tracked([*cmd(), "--dry-run"], env=child_env(), cwd=REPO).check().wall
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
    warm_r, cold_r = results["batchfit warm"], results["batchfit cold"]
    naive_ratio = results["naive"]["total_wall_s"] / warm_r["total_wall_s"]
    pure_ratio = warm_r["total_wall_s"] / pure_total
    cold_ratio = cold_r["total_wall_s"] / warm_r["total_wall_s"]
    plot(results, pure_total, median(pure), RESULTS / f"sweep-{n}.png", n, machine)

    print(f"\n### Sweep of {n} example datasets (2 chains x 1000 tune + 1000 draws, --cores {cores})\n")
    print(f"{machine}; load average {load_average()}\n")
    print("| method | total wall (s) | median per dataset (s) | compile (s) | peak RSS, largest process (MiB) |")
    print("|---|---:|---:|---:|---:|")
    for method, row in results.items():
        print(f"| {method} | {row['total_wall_s']:.1f} | {row['median_dataset_s']:.2f} | {row['compile_s']:.1f} "
              f"| {row['peak_rss_mib']:.0f} |")
    print(f"| pure `nutpie.sample` (from method 2) | {pure_total:.1f} | {median(pure):.2f} | - | - |")
    print()
    for method, row in results.items():
        print(f"- {method}: {row['note']}")
    for label, stages in stages_of.items():
        print(f"- {label} per rule (Snakemake benchmark:): {stage_line(stages)}")

    def goal(met: bool) -> str:
        return "met" if met else "NOT met"

    print(f"\nnaive / batchfit warm (total wall): {naive_ratio:.1f}x (goal >= 10: {goal(naive_ratio >= 10)})")
    print(f"batchfit warm / pure sampling (total wall / sum of nutpie.sample): {pure_ratio:.2f}")
    print(f"batchfit cold / warm: {cold_ratio:.2f} (goal <= 2: {goal(cold_ratio <= 2)})")
    floor_total = sum(floor.values())
    print(f"fixed-cost floor: {' + '.join(f'{k} {v:.2f} s' for k, v in floor.items())} = {floor_total:.2f} s; "
          f"floor + pure sampling / {cores} cores = "
          f"{(floor_total + pure_total / cores) / pure_total:.2f} x pure sampling")
    print(f"\nposterior check on {check_id} (reference: naive):")
    for line in lines:
        print(f"  {line}")
    print(f"  all agree within Monte Carlo error: {'yes' if ok else 'NO'}; "
          f"batchfit cold and warm draws identical: {'yes' if identical else 'NO'}")
    rows = [{"method": method, "n_datasets": n, "cores": cores, "total_wall_s": f"{row['total_wall_s']:.2f}",
             "median_dataset_s": f"{row['median_dataset_s']:.3f}", "compile_s": f"{row['compile_s']:.2f}",
             "peak_rss_mib": f"{row['peak_rss_mib']:.0f}", "note": row["note"], "date_machine": machine}
            for method, row in results.items()]
    rows += [{"method": f"floor: {part}", "n_datasets": n, "cores": cores, "total_wall_s": f"{seconds:.2f}",
              "median_dataset_s": "", "compile_s": "", "peak_rss_mib": "", "note": "median of 3",
              "date_machine": machine} for part, seconds in floor.items()]
    rows.append({"method": "pure nutpie.sample (in-process)", "n_datasets": n, "cores": cores,
                 "total_wall_s": f"{pure_total:.2f}", "median_dataset_s": f"{median(pure):.3f}", "compile_s": "0",
                 "peak_rss_mib": "", "note": "sum / median of the nutpie.sample calls of method 2",
                 "date_machine": machine})
    return rows


def write_tiny(n: int, out_dir: Path) -> list[Path]:
    """``n`` tiny datasets of the example model's shape: 30 rows, 3 groups."""
    import numpy as np
    import pandas as pd

    fresh_dir(out_dir)
    paths = []
    for i in range(n):
        rng = np.random.default_rng([2026, i])
        idx = np.arange(30) % 3
        x = rng.normal(size=30)
        y = rng.normal(1.0, 0.8, size=3)[idx] + 0.7 * x + rng.normal(0.0, 0.5, size=30)
        paths.append(out_dir / f"tiny_{i:05d}.csv")
        pd.DataFrame({"group": np.array(["g00", "g01", "g02"])[idx], "x": x.round(4), "y": y.round(4)}).to_csv(
            paths[-1], index=False)
    return paths


def scaling(ns: list[int], cores: int) -> None:
    """Warm batchfit sweeps of tiny datasets at each N beside pure sampling: scaling.csv and scaling.png."""
    from batchfit.config import load_config
    from batchfit.fitting.fitter import dataset_seed
    from batchfit.sweep.plan import compile_stamp_path

    root = fresh_dir(RESULTS / "scaling")
    sampler = {**example_sampler(), "draws": 200, "tune": 200}
    cache = fresh_dir(root / "cache")
    machine = machine_line()
    rows = []
    for n in sorted(ns):
        data = write_tiny(n, root / f"n{n}" / "data")
        res_dir = root / f"n{n}" / "results"
        config = {"model": str(MODEL), "datasets": [str(data[0].parent / "*.csv")], "sampler": sampler,
                  "columns": example_columns(), "cache_dir": str(cache), "results_dir": str(res_dir)}
        config_path, cmd = snakemake_run(config, root / f"n{n}", cores)
        phase(f"scaling N={n}: fill the cache (snakemake's compile job, not measured)")
        stamp = compile_stamp_path(load_config(config_path))  # the compile rule's output: then warm skips it
        run_tracked(cmd(stamp), env=child_env(), cwd=REPO).check()
        shutil.rmtree(res_dir, ignore_errors=True)
        phase(f"scaling N={n}: pure sampling of {min(n, 100)} datasets in one process")
        spec = root / f"n{n}" / "pure.json"
        spec.write_text(json.dumps({"datasets": [str(p) for p in data[:100]],
                                    "seeds": [dataset_seed(sampler["seed"], p.stem) for p in data[:100]]}))
        pure = run_tracked([PY, __file__, "--nutpie-child", str(spec), str(fresh_dir(root / f"n{n}" / "pure")),
                            "--sampler", json.dumps(sampler)], env=child_env(cache / "pytensor")).check()
        pure_per = median(row["sample_s"] for row in pure.json()["rows"])
        phase(f"scaling N={n}: warm snakemake --cores {cores}")
        r = run_tracked(cmd(), env=child_env(), cwd=REPO).check()
        stages = rule_benchmarks(res_dir)
        row = {"n_datasets": n, "cores": cores, "total_wall_s": round(r.wall, 2),
               "per_dataset_s": round(r.wall / n, 4), "pure_per_dataset_s": round(pure_per, 4),
               "ratio_to_pure": round(r.wall / (n * pure_per), 2),
               "ratio_to_pure_over_cores": round(r.wall / (n * pure_per / cores), 2),
               "fit_jobs": stages.get("fit", {}).get("jobs", 0),
               "peak_rss_fit_job_mib": round(mib(r.peak_of("fit.py"))),
               "peak_rss_collect_mib": round(mib(r.peak_of("collect.py"))),
               "peak_rss_plots_mib": round(mib(r.peak_of("plots.py"))),
               "peak_rss_report_pages_mib": round(mib(r.peak_of("report_pages.py"))),
               "collect_s": round(stages.get("collect", {}).get("sum_s", float("nan")), 2),
               "load_average": load_average(), "date_machine": machine}
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "date_machine"), flush=True)
        print(f"  per rule (Snakemake benchmark:): {stage_line(stages)}", flush=True)
        rows.append(row)
    write_csv(RESULTS / "scaling.csv", rows)
    for row in rows:
        goal = {100: 2.0, 1000: 1.3}.get(row["n_datasets"])
        if goal is not None:
            print(f"N={row['n_datasets']}: batchfit warm / pure sampling {row['ratio_to_pure']} "
                  f"(goal <= {goal}: {'met' if row['ratio_to_pure'] <= goal else 'NOT met'}); "
                  f"over pure sampling / {row['cores']} cores {row['ratio_to_pure_over_cores']}")
    for job in ("fit_job", "collect", "plots", "report_pages"):
        peaks = [row[f"peak_rss_{job}_mib"] for row in rows if row["n_datasets"] >= 1000]
        if 0 in peaks:  # no poll found the job's process under its own command line
            print(f"peak RSS of {job} from N=1000 up: not measured in every run ({peaks} MiB)")
        elif len(peaks) > 1:
            growth = max(peaks) / min(peaks)
            print(f"peak RSS of {job} from N=1000 up: {min(peaks)} -> {max(peaks)} MiB, x{growth:.2f} "
                  f"(goal within 10%: {'met' if growth <= 1.1 else 'NOT met'})")
    plot_scaling(rows, RESULTS / "scaling.png", machine)
    print(f"wrote {RESULTS / 'scaling.csv'} and {RESULTS / 'scaling.png'}")


def plot_scaling(rows: list[dict], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [row["n_datasets"] for row in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    axes[0].plot(ns, [row["per_dataset_s"] for row in rows], "o-", label="batchfit warm sweep (wall / N)")
    axes[0].plot(ns, [row["pure_per_dataset_s"] / row["cores"] for row in rows], "s--",
                 label="pure nutpie.sample / cores")
    axes[0].set(xscale="log", xlabel="datasets N", ylabel="seconds per dataset", title="per-dataset cost")
    axes[0].legend(fontsize=8)
    axes[1].plot(ns, [row["peak_rss_fit_job_mib"] for row in rows], "o-", label="largest fit job")
    axes[1].plot(ns, [row["peak_rss_collect_mib"] for row in rows], "s-", label="collect")
    axes[1].plot(ns, [row["peak_rss_plots_mib"] for row in rows], "^-", label="plots")
    axes[1].plot(ns, [row["peak_rss_report_pages_mib"] for row in rows], "v-", label="report pages")
    axes[1].set(xscale="log", xlabel="datasets N", ylabel="peak RSS (MiB)", title="memory")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"tiny datasets (30 rows, 2 chains x 200 + 200); {machine}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
