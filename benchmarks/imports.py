"""What the one import trick left in batchfit saves: nutpie imported without the arviz meta-package.

    python benchmarks/imports.py [--repeats 7]

Every measurement is a fresh Python process that imports what a fit job imports before it samples
(pymc, pytensor's numba backend, batchfit's fit module) and then nutpie, either

* **batchfit**: through ``batchfit.compat.nutpie.import_nutpie`` (nutpie's module gets a stand-in for
  ``arviz`` that loads the package on first use, which batchfit's path never makes), or
* **plain**: ``import nutpie`` (which imports arviz 1.x, and with it arviz_stats and arviz_plots).

The two alternate, so machine noise hits both alike. Prints the median time of the nutpie import
in each and the saving, which must stay above 0.2 s for the trick to be kept (CONTRIBUTING.md,
"Speed tricks that remain, and why"). Results: benchmarks/results/imports/imports.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import PY, RESULTS, fresh_dir, machine_line

CHILD = """
import time
import pymc, pytensor.link.numba.dispatch, batchfit.fitting.fitter
start = time.perf_counter()
{how}
print(time.perf_counter() - start)
"""
HOW = {"batchfit": "from batchfit.compat.nutpie import import_nutpie; import_nutpie()", "plain": "import nutpie"}


def one(method: str) -> float:
    out = subprocess.run([PY, "-c", CHILD.format(how=HOW[method])], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    out = fresh_dir(RESULTS / "imports")
    times: dict[str, list[float]] = {method: [] for method in HOW}
    for _ in range(args.repeats):
        for method in HOW:
            times[method].append(one(method))
    medians = {method: statistics.median(values) for method, values in times.items()}
    print(machine_line())
    for method, values in times.items():
        print(f"{method:>8}: nutpie import median {medians[method]:.3f} s "
              f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} processes)")
    saving = medians["plain"] - medians["batchfit"]
    verdict = "kept: > 0.2 s" if saving > 0.2 else "REMOVE: <= 0.2 s"
    print(f"saving: {saving:.3f} s per process that samples ({verdict})")
    (out / "imports.json").write_text(json.dumps({"times": times, "medians": medians, "saving": saving}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
