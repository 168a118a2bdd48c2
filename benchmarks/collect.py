"""Collect at scale: wall time and peak memory of `collect` for N = 100, 1,000, 10,000 fits, and incremental collect.

    python benchmarks/collect.py [--n 100 1000 10000] [--incremental 30 5]

Writes N synthetic fits shaped like the example model's (``models/hierarchical.py``: mu_a,
sigma_a, a[groups] with 3-8 groups, b, sigma; 2 chains x 200 draws; nutpie's sample stats; 30
rows of data) through batchfit's own write path (``batchfit.fitting.netcdf_writer.write_fit``), with draws from a
random generator (no sampling: this measures collect alone). Fits are written once under
benchmarks/results/collect/fits/ and shared by every N (the first N of them).

For each N, one child process runs ``batchfit.outputs.collect.collect`` (the `collect` rule's library
call) on an empty results directory, its wall time and peak RSS polled with psutil (common.py);
then the same collect again with nothing changed (every summary and posterior block reused).
Printed: seconds per dataset, peak RSS, and the ratios between the largest N and the one before
(targets: time per dataset about constant, i.e. linear in N; peak RSS within 10%).

Incremental (``--incremental 30 5``): collect 30 fits, add 5, collect again; the second child
reports how many datasets it summarised and how many posteriors it read from fits (both should
be 5).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import RESULTS, fresh_dir, load_average, machine_line, mib, run_tracked  # noqa: E402

OUT = RESULTS / "collect"
FITS = OUT / "fits"
CHAINS, DRAWS, ROWS = 2, 200, 30
SAMPLE_STATS = ("depth", "diverging", "energy", "energy_error", "index_in_trajectory", "logp", "maxdepth_reached",
                "mean_tree_accept", "n_steps", "step_size", "step_size_bar", "tree_size")


def dataset_id(i: int) -> str:
    return f"store_{i:05d}"


def write_fits(n: int) -> float:
    """Write the fits 0..n-1 that do not exist yet; return the seconds it took."""
    import numpy as np
    import xarray as xr

    from batchfit.fitting.netcdf_writer import write_fit
    from batchfit.model.variables import FREE, ROLE_ATTR

    FITS.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i in range(n):
        path = FITS / f"{dataset_id(i)}.nc"
        if path.exists():
            continue
        rng = np.random.default_rng(i)
        k = 3 + i % 6  # 3-8 groups: labels g0..g{k-1}, as the sweep's coding gives them
        sample = {"chain": np.arange(CHAINS), "draw": np.arange(DRAWS)}
        scalar = (CHAINS, DRAWS)
        posterior = xr.Dataset({
            "mu_a": (("chain", "draw"), rng.normal(0, 1, scalar), {ROLE_ATTR: FREE}),
            "sigma_a": (("chain", "draw"), np.abs(rng.normal(1, 0.2, scalar)), {ROLE_ATTR: FREE}),
            "a": (("chain", "draw", "groups"), rng.normal(0, 1, (*scalar, k)), {ROLE_ATTR: FREE}),
            "b": (("chain", "draw"), rng.normal(0.5, 0.1, scalar), {ROLE_ATTR: FREE}),
            "sigma": (("chain", "draw"), np.abs(rng.normal(1, 0.1, scalar)), {ROLE_ATTR: FREE}),
        }, coords={**sample, "groups": [f"g{j}" for j in range(k)]},
            attrs={"created_at": "2026-12-01T00:00:00", "inference_library": "nutpie"})
        stats = {name: (("chain", "draw"), rng.normal(size=scalar)) for name in SAMPLE_STATS}
        stats["diverging"] = (("chain", "draw"), rng.random(scalar) < 0.001)
        codes = rng.integers(0, k, ROWS)
        tree = xr.DataTree.from_dict({
            "posterior": posterior,
            "sample_stats": xr.Dataset(stats, coords=sample),
            "observed_data": xr.Dataset({"y": ("y_dim_0", rng.normal(size=ROWS))}),
            "constant_data": xr.Dataset({"x": ("x_dim_0", rng.normal(size=ROWS)), "group": ("group_dim_0", codes),
                                         "group_labels": ("group_code", np.array(list(posterior["groups"].values),
                                                                                 dtype=object))}),
        })
        tree.attrs = {"batchfit_version": "0.1.0", "dataset": dataset_id(i), "source": f"data/{dataset_id(i)}.csv",
                      "model_file": "models/hierarchical.py", "seed": int(i), "compile_key": "0" * 64,
                      "structure": "1" * 64, "sampler_path": "batchfit", "provenance": f"{i:064x}",
                      "sampler": json.dumps({"draws": DRAWS, "tune": DRAWS, "chains": CHAINS}),
                      "model_hash": "2" * 64, "data_sha256": "3" * 64, "versions": json.dumps({"pymc": "6.4.0"})}
        write_fit(tree, path)
    return time.perf_counter() - start


def child(results: Path, n: int) -> None:
    """One collect of the first n fits into `results` (fits linked in); prints a JSON line."""
    start = time.perf_counter()
    from batchfit.config import config_from_dict
    from batchfit.outputs.collect import collect

    imported = time.perf_counter()
    config = config_from_dict({"model": "models/hierarchical.py", "datasets": ["*.csv"], "results_dir": str(results)})
    report = collect(config, [dataset_id(i) for i in range(n)])
    done = time.perf_counter()
    print(json.dumps({"imports": imported - start, "collect": done - imported, "n": report.n_datasets,
                      "summarised": len(report.summarised_ids), "read": len(report.posterior_read_ids)}))


def run_collect(results: Path, n: int) -> dict:
    run = run_tracked([sys.executable, __file__, "--child", str(results), str(n)]).check()
    return {**run.json(), "wall": run.wall, "peak_rss_mib": mib(run.peak_rss_largest)}


def results_dir(name: str) -> Path:
    """A fresh results directory whose fits/ is the shared fits directory."""
    results = fresh_dir(OUT / name)
    (results / "fits").symlink_to(FITS, target_is_directory=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--incremental", type=int, nargs=2, default=[30, 5], metavar=("FITTED", "ADDED"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), int(args.child[1]))
        return

    print(machine_line())
    print(f"load average at start: {load_average()}")
    fitted, added = args.incremental
    written = write_fits(max([*args.n, fitted + added]))
    print(f"fits written (once, not measured): {written:.1f} s\n")

    rows = []
    print(f"{'N':>6} {'collect (s)':>11} {'per dataset (ms)':>16} {'peak RSS (MiB)':>14} {'again (s)':>9} "
          f"{'again per dataset (ms)':>22} {'again RSS (MiB)':>15}")
    for n in sorted(args.n):
        results = results_dir(f"n{n}")
        cold, again = run_collect(results, n), run_collect(results, n)
        rows.append((n, cold, again))
        print(f"{n:>6} {cold['collect']:>11.2f} {1e3 * cold['collect'] / n:>16.2f} {cold['peak_rss_mib']:>14.0f} "
              f"{again['collect']:>9.2f} {1e3 * again['collect'] / n:>22.2f} {again['peak_rss_mib']:>15.0f}")
        shutil.rmtree(results)
    for (n0, c0, _), (n1, c1, _) in zip(rows, rows[1:], strict=False):
        print(f"N {n0} -> {n1}: time per dataset x{(c1['collect'] / n1) / (c0['collect'] / n0):.2f}, "
              f"peak RSS x{c1['peak_rss_mib'] / c0['peak_rss_mib']:.2f} (targets: about 1, within 1.10)")

    results = results_dir("incremental")
    first = run_collect(results, fitted)
    second = run_collect(results, fitted + added)
    print(f"\nincremental: collect of {fitted} fits {first['collect']:.2f} s; +{added} datasets: "
          f"{second['collect']:.2f} s, summarised {second['summarised']}, read {second['read']} posteriors from "
          f"their fits (target: {added} and {added})")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
