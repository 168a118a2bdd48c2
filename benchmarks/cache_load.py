"""How fast a fresh process is ready to sample on a warm cache, against nutpie's own compile.

    python benchmarks/cache_load.py [--repeats 5]
    python benchmarks/cache_load.py --bundle [--repeats 5]

Every measurement is a fresh Python process (one per repeat). In each, the timed window starts
after the imports (``pymc``, ``nutpie``, batchfit) and after the example model is built from
store_000; import time is reported separately, and so is what is left of the process wall time
(interpreter start-up and shutdown).

* batchfit warm:  ``compile_model(model, cache)`` + ``compiled.sampler_for(model)`` on a warm cache.
* nutpie:         ``nutpie.compile_pymc_model(model)`` (numba backend) with PyTensor's numba
                  cache warm (one unmeasured run first, in its own compile directory).
* the first ``nutpie.sample`` of each process is timed separately (2 chains, 1000 + 1000, as
  config/config.yaml).

Before the warm runs, one process compiles cold on an empty cache and saves its draws; every warm
process's draws (same seed) are compared with ``np.array_equal``. Warm batchfit and nutpie runs
alternate, so machine noise hits both alike. Results: benchmarks/results/cache_load/.

``--bundle`` (issue #46): a fit job without a shared filesystem. The cold process fills a cache and
the compile stage's bundle is written from it (`batchfit.cache.bundle.write_bundle`); then, side by
side, warm processes on that cache alternate with processes on an EMPTY cache given the bundle
(``open_cache(..., bundle=)``: installed under the lock, then loaded), each timed the same way
(model -> ready to sample, the install included). Target: the bundle's within 1.5x of the warm one.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
DATASET_ID = "store_000"


def child(args: argparse.Namespace) -> None:
    """One measured process: import, build, get a sampler (batchfit or nutpie), sample once."""
    if args.child == "batchfit":
        from batchfit.cache.store import open_cache

        cache = open_cache(args.cache, bundle=args.from_bundle)  # sets PyTensor's compile dir before its import
    import numpy as np
    import nutpie
    import pymc  # noqa: F401

    from batchfit.compile.build import compile_model
    from batchfit.compile.worker_pool import ModelSource
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    t_import = time.perf_counter()
    repo = HERE.parent
    model_file = (repo / "models" / "hierarchical.py").resolve()
    data_path = (repo / "data" / "example" / f"{DATASET_ID}.csv").resolve()
    model = build_model(load_model_file(model_file), load_dataset(DATASET_ID, data_path))
    t_build = time.perf_counter()
    out = {"mode": args.child}
    if args.child == "batchfit":
        compiled = compile_model(model, cache, source=ModelSource(model_file, DATASET_ID, data_path))
        t_compiled = time.perf_counter()
        sampler = compiled.sampler_for(model)
        out.update(hit=compiled.report.hit, installed=compiled.report.installed, compile_model_s=t_compiled - t_build,
                   sampler_for_s=time.perf_counter() - t_compiled)
    else:
        sampler = nutpie.compile_pymc_model(model)
    t_ready = time.perf_counter()
    s = json.loads(args.sampler)
    tree = nutpie.sample(sampler, draws=s["draws"], tune=s["tune"], chains=s["chains"], cores=s["chains"],
                         seed=s["seed"], target_accept=s["target_accept"], progress_bar=False)
    t_sample = time.perf_counter()
    if args.save:
        posterior = tree["posterior"].ds
        np.savez(args.save, **{name: posterior[name].values for name in posterior.data_vars})
    out.update(import_s=t_import - _T0, build_s=t_build - t_import, ready_s=t_ready - t_build,
               sample_s=t_sample - t_ready, in_process_s=time.perf_counter() - _T0)
    print(json.dumps(out))


def bundle_side_by_side(repeats: int) -> None:
    """Warm-cache processes against empty-cache processes given the compiled bundle (see the docstring)."""
    sys.path.insert(0, str(HERE))
    from common import RESULTS, child_env, example_sampler, fresh_dir, load_average, machine_line, median, run_tracked

    from batchfit.cache.bundle import write_bundle
    from batchfit.cache.store import CacheDir, read_entry

    out = fresh_dir(RESULTS / "cache_load_bundle")
    warm_cache = out / "warm-cache"
    sampler = json.dumps({**example_sampler(), "draws": 100, "tune": 100})  # the window ends before sampling
    print(f"# cache_load --bundle: {machine_line()}; load average {load_average()}")

    def run(cache: Path, bundle: Path | None = None, save: Path | None = None) -> dict:
        cmd = [sys.executable, __file__, "--child", "batchfit", "--sampler", sampler, "--cache", str(cache)]
        cmd += ["--from-bundle", str(bundle)] if bundle else []
        cmd += ["--save", str(save)] if save else []
        r = run_tracked(cmd, env=child_env()).check()
        return {**r.json(), "wall_s": r.wall}

    cold = run(warm_cache, save=out / "draws-cold.npz")
    assert not cold["hit"], "the cache was not empty"
    cache = CacheDir(warm_cache)
    entries = {p.stem: read_entry(cache, p.stem) for p in cache.entries_dir.glob("*.json")}
    bundle = out / "bundle.zip"
    write_bundle(cache, entries, bundle)
    print(f"cold (empty cache, compiles): ready in {cold['ready_s']:.1f} s; bundle of {len(entries)} entry: "
          f"{bundle.stat().st_size / 2**20:.2f} MiB")
    rows: dict[str, list[dict]] = {"warm": [], "bundle": []}
    equal = []
    for i in range(repeats):
        rows["warm"].append(run(warm_cache))
        assert rows["warm"][-1]["hit"] and not rows["warm"][-1]["installed"]
        save = out / f"draws-bundle-{i}.npz"
        rows["bundle"].append(run(fresh_dir(out / f"empty-cache-{i}"), bundle, save))
        assert rows["bundle"][-1]["hit"] and rows["bundle"][-1]["installed"], "the bundle was not installed"
        equal.append(same_draws(out / "draws-cold.npz", save))
    print(f"\n{repeats} fresh processes each, medians (seconds):")
    print(f"{'':34s}{'warm cache':>12s}{'empty + bundle':>16s}")
    for key, label in (("compile_model_s", "compile_model (install included)"), ("sampler_for_s", "sampler_for"),
                       ("ready_s", "model -> ready to sample"), ("wall_s", "process wall")):
        print(f"{label:34s}{median(r[key] for r in rows['warm']):12.3f}{median(r[key] for r in rows['bundle']):16.3f}")
    ratio = median(r["ready_s"] for r in rows["bundle"]) / median(r["ready_s"] for r in rows["warm"])
    print(f"\nready to sample, empty cache + bundle / warm cache: {ratio:.2f}x "
          f"(target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
    print(f"draws of the bundle's processes equal to the cold compile's (np.array_equal): {sum(equal)}/{len(equal)}")
    record = {"cold": cold, "runs": rows, "draws_equal": equal}
    (out / "cache_load_bundle.json").write_text(json.dumps(record, indent=1))


def same_draws(a: Path, b: Path) -> bool:
    import numpy as np

    with np.load(a) as x, np.load(b) as y:
        return set(x.files) == set(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=("batchfit", "nutpie"), help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--sampler", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--bundle", action="store_true", help="a fit job on an empty cache with the compiled "
                        "bundle, beside a warm-cache job")
    parser.add_argument("--from-bundle", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.bundle:
        bundle_side_by_side(args.repeats)
        return

    sys.path.insert(0, str(HERE))
    from common import RESULTS, child_env, example_sampler, fresh_dir, load_average, machine_line, median, run_tracked

    out = fresh_dir(RESULTS / "cache_load")
    bf_cache = out / "batchfit-cache"  # batchfit's cache (its own PyTensor dir inside)
    nutpie_dir = out / "nutpie-pytensor"  # PyTensor compile dir of the nutpie runs
    sampler = json.dumps(example_sampler())
    print(f"# cache_load: {machine_line()}; load average {load_average()}")

    def run(mode: str, save: Path | None = None) -> dict:
        cmd = [sys.executable, __file__, "--child", mode, "--sampler", sampler]
        if mode == "batchfit":
            cmd += ["--cache", str(bf_cache)]
            env = child_env()  # the child's open_cache sets the compile directory
        else:
            env = child_env(nutpie_dir)
        if save:
            cmd += ["--save", str(save)]
        r = run_tracked(cmd, env=env).check()
        res = r.json()
        res["wall_s"] = r.wall
        res["startup_exit_s"] = r.wall - res["in_process_s"]
        res["peak_rss_mib"] = r.peak_rss_largest / 2**20
        return res

    cold = run("batchfit", out / "draws-cold.npz")
    assert not cold["hit"], "the batchfit cache was not empty"
    print(f"batchfit cold (empty cache): ready in {cold['ready_s']:.1f} s (compile in a worker process), "
          f"process wall {cold['wall_s']:.1f} s")
    warmup = run("nutpie")
    print(f"nutpie warm-up run (fills PyTensor's numba cache, not measured): compile_pymc_model "
          f"{warmup['ready_s']:.1f} s")

    rows: dict[str, list[dict]] = {"batchfit": [], "nutpie": []}
    equal = []
    for i in range(args.repeats):
        save = out / f"draws-warm-{i}.npz"
        res = run("batchfit", save)
        assert res["hit"], "warm batchfit run missed the cache"
        equal.append(same_draws(out / "draws-cold.npz", save))
        rows["batchfit"].append(res)
        rows["nutpie"].append(run("nutpie"))

    def med(mode: str, key: str) -> float:
        return median(r[key] for r in rows[mode])

    print(f"\n{args.repeats} fresh processes each, medians (seconds):")
    print(f"{'':28s}{'batchfit warm':>14s}{'nutpie':>10s}")
    for key, label in (("ready_s", "model -> ready to sample"), ("sample_s", "first nutpie.sample"),
                       ("import_s", "imports (not in window)"), ("build_s", "build model (not in win.)"),
                       ("startup_exit_s", "interpreter start + exit"), ("wall_s", "process wall")):
        print(f"{label:28s}{med('batchfit', key):14.3f}{med('nutpie', key):10.3f}")
    print(f"{'peak RSS (MiB)':28s}{med('batchfit', 'peak_rss_mib'):14.0f}{med('nutpie', 'peak_rss_mib'):10.0f}")
    print(f"batchfit window split: compile_model {med('batchfit', 'compile_model_s'):.3f} s + "
          f"sampler_for {med('batchfit', 'sampler_for_s'):.3f} s")
    ready_bf, ready_np = med("batchfit", "ready_s"), med("nutpie", "ready_s")
    ratio = ready_np / ready_bf
    print(f"\nready to sample: batchfit {ready_bf:.3f} s vs nutpie.compile_pymc_model {ready_np:.3f} s -> "
          f"{ratio:.1f}x faster (target: <= 0.5 s: {'met' if ready_bf <= 0.5 else 'NOT met'}; "
          f">= 10x: {'met' if ratio >= 10 else 'NOT met'})")
    print(f"warm draws equal to the cold compile's (same seed, np.array_equal): {sum(equal)}/{len(equal)}")
    print(f"per-run ready_s batchfit: {[round(r['ready_s'], 3) for r in rows['batchfit']]}")
    print(f"per-run ready_s nutpie:   {[round(r['ready_s'], 3) for r in rows['nutpie']]}")
    (out / "cache_load.json").write_text(json.dumps({"cold": cold, "nutpie_warmup": warmup, "runs": rows,
                                                     "draws_equal": equal}, indent=1))


if __name__ == "__main__":
    main()
