"""Cold compile: batchfit's compile job against nutpie's compile, per model, over two sets of models.

    python benchmarks/compile.py [--runs 2] [--set corpus|heldout|both] [--models NAME ...]

The sets: the parity corpus (tests/testkit/parity_corpus.py), on which the compile was tuned, and the held-out
models (benchmarks/heldout_models.py), written for this benchmark and not used to tune anything; each
is reported apart, with its median and worst ratio. Every measurement is a fresh process on empty
caches, as a new user meets it:

* batchfit: ``batchfit compile --config <case> --threads 2`` (the compile job: two worker processes)
  with a fresh ``cache_dir``. Its parts come from the job's own log lines: the graphs and PyTensor's
  rewrites, the expansion's worker's walk back over the log density's node functions
  (`batchfit.compile.ahead`), numba's compile of each callback (per worker), the per-process
  functions, the optional outputs, the whole compile (workers included), the reference fit; "other"
  is the rest of the process wall (imports, reading the data, the model's key, loading the entry,
  start-up and exit).
* nutpie: a fresh process running ``nutpie.compile_pymc_model(build_model(...))`` on the same model
  and dataset, with a fresh PyTensor ``compiledir`` (its numba cache lives there).

The sides take turns (each run starts with the next one), so machine noise hits them alike. With
``--baseline SRC`` (the ``src`` directory of a checkout of an older commit) that batchfit's compile
job is a third side: before and after a change, side by side ("b/base": batchfit over baseline).
Prints a table per set, a row per model (medians over the runs) with the ratio of process walls,
then the set's median ratio and the worst, and the load average before and after; every run goes to
benchmarks/results/compile/compile.csv with its CPU time (the whole process tree's, from
``getrusage(RUSAGE_CHILDREN)``) and the load average when it started. The "cpu ratio" column is
batchfit's CPU over nutpie's: less sensitive to other work on the machine than the walls, but
batchfit's two workers spend more CPU than they save wall, so it is no goal. The parts end with each
compile worker's CPU seconds over its stages (``cpu_logp``, ``cpu_rest``).
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent

# batchfit's log lines this benchmark reads the parts from (batchfit.compile.entry._StageClock,
# batchfit.cache.store's miss line, batchfit.sweep.stages.measure_fit)
STAGE = re.compile(r"compile worker \((\w+)\): INFO compile \w+: (.+?) in ([\d.]+) s(?: \(CPU ([\d.]+) s\))?$", re.M)
COMPILED = re.compile(r"cache miss \w+: compiled in ([\d.]+) s")
REFERENCE_FIT = re.compile(r"reference fit of .+ in ([\d.]+) s")
# the second worker's walk back (batchfit.compile.ahead), whose line starts with how many node functions it compiled
WALK_BACK = re.compile(r"\d+ of the log density's node functions, from its last node back")
PARTS = {"nutpie's logp callback (numba, cached)": "numba_logp",
         "nutpie's expand callback (numba, cached)": "numba_expand",
         "per-process functions (initial point, shapes)": "per_process",
         "optional outputs": "outputs"}


def nutpie_child(config_path: str) -> None:
    """One nutpie process: build the case's model from its dataset, ``nutpie.compile_pymc_model`` it."""
    import nutpie

    from batchfit.config import load_config
    from batchfit.data.dataset import load_dataset
    from batchfit.data.discovery import discover_datasets
    from batchfit.model.model_file import build_model, load_model_file

    t_import = time.perf_counter()
    config = load_config(config_path)
    datasets = discover_datasets(config.data_sources)
    dataset_id = next(iter(datasets))
    model = build_model(load_model_file(config.model), load_dataset(dataset_id, datasets[dataset_id]))
    t_build = time.perf_counter()
    nutpie.compile_pymc_model(model)
    t_compiled = time.perf_counter()
    print(json.dumps({"import_s": t_import - _T0, "build_s": t_build - t_import, "compile_s": t_compiled - t_build}))


