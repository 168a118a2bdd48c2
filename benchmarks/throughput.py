"""Compile once, fit many: a batchfit job's per-dataset wall time against pure sampling, in one process.

    python benchmarks/throughput.py [--n 100] [--profile]

One child process fits N simulated example datasets (2 chains x 1000 tune + 1000 draws, as
config/config.yaml; 2 sampler threads, as the fit rule under ``snakemake --cores 2``) exactly as
a fit job does: ``prepare`` (one compile, into an empty cache), then ``fit_datasets`` (load,
build + structure check and sampler model of the next dataset while one samples; optional
groups and the NetCDF written while the next samples), then the batch manifest. In the same
process, before it, the pure sampling time: ``nutpie.sample`` alone, dataset after dataset, on
the already compiled model (``compiled.sampler_for(model)`` prepared outside the timed window),
same settings, threads and seeds. The datasets have 3-8 groups, so nutpie's own
``compile_pymc_model`` + ``with_data`` could not serve them all with one compile; batchfit's
callbacks can.

Then, on that warm cache, ``chains: 1`` fit jobs (``fit_batch``, each in a fresh process) of
``--lanes-n`` datasets: one with 1 thread, held to one core (``os.sched_setaffinity``, as a
cluster's allocation of one core would: unpinned, its main thread and its chain already use two
cores), and one with 2 threads (two lanes: the job's process and a helper, `batchfit.fitting.lane_pool`).
Printed: their throughput over the second half of the batch (steady state) and over the whole
job from ``fit_batch``'s call (with the helper's start), and the ratio (target >= 1.8).

Printed: per-dataset wall (total / N) of batchfit beside pure sampling and their ratio (target
<= 1.2), the 1- and 2-thread throughputs, and resident memory (peak ``ru_maxrss`` and current
psutil RSS) after the 10th and the last dataset (target: within 10%). With --profile, cProfile
of 10 more datasets through ``fit_datasets``. Results: benchmarks/results/throughput/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child_config(args: argparse.Namespace, **sampler: int) -> Any:
    """The fit config a child process gets from the parent's hidden arguments (``sampler`` overrides)."""
    from batchfit.config import config_from_dict

    return config_from_dict({"model": args.model, "datasets": [str(Path(args.data) / "*.csv")],
                             "sampler": {**json.loads(args.sampler), **sampler}, "batch_size": args.n,
                             "cache_dir": args.cache, "results_dir": args.results})


def child(args: argparse.Namespace) -> None:
    import resource

    import psutil

    config = child_config(args)
    t0 = time.perf_counter()
    import nutpie

    import batchfit.fitting.fitter as fit
    from batchfit.fitting.batch import fit_datasets

    t_import = time.perf_counter()
    cache, reader, ref = fit.prepare(config)
    fitter = fit.Fitter(config, ref, cache)
    compiled = fitter.reference.compiled
    t_setup = time.perf_counter()
    s = config.sampler
    ids = list(reader.index)[:args.n]

    # Pure sampling: every sampler model made first, then only nutpie.sample is timed.
    samplers = {d: compiled.sampler_for(fitter.build(reader.load(d))) for d in ids}
    pure = []
    for dataset_id, sampler in samplers.items():
        start = time.perf_counter()
        nutpie.sample(sampler, draws=s.draws, tune=s.tune, chains=s.chains, cores=2,
                      seed=fit.dataset_seed(s.seed, dataset_id), target_accept=s.target_accept,
                      progress_bar=False, save_warmup=False)
        pure.append(time.perf_counter() - start)
    del samplers

    proc = psutil.Process()
    rss = {}

    def fit_all(job_fitter, threads: int, record_rss: bool = False) -> float:
        start = time.perf_counter()
        for i, (_, outcome) in enumerate(fit_datasets(job_fitter, enumerate(ids), threads=threads), 1):
            if outcome.status != "ok":
                raise SystemExit(f"{outcome.dataset} failed at {outcome.stage}: {outcome.message}")
            if record_rss and (i == 10 or i % 50 == 0 or i == len(ids)):
                rss[i] = {"ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "rss_mib": proc.memory_info().rss / 2**20}
        return time.perf_counter() - start

    batchfit_s = fit_all(fitter, 2, record_rss=True)

    profile = None
    if args.profile:
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        list(fit_datasets(fitter, enumerate(ids[:10]), threads=2))
        pr.disable()
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf)
        st.sort_stats("cumulative").print_stats(r"batchfit|xarray|netCDF4|nutpie|pymc|pytensor", 30)
        st.sort_stats("tottime").print_stats(15)
        profile = buf.getvalue()
    print(json.dumps({"import_s": t_import - t0, "setup_s": t_setup - t_import, "compile": compiled.report.line(),
                      "n": len(ids), "pure_s": pure, "batchfit_s": batchfit_s,
                      "rss": rss, "profile": profile}))


