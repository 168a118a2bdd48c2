"""SBC of the example model two ways: batchfit (`snakemake sbc`) and simuk (arviz-devs' SBC package).

Both run N simulations of `models/hierarchical.py` on the template `data/example/store_000.csv`
with the bundled example's sampler settings (draws, tune, chains), each in a fresh child process
with an empty compile cache, on `--cores` cores:

* **batchfit**: `snakemake sbc --cores C` with `sbc: {n_simulations: N}`: one compile into the
  batchfit cache, then fit jobs that only sample;
* **simuk** (the usage its `SBC` docstring shows): `simuk.SBC(model, num_simulations=N).run_simulations()`.
  It draws all N parameter sets and datasets with one `pm.sample_prior_predictive`, then, for
  each simulation, `pm.set_data` + `pm.observe(model, ...)` make a new model and `pm.sample`
  (PyMC's NUTS, `cores=C`, `chains` chains) fits it. Every `pm.sample` compiles the new model's
  log density and gradient again through PyTensor's default numba backend: small per-op
  functions come from the on-disk cache, but the whole-graph function is new every simulation
  (one more `numba_funcified_fgraph` cache entry per simulation in its compile directory), then
  it starts `cores` worker processes for the chains. Both wall times are whole child processes (imports
  included): `snakemake` and a Python process running simuk.

Printed: the wall time of each and their ratio, and for every parameter element the uniformity
test of both (batchfit's: ArviZ's simultaneous ECDF band and pot_c p-value, on each tool's ranks
scaled to [0, 1]) plus a two-sample Kolmogorov-Smirnov test of the two scaled rank samples (the
simulations differ: each tool draws its own, so only the distributions can agree). Outputs go to
benchmarks/results/sbc/.

    python benchmarks/sbc.py --n 100          # the issue's comparison (long: simuk pays ~N compiles)
    python benchmarks/sbc.py --n 10           # a smoke run
    python benchmarks/sbc.py --report-only    # compare the last run's outputs again
    python benchmarks/sbc.py --stages-only    # where batchfit's time went in the last run
    python benchmarks/sbc.py --n 4 --out /tmp/sbc-smoke   # elsewhere, not over the last run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    EXAMPLE_DATA,
    MODEL,
    PY,
    REPO,
    RESULTS,
    child_env,
    example_sampler,
    fresh_dir,
    load_average,
    machine_line,
    run_tracked,
)

TEMPLATE = EXAMPLE_DATA / "store_000.csv"


def simuk_child(out: str, n: int, cores: int, seed: int) -> None:
    """Run simuk's SBC on the example model built from the template; write its ranks (rank, n_draws)."""
    import time

    import simuk
    import xarray as xr

    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    sampler = example_sampler()
    model = build_model(load_model_file(MODEL), load_dataset(TEMPLATE.stem, TEMPLATE))
    start = time.perf_counter()
    sbc = simuk.SBC(model, num_simulations=n, seed=seed, progress_bar=False,
                    sample_kwargs={"draws": sampler["draws"], "tune": sampler["tune"], "chains": sampler["chains"],
                                   "cores": cores, "target_accept": sampler["target_accept"]})
    sbc.run_simulations()
    wall = time.perf_counter() - start
    group = sbc.simulations["prior_sbc"].to_dataset()
    # simuk names a vector's dimension a_dim_0 with no labels: give each variable the model's own
    # dims and coordinates, so the report can match every element to batchfit's by its label.
    group = xr.Dataset({name: (("chain", "draw", *model.named_vars_to_dims.get(name, ())), var.values)
                        for name, var in group.data_vars.items()},
                       coords={d: list(v) for d, v in model.coords.items()})
    group.attrs["n_draws"] = sampler["draws"] * sampler["chains"]
    group.to_netcdf(out)
    print(json.dumps({"wall": wall, "completed": int(sbc._simulations_complete)}))


