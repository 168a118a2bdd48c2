"""K-fold cross-validation of a sweep of variants: batchfit's refits against pm.sample per fold, side by side.

    python benchmarks/compare_kfold.py [--datasets 12] [--k 10] [--cores 2]

``--datasets`` simulated per-subject datasets of 10 to 12 rows (a regression, one outlier each) and
three variants of one model (Normal, Student-t and Laplace noise, a ``build_model`` parameter), with
the bundled example's sampler settings (config/config.yaml: 2 chains x 1000 tune + 1000 draws);
``--cores`` cores for everyone, in one run:

1. batchfit sweep, cold: ``snakemake --cores C`` on an empty cache, ``compare: {method: psis}`` (compile,
   fits, collect, PSIS-LOO comparison).
2. batchfit sweep, warm: the same in a fresh results directory, the cache kept.
3. batchfit K-fold: ``compare: {method: kfold, kfold: {k: K, datasets: all}}`` on sweep 2's results:
   Snakemake runs the refit plan, the refit jobs (K refits of every dataset and variant, each job one
   cache hit) and the comparison.
4. pm.sample per fold: one process running, for every fit of sweep 2, ``arviz_stats.loo_kfold(k=K,
   seed=271)`` with a ``SamplingWrapper`` whose ``sample`` is ``pm.sample(nuts_sampler="nutpie")`` on the
   model built on the training rows and whose ``log_likelihood__i`` is ``pm.compute_log_likelihood`` on
   the model built on the held-out rows: the same folds as batchfit's, what a user writes by hand.
   PyTensor's cache is warm (sweep 1 filled it), which favours it.

Prints each wall time and the ratios: pm.sample per fold over batchfit's K-fold, and batchfit's K-fold
over K times its own warm (and cold) sweep; the refit jobs' compile lines (each a cache hit) and their
time per refit; and how far apart the two K-fold elpds of each fit are (Monte Carlo error alone).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402
    PY,
    RESULTS,
    child_env,
    example_sampler,
    fresh_dir,
    load_average,
    machine_line,
    median,
    run_tracked,
)

MODEL = """\
import pymc as pm


def build_model(data, noise="normal"):
    with pm.Model() as model:
        x = pm.Data("x", data["x"])
        y = pm.Data("y", data["y"])
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        mu = a + b * x
        if noise == "student":
            pm.StudentT("y_obs", nu=4.0, mu=mu, sigma=sigma, observed=y, shape=x.shape)
        elif noise == "laplace":
            pm.Laplace("y_obs", mu=mu, b=sigma, observed=y, shape=x.shape)
        else:
            pm.Normal("y_obs", mu, sigma, observed=y, shape=x.shape)
    return model
