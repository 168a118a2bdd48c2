"""Compile once, fit many: per-dataset overhead of a batchfit batch against pure sampling, and memory growth.

    python benchmarks/throughput.py [--n 100] [--profile]

One child process fits N simulated example datasets (2 chains x 1000 tune + 1000 draws, as
config/config.yaml; 2 sampler threads, as the fit rule under ``snakemake --cores 2``) exactly as
a fit job does: ``prepare`` (one compile, into an empty cache) and the ``fit_batch`` loop
(``fit_one``: load, build + structure check, sample, add data groups, write the NetCDF), then the
batch manifest. Interleaved with it, dataset by dataset and in the same process, the pure
sampling time is measured: ``nutpie.sample`` alone on the already compiled model
(``compiled.sampler_for(model)`` prepared outside the timed window), same settings and seed.
The datasets have 3-8 groups, so nutpie's own ``compile_pymc_model`` + ``with_data`` could not
serve them all with one compile; batchfit's callbacks can.

Printed: median per-dataset wall time of batchfit beside the median pure sampling time and
their ratio (target <= 2), a stage breakdown, and resident memory (peak ``ru_maxrss`` and
current psutil RSS) after the 10th and the last dataset (target: within 10%), and the current RSS
after every 50th dataset (the trajectory, for runs of a few hundred datasets). With a ratio
above 2, or with --profile, cProfile of 10 more datasets shows where the overhead goes.
Results: benchmarks/results/throughput/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def median_(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def child(args: argparse.Namespace) -> None:
    import resource

    import psutil

    from batchfit.config import config_from_dict

    config = config_from_dict({
        "model": args.model, "datasets": [str(Path(args.data) / "*.csv")], "sampler": json.loads(args.sampler),
        "batch_size": args.n, "cache_dir": args.cache, "results_dir": args.results,
    })
    t0 = time.perf_counter()
    import nutpie

    import batchfit.fit as fit
    from batchfit.data import load_dataset

    t_import = time.perf_counter()
    cache, paths, ref = fit.prepare(config)
    fitter = fit.Fitter(config, ref, cache)
    compiled = fitter.reference.compiled
    t_setup = time.perf_counter()

    # Stage timers: wrap (never replace) the functions fit_one calls; the work done is unchanged.
    stages: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                stages[name] = stages.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    real_sample = nutpie.sample
    fit.load_dataset = timed("load", fit.load_dataset)
    fit.write_fit = timed("write NetCDF", fit.write_fit)
    fitter.build = timed("build + check", fitter.build)
    compiled.sampler_for = timed("sampler_for", compiled.sampler_for)
    nutpie.sample = timed("nutpie.sample", real_sample)
    fitter.finish = timed("finish (data groups, attrs)", fitter.finish)

    s = config.sampler
    ids = list(paths)[:args.n]
    rows, rss = [], {}
    proc = psutil.Process()
    report = fit.BatchReport("throughput", compiled.report.line())
    for i, dataset_id in enumerate(ids, 1):
        stages.clear()
        outcome = fit.fit_one(fitter, dataset_id, paths, threads=2)
        report.outcomes.append(outcome)
        if outcome.status != "ok":
            raise SystemExit(f"{dataset_id} failed at {outcome.stage}: {outcome.message}")
        row = {"dataset": dataset_id, "batchfit_s": outcome.seconds, **stages}
        # Pure sampling of the same dataset with the same compiled callbacks, seed and settings.
        model = fitter.build(load_dataset(dataset_id, paths[dataset_id], ref.coding))
        sampler = compiled.sampler_for(model)
        start = time.perf_counter()
        real_sample(sampler, draws=s.draws, tune=s.tune, chains=s.chains, cores=2,
                    seed=fit.dataset_seed(s.seed, dataset_id), target_accept=s.target_accept,
                    progress_bar=False, save_warmup=False)
        row["pure_sample_s"] = time.perf_counter() - start
        rows.append(row)
        if i == 10 or i % 50 == 0 or i == len(ids):  # the trajectory, not just two points
            rss[i] = {"ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_mib": proc.memory_info().rss / 2**20}
    fit.write_manifest(config, report)
    total = time.perf_counter() - t_setup

    profile = None
    ratio = median_([r["batchfit_s"] for r in rows]) / median_([r["pure_sample_s"] for r in rows])
    if args.profile or ratio > 2:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        more = ids[:10]
        pr.enable()
        for dataset_id in more:
            fit.fit_one(fitter, dataset_id, paths, threads=2)
        pr.disable()
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf)
        st.sort_stats("cumulative").print_stats(r"batchfit|xarray|h5netcdf|nutpie|pymc|pytensor", 30)
        st.sort_stats("tottime").print_stats(15)
        profile = buf.getvalue()
    print(json.dumps({"import_s": t_import - t0, "setup_s": t_setup - t_import, "compile": compiled.report.line(),
                      "loop_s": total, "rows": rows, "rss": rss, "profile": profile}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="always profile 10 extra datasets")
    for hidden in ("child", "model", "data", "sampler", "cache", "results"):
        parser.add_argument(f"--{hidden}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    sys.path.insert(0, str(HERE))
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
        run_tracked,
        simulate,
    )

    out = fresh_dir(RESULTS / "throughput")
    data = simulate(args.n, out / "data")
    print(f"# throughput: {machine_line()}; load average {load_average()}")
    print(f"{len(data)} simulated example datasets in {out / 'data'}")

    def run(profile: bool) -> dict:
        cmd = [PY, __file__, "--child", "1", "--n", str(args.n), "--model", str(MODEL), "--data", str(out / "data"),
               "--sampler", json.dumps(example_sampler()), "--cache", str(fresh_dir(out / "cache")),
               "--results", str(fresh_dir(out / "fits"))]
        if profile:
            cmd.append("--profile")
        r = run_tracked(cmd, env=child_env()).check()
        res = r.json()
        res["wall_s"] = r.wall
        res["peak_rss_polled_mib"] = r.peak_rss_largest / 2**20
        return res

    res = run(args.profile)
    rows = res["rows"]
    n = len(rows)
    bf = median(r["batchfit_s"] for r in rows)
    pure = median(r["pure_sample_s"] for r in rows)
    ratio = bf / pure
    print(f"process: imports {res['import_s']:.2f} s, prepare (cold compile) {res['setup_s']:.1f} s "
          f"[{res['compile']}], loop over {n} datasets {res['loop_s']:.1f} s (incl. the pure-sampling runs), "
          f"process wall {res['wall_s']:.1f} s")
    print(f"\nmedian per dataset over {n} datasets:")
    print(f"  batchfit fit_one (load, build+check, sample, groups, write NetCDF): {bf:.3f} s")
    print(f"  pure nutpie.sample on the compiled model:                            {pure:.3f} s")
    print(f"  ratio batchfit / pure sampling: {ratio:.2f} (target <= 2: {'met' if ratio <= 2 else 'NOT met'})")
    keys = [k for k in rows[0] if k not in ("dataset", "batchfit_s", "pure_sample_s")]
    print("  stage medians inside fit_one: " + ", ".join(f"{k} {median(r.get(k, 0.0) for r in rows):.3f} s"
                                                         for k in keys))
    other = median(r["batchfit_s"] - sum(r.get(k, 0.0) for k in keys) for r in rows)
    print(f"  (unaccounted inside fit_one: {other:.3f} s; the nutpie.sample stage includes the same work as "
          f"'pure', run moments apart)")
    rss = {int(k): v for k, v in res["rss"].items()}
    first, last = rss[min(rss)], rss[max(rss)]
    print(f"\nmemory after dataset {min(rss)} -> {max(rss)}:")
    for key, label in (("ru_maxrss_mib", "peak RSS (ru_maxrss)"), ("rss_mib", "current RSS (psutil)")):
        growth = last[key] / first[key]
        print(f"  {label:22s} {first[key]:7.0f} MiB -> {last[key]:7.0f} MiB  ratio {growth:.3f} "
              f"(target within 10%: {'met' if abs(growth - 1) <= 0.10 else 'NOT met'})")
    print("  current RSS trajectory: " + ", ".join(f"{v['rss_mib']:.0f} MiB at {i}" for i, v in sorted(rss.items())))
    print(f"  peak RSS polled from outside: {res['peak_rss_polled_mib']:.0f} MiB")
    if res.get("profile"):
        print(f"\ncProfile of 10 more datasets through fit_one ({'asked for' if args.profile else 'ratio > 2'}):")
        print(res["profile"])
    (out / "throughput.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
