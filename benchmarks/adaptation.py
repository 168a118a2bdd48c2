"""Which mass matrix adaptation a sweep should use: nutpie's diagonal or its low-rank, on three corpus models.

    python benchmarks/adaptation.py [--n 20] [--draws 1000] [--tune 1000] [--chains 4] [--cores 2]

Three models of the parity corpus (tests/testkit/parity_corpus.py) of different geometry:

* ``coords-text-labels``: a centred hierarchical model (group intercepts around a mean with an
  unknown spread: a funnel when the spread is small);
* ``rank2-netcdf-design-matrix``: a regression on the columns 1, x and x² (strongly correlated
  coefficients);
* ``gp-marginal``: a Gaussian process's lengthscale, amplitude and noise (curved, heavy-tailed).

For each, ``--n`` datasets are drawn from the model's prior predictive on the corpus's own dataset,
as ``batchfit sbc`` draws its simulations (`batchfit.sweep.sbc.simulate`), and every dataset is
fitted with ``adaptation: diag`` and with ``adaptation: low_rank``, one right after the other, in
one child process with its own empty PyTensor and batchfit caches: the model is compiled once
(batchfit's cached path), and only the sampling is timed (``nutpie.sample`` on the fit job's sampler
model, ``--cores`` chains at a time, until its trace is taken). Per fit:

* ESS bulk: ArviZ's (``arviz_stats.ess``), the smallest over every element of the free parameters:
  the one a sweep's ``health.min_ess_bulk`` meets first;
* per second of sampling, and per gradient evaluation (nutpie's ``n_steps``, summed over the
  warm-up and the draws of every chain: ``discard_tuned_samples: false`` keeps the warm-up's).

Printed, per model and adaptation: the median of each over the datasets, the median over datasets of
the ratio low_rank / diag, and the divergences and failed fits; with the date, machine, versions and
load average. Each adaptation samples one dataset first, unmeasured (the first sample of a process
starts nutpie's thread pool), and the two take turns going first. The per-fit rows go to
benchmarks/results/adaptation/fits.csv (and each model's to its own directory there).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("coords-text-labels", "rank2-netcdf-design-matrix", "gp-marginal")
ADAPTATIONS = ("diag", "low_rank")
COLUMNS = ("model", "dataset", "adaptation", "status", "seconds", "gradients", "ess_bulk", "divergences", "message")


def child(args: argparse.Namespace) -> None:
    """Fit every simulated dataset of ``args.case`` with each adaptation; one CSV row per fit to ``args.out``."""
    import dataclasses
    import logging
    import warnings

    import numpy as np
    from arviz_stats import ess

    from batchfit.compat.nutpie import nutpie_trace
    from batchfit.config import load_config
    from batchfit.fitting.fitter import Fitter, prepare
    from batchfit.model.variables import FREE, variable_roles
    from batchfit.sweep.sbc.simulate import simulate
    from batchfit.sweep.sbc.sweep import sbc_config

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    warnings.simplefilter("ignore")
    config = load_config(args.config)
    print(simulate(config).one_line(), flush=True)
    sweep = sbc_config(config)
    fitters = {}
    for adaptation in ADAPTATIONS:
        settings = dataclasses.replace(sweep, sampler=dataclasses.replace(sweep.sampler, adaptation=adaptation))
        cache, paths, ref = prepare(settings)
        fitters[adaptation] = Fitter(settings, ref, cache, compile_workers=args.cores)
        print(f"{adaptation}: {fitters[adaptation].compile_line}", flush=True)
    free = [name for name, role in variable_roles(ref.model).items() if role == FREE]

    def sample(fitter: Any, dataset_id: str) -> tuple[float, Any]:
        """Seconds from starting the chains to their raw trace, and nutpie's trace."""
        dataset = _load(fitter, dataset_id, paths)
        model = fitter.build(dataset)
        sampling = fitter.sampling(model, dataset, fitter.structure(model, dataset))
        start = time.perf_counter()
        fitter.start(sampling, threads=args.cores)
        raw = sampling.sampler.wait()
        seconds = time.perf_counter() - start
        return seconds, nutpie_trace(sampling.sampler, raw, sampling.model)

    for fitter in fitters.values():  # unmeasured: the first sample of a process starts nutpie's thread pool
        sample(fitter, next(iter(paths)))
    rows = []
    for index, dataset_id in enumerate(paths):
        # each adaptation goes first for every other dataset, so neither always samples on a cooler machine
        for adaptation in ADAPTATIONS if index % 2 == 0 else ADAPTATIONS[::-1]:
            fitter = fitters[adaptation]
            row = {"model": args.case, "dataset": dataset_id, "adaptation": adaptation, "status": "ok", "message": ""}
            try:
                row["seconds"], tree = sample(fitter, dataset_id)
                posterior = tree["posterior"].to_dataset()[free]
                bulk = ess(posterior, method="bulk").data_vars.values()
                row["ess_bulk"] = float(min(np.nanmin(values.values) for values in bulk))
                row["gradients"] = sum(int(tree[group]["n_steps"].sum())
                                       for group in ("sample_stats", "warmup_sample_stats"))
                row["divergences"] = int(tree["sample_stats"]["diverging"].sum())
            except Exception as exc:  # noqa: BLE001 - a failed fit is a result to count
                row.update(status="failed", message=" ".join(str(exc).split())[:200])
            rows.append(row)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _load(fitter: Any, dataset_id: str, paths: Any) -> Any:
    from batchfit.data.dataset import load_dataset

    return load_dataset(dataset_id, paths[dataset_id], fitter.ref.coding)