def children_cpu() -> float:
    """CPU seconds (user and system) of every child process this process has waited for, theirs included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def batchfit_parts(stderr: str) -> dict[str, float]:
    """The compile job's parts from its log (a part two workers both ran: the longer), and each worker's
    CPU seconds over its stages (``cpu_logp``, ``cpu_rest``: the longer is the compile's length on two
    otherwise idle cores, whatever else the machine ran)."""
    parts: dict[str, float] = {}
    for worker, stage, seconds, cpu in STAGE.findall(stderr):
        name = ("graphs" if stage.startswith("PyTensor functions") else "walk_back" if WALK_BACK.fullmatch(stage)
                else PARTS.get(stage, stage))
        parts[name] = max(parts.get(name, 0.0), float(seconds))
        parts[f"cpu_{worker}"] = parts.get(f"cpu_{worker}", 0.0) + float(cpu or "nan")
    for pattern, name in ((COMPILED, "compile"), (REFERENCE_FIT, "reference_fit")):
        found = pattern.search(stderr)
        parts[name] = float(found.group(1)) if found else float("nan")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--set", choices=("corpus", "heldout", "both"), default="both", dest="which",
                        help="which models: the parity corpus, the held-out models, or both (default)")
    parser.add_argument("--models", nargs="*", help="case names (default: every model of the set)")
    parser.add_argument("--baseline", help="another batchfit's src directory (a checkout of an older commit): its "
                                           "compile job runs too, in turn with the others, as the 'baseline' side")
    parser.add_argument("--nutpie-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nutpie_child:
        nutpie_child(args.nutpie_child)
        return

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests"))
    import heldout_models
    import yaml
    from common import RESULTS, child_env, fresh_dir, load_average, machine_line, median, run_tracked
    from testkit import parity_corpus

    out = fresh_dir(RESULTS / "compile")
    sets = {"corpus": parity_corpus.cases(), "heldout": heldout_models.cases()}
    chosen = {"corpus": ("corpus",), "heldout": ("heldout",), "both": ("heldout", "corpus")}[args.which]
    members = {name: which for which in chosen for name in sets[which]}
    names = args.models or list(members)
    unknown = sorted(set(names) - set(members))
    if unknown:
        raise SystemExit(f"not in the {' or '.join(chosen)} models: {', '.join(unknown)}")
    print(f"# compile: {machine_line()}; load average {load_average()}")
    configs = {name: parity_corpus.write_case(sets[members[name]][name], out / "cases", out / "unused-cache")
               for name in names}

    def batchfit(name: str, run: int, src: str | None = None) -> dict:
        side = "baseline" if src else "batchfit"
        config = yaml.safe_load(configs[name].read_text())
        config["cache_dir"] = str(fresh_dir(out / "caches" / f"{name}-{run}-{side}"))
        path = configs[name].with_name(f"config-{run}-{side}.yaml")
        path.write_text(yaml.safe_dump(config))
        env = child_env()
        if src:  # the older batchfit first on the path, for the job and its workers
            env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        r = run_tracked([sys.executable, "-m", "batchfit.cli", "compile", "--config", str(path), "--threads", "2"],
                        env=env, cwd=path.parent).check()
        return {"wall_s": r.wall, **batchfit_parts(r.stderr)}

    def nutpie(name: str, run: int) -> dict:
        pytensor_dir = fresh_dir(out / "nutpie-pytensor" / f"{name}-{run}")
        r = run_tracked([sys.executable, __file__, "--nutpie-child", str(configs[name])],
                        env=child_env(pytensor_dir), cwd=configs[name].parent).check()
        return {"wall_s": r.wall, **r.json()}

    rows = []
    for run in range(args.runs):
        for name in names:
            sides = [("batchfit", batchfit), ("nutpie", nutpie)]
            if args.baseline:
                sides.insert(1, ("baseline", lambda name, run: batchfit(name, run, args.baseline)))
            for side, measure in sides[run % len(sides):] + sides[:run % len(sides)]:
                load, cpu = os.getloadavg()[0], children_cpu()
                measured = measure(name, run)
                rows.append({"model": name, "run": run, "side": side, "load_1min": load,
                             "cpu_s": children_cpu() - cpu, **measured})
                print(f"  run {run} {name} {side}: {rows[-1]['wall_s']:.1f} s, CPU {rows[-1]['cpu_s']:.1f} s "
                      f"(load {load:.2f})", flush=True)

    columns = sorted({key for row in rows for key in row}, key=lambda k: (k not in ("model", "run", "side"), k))
    with open(out / "compile.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)

    def med(name: str, side: str, key: str) -> float:
        return median(row.get(key, float("nan")) for row in rows if row["model"] == name and row["side"] == side)

    parts = ("graphs", "walk_back", "numba_logp", "numba_expand", "per_process", "outputs", "compile",
             "reference_fit", "cpu_logp", "cpu_rest")
    for which in chosen:
        ratios = {}
        before = f" {'baseline':>8s} {'b/base':>6s}" if args.baseline else ""
        print(f"\n{which} models\n{'model':40s} {'batchfit':>8s} {'nutpie':>7s} {'ratio':>6s} {'cpu ratio':>9s}{before}"
              "   batchfit parts (s): " + " ".join(parts) + " other")
        for name in (name for name in names if members[name] == which):
            bf, nu = med(name, "batchfit", "wall_s"), med(name, "nutpie", "wall_s")
            ratios[name] = bf / nu
            cpu_ratio = med(name, "batchfit", "cpu_s") / med(name, "nutpie", "cpu_s")
            values = [med(name, "batchfit", p) for p in parts]
            other = bf - values[parts.index("compile")] - values[parts.index("reference_fit")]
            base = med(name, "baseline", "wall_s")
            before = f" {base:8.1f} {bf / base:6.2f}" if args.baseline else ""
            print(f"{name:40s} {bf:8.1f} {nu:7.1f} {ratios[name]:6.2f} {cpu_ratio:9.2f}{before}   "
                  + " ".join(f"{v:.1f}" for v in values) + f" {other:.1f}")
        if ratios:
            worst = max(ratios, key=ratios.get)
            print(f"batchfit / nutpie cold compile over the {which} models (process wall, median of {args.runs} "
                  f"runs each): median {median(ratios.values()):.2f}, worst {ratios[worst]:.2f} ({worst}), "
                  f"{len(ratios)} models")
    print(f"\nload average at the end {load_average()}; runs: {out / 'compile.csv'}")


if __name__ == "__main__":
    main()