def job(args: argparse.Namespace) -> None:
    """One ``chains: 1`` fit job of ``--n`` datasets with ``--job`` threads on a warm cache."""
    import logging
    import os

    if args.job == 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a one-core allocation
    from batchfit.fitting.batch import fit_batch

    config = child_config(args, chains=1)
    finished: list[float] = []

    class Finished(logging.Handler):  # when each dataset's outcome is logged
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().split(": ", 1)[-1].startswith("fitted in "):
                finished.append(time.perf_counter())

    logging.getLogger("batchfit").addHandler(Finished())
    logging.getLogger("batchfit").setLevel(logging.INFO)
    ids = sorted(p.stem for p in Path(args.data).glob("*.csv"))[:args.n]
    start = time.perf_counter()
    report = fit_batch(config, ids, batch_id="lanes", threads=args.job)
    wall = time.perf_counter() - start
    half = len(finished) // 2
    print(json.dumps({"threads": args.job, "n": len(ids), "failed": report.n_failed, "wall_s": wall,
                      "steady_per_s": (len(finished) - 1 - half) / (finished[-1] - finished[half])}))


def lanes(n: int, common_args: Any) -> dict[int, dict]:
    """Run the 1- and 2-thread ``chains: 1`` jobs of ``n`` datasets and print their throughputs."""
    from common import PY, child_env, run_tracked

    jobs = {threads: run_tracked([PY, __file__, "--job", str(threads), *common_args(n, f"lanes-{threads}")],
                                 env=child_env()).check().json() for threads in (1, 2)}
    print(f"\nchains: 1 fit jobs of {n} datasets on the warm cache (1 thread held to one core; "
          "2 threads = 2 lanes):")
    for label, fmt in (("steady state (second half)", lambda j: j["steady_per_s"]),
                       ("whole job (fit_batch)", lambda j: j["n"] / j["wall_s"])):
        one, two = fmt(jobs[1]), fmt(jobs[2])
        print(f"  {label:27s} 1 thread {one:5.1f} datasets/s, 2 threads {two:5.1f} datasets/s: {two / one:.2f}x "
              f"(target >= 1.8: {'met' if two / one >= 1.8 else 'NOT met'})")
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--lanes-n", type=int, default=200, help="datasets of each chains: 1 job (0: skip them)")
    parser.add_argument("--profile", action="store_true", help="always profile 10 extra datasets")
    for hidden in ("child", "model", "data", "sampler", "cache", "results"):
        parser.add_argument(f"--{hidden}", help=argparse.SUPPRESS)
    parser.add_argument("--job", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.job:
        job(args)
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
    data = simulate(max(args.n, args.lanes_n), out / "data")
    print(f"# throughput: {machine_line()}; load average {load_average()}")
    print(f"{len(data)} simulated example datasets in {out / 'data'}")

    def common_args(n: int, results: str) -> list[str]:
        return ["--n", str(n), "--model", str(MODEL), "--data", str(out / "data"), "--sampler",
                json.dumps(example_sampler()), "--cache", str(out / "cache"),
                "--results", str(fresh_dir(out / results))]

    def run(profile: bool) -> dict:
        fresh_dir(out / "cache")
        cmd = [PY, __file__, "--child", "1", *common_args(args.n, "fits")]
        if profile:
            cmd.append("--profile")
        r = run_tracked(cmd, env=child_env()).check()
        res = r.json()
        res["wall_s"] = r.wall
        res["peak_rss_polled_mib"] = r.peak_rss_largest / 2**20
        return res

    res = run(args.profile)
    n = res["n"]
    pure = sum(res["pure_s"]) / n
    bf = res["batchfit_s"] / n
    ratio = bf / pure
    print(f"process: imports {res['import_s']:.2f} s, prepare (cold compile) {res['setup_s']:.1f} s "
          f"[{res['compile']}], process wall {res['wall_s']:.1f} s")
    print(f"\nper dataset (wall / {n} datasets, 2 chains on 2 threads):")
    print(f"  batchfit fit_datasets (load, build+check, sample, groups, write NetCDF): {bf:.3f} s")
    print(f"  pure nutpie.sample on the compiled model, one after another:              {pure:.3f} s "
          f"(median {median(res['pure_s']):.3f} s)")
    print(f"  ratio batchfit / pure sampling: {ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})")
    if args.lanes_n:
        res["lanes"] = lanes(args.lanes_n, common_args)
    rss = {int(k): v for k, v in res["rss"].items()}
    first, last = rss[min(rss)], rss[max(rss)]
    print(f"\nmemory after dataset {min(rss)} -> {max(rss)} (2 chains):")
    for key, label in (("ru_maxrss_mib", "peak RSS (ru_maxrss)"), ("rss_mib", "current RSS (psutil)")):
        growth = last[key] / first[key]
        print(f"  {label:22s} {first[key]:7.0f} MiB -> {last[key]:7.0f} MiB  ratio {growth:.3f} "
              f"(target within 10%: {'met' if abs(growth - 1) <= 0.10 else 'NOT met'})")
    print(f"  peak RSS polled from outside: {res['peak_rss_polled_mib']:.0f} MiB")
    if res.get("profile"):
        print("\ncProfile of 10 more datasets through fit_datasets:")
        print(res["profile"])
    (out / "throughput.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