def report(rows: list[dict[str, str]]) -> None:
    """The medians per model and adaptation, and the medians of the per-dataset ratios, as a Markdown table."""
    sys.path.insert(0, str(HERE))
    from common import median

    print("\n| model | adaptation | fits ok | median ESS bulk | median ESS / s | median ESS / 1000 gradients "
          "| divergences (fits with any) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for model in MODELS:
        fits = {a: {r["dataset"]: r for r in rows if r["model"] == model and r["adaptation"] == a} for a in ADAPTATIONS}
        if not any(fits.values()):
            continue
        for adaptation, by_id in fits.items():
            ok = [r for r in by_id.values() if r["status"] == "ok"]
            print(f"| {model} | {adaptation} | {len(ok)}/{len(by_id)} | {median(float(r['ess_bulk']) for r in ok):.0f} "
                  f"| {median(_per_second(r) for r in ok):.0f} | {median(_per_gradient(r) for r in ok):.2f} "
                  f"| {sum(int(r['divergences']) for r in ok)} ({sum(int(r['divergences']) > 0 for r in ok)}) |")
        both = [d for d in fits["diag"] if fits["diag"][d]["status"] == "ok"
                and fits["low_rank"].get(d, {}).get("status") == "ok"]
        ratios[model] = (median(_per_second(fits["low_rank"][d]) / _per_second(fits["diag"][d]) for d in both),
                         median(_per_gradient(fits["low_rank"][d]) / _per_gradient(fits["diag"][d]) for d in both),
                         len(both))
    print("\n| model | low_rank / diag: ESS per second (median over datasets) | ESS per gradient | datasets |")
    print("|---|---:|---:|---:|")
    for model, (per_second, per_gradient, n) in ratios.items():
        print(f"| {model} | {per_second:.2f} | {per_gradient:.2f} | {n} |")
    failed = [r for r in rows if r["status"] != "ok"]
    for row in failed[:10]:
        print(f"failed: {row['model']} {row['dataset']} {row['adaptation']}: {row['message']}")


def _per_second(row: dict[str, str]) -> float:
    return float(row["ess_bulk"]) / float(row["seconds"])


def _per_gradient(row: dict[str, str]) -> float:
    return 1000 * float(row["ess_bulk"]) / float(row["gradients"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="datasets per model")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2, help="chains sampled at once")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--report-only", action="store_true", help="print the last run's table again")
    for hidden in ("child", "config", "case", "out"):
        parser.add_argument(f"--{hidden}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.cores = int(args.cores)
        child(args)
        return

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests"))
    import yaml
    from common import PY, RESULTS, child_env, fresh_dir, load_average, machine_line, run_tracked

    out = RESULTS / "adaptation"
    if args.report_only:
        rows = [row for model in args.models for row in _rows(out / model / "fits.csv")]
        report(rows)
        return
    from testkit import parity_corpus

    print(f"# adaptation: {machine_line()}; load average {load_average()}")
    print(f"{args.n} datasets per model, {args.chains} chains x {args.tune} tune + {args.draws} draws, "
          f"{args.cores} chains at a time; adaptations {', '.join(ADAPTATIONS)}", flush=True)
    cases = parity_corpus.cases()
    rows = []
    for model in args.models:
        root = fresh_dir(out / model)
        config = parity_corpus.write_case(cases[model], root, root / "cache")
        settings = yaml.safe_load(config.read_text())
        settings.update(sampler={"draws": args.draws, "tune": args.tune, "chains": args.chains, "seed": 2026,
                                 "discard_tuned_samples": False},
                        sbc={"n_simulations": args.n, "seed": 2026})
        config.write_text(yaml.safe_dump(settings))
        env = {**child_env(root / "pytensor"), "NUMBA_CACHE_DIR": str(root / "numba")}
        run = run_tracked([PY, __file__, "--child", "1", "--config", str(config), "--case", model,
                           "--out", str(root / "fits.csv"), "--cores", str(args.cores)], env=env, cwd=root)
        print(f"{model}: {run.wall:.0f} s in all (simulating, compiling once, {2 * args.n} fits)", flush=True)
        if run.returncode != 0:
            print(run.stdout[-2000:], run.stderr[-3000:])
            raise SystemExit(f"{model}: the child process failed")
        rows += _rows(root / "fits.csv")
    print(f"load average at the end {load_average()}")
    with open(out / "fits.csv", "w", newline="") as fh:  # every model's rows in one table
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    report(rows)
    print(json.dumps({"rows": len(rows)}))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


if __name__ == "__main__":
    main()