"""
VARIANTS = {noise: {"params": {"noise": noise}} for noise in ("normal", "student", "laplace")}
SEED = 271  # loo_kfold's default seed, which compare.kfold.seed defaults to too


def write_data(directory: Path, n: int) -> None:
    import numpy as np
    import pandas as pd

    fresh_dir(directory)
    for i in range(n):
        rng = np.random.default_rng([58, i])
        rows = 10 + i % 3
        x = rng.normal(0.0, 1.0, rows)
        y = 1.0 + 0.5 * x + rng.normal(0.0, 0.5, rows)
        y[-1] += 3.0  # one outlier a subject
        pd.DataFrame({"x": x.round(4), "y": y.round(4)}).to_csv(directory / f"subject_{i:02d}.csv", index=False)


def write_config(root: Path, results: str, compare: dict) -> Path:
    import yaml

    config = {"model": "model.py", "datasets": ["data/*.csv"], "sampler": example_sampler(), "cache_dir": "cache",
              "results_dir": results, "variants": VARIANTS, "compare": compare}
    path = root / f"{results}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(root: Path, config: Path, cores: int):
    cmd = [str(Path(PY).with_name("snakemake")), "--cores", str(cores), "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(root), "--configfile", str(config)]
    return run_tracked(cmd, env=child_env(root / "pytensor"), cwd=root).check()


# ---- the reference: pm.sample per fold (a child process) ------------------------------------------------


def reference(root: Path, results: str, k: int) -> None:
    """Child: K-fold of every fit of ``results`` by arviz_stats.loo_kfold with pm.sample per fold; prints JSON."""
    import logging
    import warnings

    import arviz_stats
    import numpy as np
    import pandas as pd
    import pymc as pm
    import xarray as xr
    from arviz_stats.loo import SamplingWrapper

    warnings.filterwarnings("ignore")
    logging.getLogger("pymc").setLevel(logging.ERROR)
    namespace: dict = {}
    exec(compile(MODEL, "model.py", "exec"), namespace)
    build = namespace["build_model"]
    sampler = example_sampler()

    class PyMCFolds(SamplingWrapper):
        def __init__(self, tree, frame, noise):
            super().__init__(model=None, idata_orig=tree)
            self.frame, self.noise, self.folds = frame, noise, 0

        def sel_observations(self, idx):
            held = np.sort(np.atleast_1d(idx))
            return self.frame.drop(index=self.frame.index[held]), self.frame.iloc[held]

        def sample(self, modified_observed_data):
            self.folds += 1
            model = build({c: modified_observed_data[c].to_numpy(float) for c in ("x", "y")}, noise=self.noise)
            return model, pm.sample(draws=sampler["draws"], tune=sampler["tune"], chains=sampler["chains"],
                                    target_accept=sampler["target_accept"], random_seed=self.folds,
                                    nuts_sampler="nutpie", progressbar=False, model=model)

        def get_inference_data(self, fitted_model):
            return fitted_model

        def log_likelihood__i(self, excluded_obs, idata__i):
            held = build({c: excluded_obs[c].to_numpy(float) for c in ("x", "y")}, noise=self.noise)
            values = pm.compute_log_likelihood(idata__i[1], model=held, extend_inferencedata=False,
                                               progressbar=False)["y_obs"]
            return values.rename({values.dims[-1]: "row"})

    elpds, start = {}, time.perf_counter()
    for data in sorted((root / "data").glob("*.csv")):
        frame = pd.read_csv(data)
        for variant in VARIANTS:
            with xr.open_datatree(root / results / variant / "fits" / f"{data.stem}.nc") as tree:
                kfold = arviz_stats.loo_kfold(tree, PyMCFolds(tree, frame, variant), k=k, seed=SEED)
            elpds[f"{data.stem} {variant}"] = float(kfold.elpd)
    print(json.dumps({"seconds": time.perf_counter() - start, "elpd": elpds}))


# ---- the run --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=int, default=12)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--child-reference", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_reference:
        reference(Path(args.child_reference), "warm", args.k)
        return

    import pandas as pd

    root = fresh_dir(RESULTS / "compare_kfold")
    (root / "model.py").write_text(MODEL)
    write_data(root / "data", args.datasets)
    print(f"# compare_kfold.py: {machine_line()}; load average before: {load_average()}", flush=True)
    cold = snakemake(root, write_config(root, "cold", {"method": "psis"}), args.cores)
    warm = snakemake(root, write_config(root, "warm", {"method": "psis"}), args.cores)
    kfold = snakemake(root, write_config(root, "warm", {"method": "kfold", "kfold": {"k": args.k, "datasets": "all"}}),
                      args.cores)
    ref = run_tracked([PY, __file__, "--child-reference", str(root), "--k", str(args.k)],
                      env=child_env(root / "pytensor")).check()
    found = ref.json()

    comparison = pd.read_csv(root / "warm" / "comparison.csv")
    assert set(comparison["method"]) == {"kfold"}, comparison["method"].value_counts()
    ours = {f"{row.dataset} {row.variant}": row.elpd_loo for row in comparison.itertuples()}
    differences = [abs(ours[key] - value) for key, value in found["elpd"].items()]
    logs = sorted((root / "warm").glob("*/logs/refit/*.log"))
    compiles = [line.split(" compile: ", 1)[1] for log in logs for line in log.read_text().splitlines()
                if " compile: " in line]
    refit_seconds = [float(line.rsplit(" in ", 1)[1].split()[0]) for log in logs
                     for line in log.read_text().splitlines() if ": refitted without " in line]
    n_refits = args.datasets * len(VARIANTS) * args.k
    assert len(refit_seconds) == n_refits, (len(refit_seconds), n_refits)

    rows = [("batchfit sweep, cold (compile, fits, PSIS-LOO compare)", cold.wall),
            ("batchfit sweep, warm", warm.wall),
            (f"batchfit K-fold (k = {args.k}): refit plan, {len(logs)} refit job(s), compare", kfold.wall),
            (f"pm.sample per fold (nutpie): {n_refits} pm.sample calls and their log-likelihoods", found["seconds"])]
    print(f"\n{args.datasets} datasets x {len(VARIANTS)} variants, k = {args.k}: {n_refits} refits; "
          f"--cores {args.cores}\n")
    print("| run | wall s |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} |")
    print(f"\n- pm.sample per fold / batchfit K-fold: **{found['seconds'] / kfold.wall:.1f}x**")
    print(f"- batchfit K-fold / ({args.k} x warm sweep): **{kfold.wall / (args.k * warm.wall):.2f}**; "
          f"/ ({args.k} x cold sweep): {kfold.wall / (args.k * cold.wall):.2f}")
    hits = all(c.startswith("cache hit") for c in compiles)
    print(f"- refit jobs' compile lines: {len(compiles)}, all cache hits: {hits}; median refit "
          f"{median(refit_seconds):.3f} s (its log line), {sum(refit_seconds):.1f} s in all")
    print(f"- K-fold elpd, batchfit against pm.sample per fold, over the {len(differences)} fits: median "
          f"|difference| {median(differences):.3f}, max {max(differences):.3f} (Monte Carlo error of two "
          "independent sets of refits)")
    print(f"- load average after: {load_average()}; CPU count {os.cpu_count()}")
    shutil.rmtree(root / "pytensor", ignore_errors=True)


if __name__ == "__main__":
    main()