def batchfit_run(root: Path, n: int, cores: int, seed: int):
    """`snakemake sbc` on an empty cache and results directory; returns the child Run."""
    config = {"model": str(MODEL), "datasets": [str(TEMPLATE)], "columns": {"group": {"scope": "dataset"}},
              "sampler": example_sampler(), "batch_size": max(1, -(-n // cores)),
              "cache_dir": str(fresh_dir(root / "cache")), "results_dir": str(fresh_dir(root / "results")),
              "sbc": {"n_simulations": n, "seed": seed}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = child_env(root / "cache" / "pytensor")
    env["NUMBA_CACHE_DIR"] = str(root / "cache" / "numba")
    return run_tracked([Path(PY).with_name("snakemake"), "sbc", "--cores", cores, "--configfile", path],
                       env=env, cwd=REPO).check(), root / "results" / "sbc"


def elements(group, n_draws: int) -> dict[str, np.ndarray]:
    """Label -> ranks over simulations, from a `prior_sbc` group (chain=1, draw=simulation, ...)."""
    from batchfit.sweep.sbc.pit import Ranked
    from batchfit.sweep.sbc.ranks import element_ranks

    out = {}
    for name, var in group.data_vars.items():
        dims = tuple(d for d in var.dims if d not in ("chain", "draw"))
        coords = {d: var[d].values for d in dims if d in var.coords}
        out.update(element_ranks(str(name), Ranked(var.values[0], dims, coords)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="simulations (default 100)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--report-only", action="store_true",
                        help="only compare the outputs of the last run in --out")
    parser.add_argument("--out", type=Path, default=RESULTS / "sbc",
                        help="where the runs' caches and outputs go (default benchmarks/results/sbc/)")
    parser.add_argument("--stages-only", action="store_true",
                        help="only print where batchfit's time went in the last run in --out (no simuk needed)")
    parser.add_argument("--simuk-child", nargs=1, metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simuk_child:
        simuk_child(args.simuk_child[0], args.n, args.cores, args.seed)
        return
    root = args.out
    if args.stages_only:
        table = stages(root / "batchfit" / "snakemake.log", root / "batchfit" / "results" / "sbc")
        print(table.to_markdown(index=False))
        return
    if not args.report_only:
        measure(root, args.n, args.cores, args.seed)
    report(root, args.cores)


def measure(root: Path, n: int, cores: int, seed: int) -> None:
    """Run both tools; their wall times go to walls.json, their ranks to batchfit/ and simuk/."""
    fresh_dir(root)
    print(f"{machine_line()}; load average before: {load_average()}")
    bf_run, _ = batchfit_run(root / "batchfit", n, cores, seed)
    (root / "batchfit" / "snakemake.log").write_text(bf_run.stderr)  # job start/finish times, for report
    print(f"batchfit (snakemake sbc, cold cache): {bf_run.wall:.1f} s")
    sk_dir = fresh_dir(root / "simuk")
    sk_run = run_tracked([PY, __file__, "--n", n, "--cores", cores, "--seed", seed,
                          "--simuk-child", sk_dir / "ranks.nc"],
                         env=child_env(sk_dir / "pytensor"), cwd=REPO).check()
    completed = sk_run.json()["completed"]
    print(f"simuk (pm.sample per simulation): {sk_run.wall:.1f} s ({completed} completed)")
    if completed != n:  # simuk stops at the first failing fit and keeps what it has
        raise SystemExit(f"simuk completed {completed} of {n} simulations; see its output:\n{sk_run.stderr[-3000:]}")
    (root / "walls.json").write_text(json.dumps({"n": n, "batchfit": bf_run.wall, "simuk": sk_run.wall,
                                                 "machine": machine_line(), "load_after": load_average()}))


def report(root: Path, cores: int) -> None:
    """Wall times, their ratio and the agreement of the two tools' rank statistics."""
    import pandas as pd
    import xarray as xr
    from scipy import stats

    from batchfit.sweep.sbc.pit import pit_values
    from batchfit.sweep.sbc.ranks import uniformity

    walls = json.loads((root / "walls.json").read_text())
    bf_root = root / "batchfit" / "results" / "sbc"
    bf_tree = xr.open_datatree(bf_root / "ranks.nc")
    bf_draws = int(bf_tree.attrs["n_draws"])
    bf_group = bf_tree["prior_sbc"].to_dataset()
    bf = elements(bf_group, bf_draws)
    sk_group = xr.open_dataset(root / "simuk" / "ranks.nc")
    sk_draws = int(sk_group.attrs["n_draws"])
    sk = elements(sk_group, sk_draws)
    if set(bf) != set(sk):
        raise SystemExit(f"the two tools ranked different parameter elements: only batchfit "
                         f"{sorted(set(bf) - set(sk))}, only simuk {sorted(set(sk) - set(bf))}")
    bf_test = uniformity({k: _scalar(v) for k, v in bf.items()}, bf_draws, 0.95).set_index("parameter")
    sk_test = uniformity({k: _scalar(v) for k, v in sk.items()}, sk_draws, 0.95).set_index("parameter")
    rows = []
    for label in bf:
        ks = stats.ks_2samp(pit_values(bf[label], bf_draws), pit_values(sk[label], sk_draws))
        rows.append({"parameter": label,
                     "batchfit_in_band": not bf_test.loc[label, "outside_band"],
                     "batchfit_pot_c_p": round(bf_test.loc[label, "pot_c_p_value"], 3),
                     "simuk_in_band": not sk_test.loc[label, "outside_band"],
                     "simuk_pot_c_p": round(sk_test.loc[label, "pot_c_p_value"], 3),
                     "ks_2samp_p": round(ks.pvalue, 3)})
    ranks = pd.DataFrame(rows)
    print(f"\n{walls['machine']}\nN = {walls['n']} simulations, {cores} cores, sampler {example_sampler()}; "
          f"load average after the runs: {walls['load_after']}")
    print(f"| method | wall (s) |\n|---|---:|\n| batchfit `snakemake sbc` (cold cache) | {walls['batchfit']:.1f} |\n"
          f"| simuk | {walls['simuk']:.1f} |")
    print(f"\nsimuk / batchfit wall time = {walls['simuk'] / walls['batchfit']:.1f}x")
    print(f"batchfit verdict: {(bf_root / 'verdict.txt').read_text().strip()}")
    print(f"\nwhere batchfit's {walls['batchfit']:.1f} s went (Snakemake's job times, 1 s resolution; "
          f"per-simulation fit times from the batch manifests):\n")
    table = stages(root / "batchfit" / "snakemake.log", bf_root)
    print(table.to_markdown(index=False))
    print(f"\nSnakemake outside its jobs (start-up, DAG, exit): {walls['batchfit'] - table['to_s'].max():.0f} s\n")
    print(f"simuk ranks: {int((~ranks['simuk_in_band']).sum())} of {len(ranks)} elements outside the band\n")
    print(ranks.to_markdown(index=False))


def stages(snakemake_log: Path, sbc_root: Path):
    """Per Snakemake rule: jobs, first start to last finish (s after the first job started) and the
    summed job time; for `sbc_fit` also the summed and median per-simulation `fit_one` seconds."""
    import datetime
    import re

    import pandas as pd

    from batchfit.records.manifest import BatchManifest

    now = None
    started: dict[str, tuple[str, datetime.datetime]] = {}
    jobs = []
    rule = None
    for line in snakemake_log.read_text().splitlines():
        if m := re.fullmatch(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line.strip()):
            now = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.fullmatch(r"(?:local)?(?:rule|checkpoint) (\w+):", line.strip()):
            rule = m.group(1)
        elif rule and (m := re.fullmatch(r"jobid: (\d+)", line.strip())):
            started[m.group(1)] = (rule, now)
            rule = None
        elif m := re.fullmatch(r"Finished jobid: (\d+) \(Rule: (\w+)\)", line.strip()):
            name, start = started.pop(m.group(1))
            jobs.append({"rule": name, "start": start, "end": now})
    if started:
        raise SystemExit(f"{snakemake_log}: jobs started but never finished: {sorted(started.values())}")
    frame = pd.DataFrame(jobs)
    t0 = frame["start"].min()
    frame["job_s"] = (frame["end"] - frame["start"]).dt.total_seconds()
    table = frame.groupby("rule", sort=False).agg(jobs=("rule", "size"), first_start=("start", "min"),
                                                  last_end=("end", "max"), job_s_sum=("job_s", "sum"))
    table["from_s"] = (table.pop("first_start") - t0).dt.total_seconds()
    table["to_s"] = (table.pop("last_end") - t0).dt.total_seconds()
    fits = [o.seconds for path in sorted((sbc_root / "batches").glob("*.json"))
            for o in BatchManifest.read(path).datasets.values()]
    table["fit_one_s_sum"] = pd.Series({"sbc_fit": round(sum(fits), 1)})
    table["fit_one_s_median"] = pd.Series({"sbc_fit": round(float(np.median(fits)), 2)})
    table["fit_one_s_max"] = pd.Series({"sbc_fit": round(max(fits), 1)})  # a job's first fit (see benchmarks/README.md)
    return table.reset_index()


def _scalar(values: np.ndarray):
    """One element's ranks as a parameter of its own, for `uniformity`."""
    from batchfit.sweep.sbc.pit import Ranked

    return Ranked(np.asarray(values), (), {})


if __name__ == "__main__":
    main()
