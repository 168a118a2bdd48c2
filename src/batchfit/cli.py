"""The ``batchfit`` command: the sweep's stages without Snakemake, and cache upkeep.

    batchfit init [DIR]                       scaffold a project folder (config, model, data, Snakefile)
    batchfit check   --config CONFIG          datasets and model, before any compiling
    batchfit debug   --config CONFIG DATASET  one dataset as a fit job runs it; pdb where the model fails
    batchfit compile --config CONFIG          fill the cache ahead of time
    batchfit fit     --config CONFIG [IDS]    fit pending (or the named) datasets
    batchfit collect --config CONFIG          combine fits; exit 1 if any dataset failed
    batchfit run     --config CONFIG          compile, fit and collect
    batchfit predict --config CONFIG [IDS]    predictions on new inputs (config key predict) from the fits
    batchfit sbc     --config CONFIG          simulation-based calibration; exit 1 unless it passes
    batchfit status  --config CONFIG [--dataset ID]   where the sweep stands, read from its files
    batchfit compare --config CONFIG          a sweep of variants compared per dataset (comparison.csv)
    batchfit sensitivity --config CONFIG      power-scaling sensitivity of every fit (sensitivity.csv)
    batchfit cache info|verify|prune|clear --config CONFIG (or --cache-dir DIR)
    batchfit simulate --model FILE --n N --out DIR   synthetic datasets from simulate()
    batchfit defaults                         every config key with its default
    batchfit --version

Errors in the user's config, data or model print one clear message and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from batchfit.errors import BatchfitError, ModelCodeError

if TYPE_CHECKING:
    from batchfit.config import Config


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an option without one says in its help what its absence does."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action, argparse._StoreTrueAction):
            return f"{action.help} (default: off)"
        if action.required or action.default is None or action.default == []:
            return action.help
        return super()._get_help_string(action)


_HELP = _Help
_STAGES = (("check", "check datasets and that the model compiles fully with numba; exit 1 on a problem"),
           ("compile", "compile the model into the cache (ahead of the fit jobs)"),
           ("fit", "fit pending (or the named) datasets in batches, in this process"),
           ("collect", "combine the fits into posteriors.nc, summary.csv, datasets.csv, failures.csv; "
                       "exit 1 if any failed"),
           ("run", "compile, fit every pending dataset, collect (the sweep without Snakemake)"),
           ("predict", "predict the new inputs of config key predict from the fits: pending (or the named) "
                       "datasets, then predictions.csv; exit 1 if any prediction failed"),
           ("sbc", "simulation-based calibration: simulate from the prior, fit, rank, test; exit 1 unless it passes"),
           ("compare", "a sweep of variants, each collected: compare them per dataset (comparison.csv), by PSIS-LOO "
                       "or where it is unreliable from refits run in this process (compare: in the config)"),
           ("sensitivity", "outputs.sensitivity, once collected: power-scaling sensitivity of every fit "
                           "(sensitivity.csv)"))


def _parser() -> argparse.ArgumentParser:
    from batchfit import __version__

    parser = argparse.ArgumentParser(prog="batchfit", description="Fit one PyMC model to many datasets.",
                                     formatter_class=_HELP)
    parser.add_argument("--version", action="version", version=f"batchfit {__version__}",
                        help="print batchfit's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do (batchfit COMMAND --help for its options)")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, formatter_class=_HELP)

    init = command("init", "scaffold a project folder: config.yaml, model.py, data/, a Snakefile using batchfit's "
                           "workflow as a Snakemake module, profiles/ (local, SLURM); refuses to overwrite files")
    init.add_argument("directory", nargs="?", default=".", help="the project folder (created if missing)")
    for name, text in _STAGES:
        p = command(name, text)
        _config_option(p, variant=name != "compare")
        if name in ("fit", "run", "sbc", "compare"):
            p.add_argument("--threads", type=int, default=1,
                           help="threads for a dataset's chains (and processes for a compile: two at most)")
        if name == "compile":
            p.add_argument("--threads", type=int, default=1,
                           help="processes compiling at once (the log density's callback beside the rest: two "
                                "at most)")
        if name in ("collect", "run"):
            p.add_argument("--workers", type=int, default=1, help="processes that summarise new fits at once")
        if name == "check":
            p.add_argument("--all", action="store_true", dest="every_model",
                           help="build every dataset's model (past 2000 datasets check builds one per distinct "
                                "shape of the data and a sample; every dataset's data are checked either way)")
        if name in ("fit", "predict"):
            p.add_argument("datasets", nargs="*", default=[],
                           help=f"dataset ids to {name} (default: every pending dataset)")
    debug = command("debug", "run one dataset as a fit job does (load, build, structure checks, compile or "
                             "cache load) and sample one short chain; when the model's code raises, open pdb at "
                             "the model's failing line")
    _config_option(debug)
    debug.add_argument("dataset", help="the dataset's id (its file name without the suffix)")
    debug.add_argument("--no-pdb", action="store_true",
                       help="print the model's traceback instead of opening pdb (e.g. in a script)")
    debug.add_argument("--draws", type=int, default=200, help="draws of the short sample (one chain)")
    debug.add_argument("--tune", type=int, default=200, help="tuning steps of the short sample")
    status = command("status", "fitted, pending and failed datasets and the time left, read from the results "
                               "(safe while a sweep runs); with --dataset, that dataset's state and its log lines")
    _config_option(status)
    status.add_argument("--dataset", metavar="ID",
                        help="show this dataset's state (health, failure message or why it is pending) and the "
                             "fit log lines that mention it (default: the counts for every dataset)")
    sim = command("simulate", "write synthetic CSV datasets from the model file's simulate(rng, index)")
    sim.add_argument("--model", required=True, help="the model file that defines simulate(rng, index)")
    sim.add_argument("--n", type=int, default=20, help="number of datasets")
    sim.add_argument("--out", required=True, help="directory the datasets are written to")
    sim.add_argument("--seed", type=int, default=2026, help="seed; dataset i depends only on it and i")
    sim.add_argument("--prefix", default="dataset", help="file names: PREFIX_000.csv, PREFIX_001.csv, ...")
    command("defaults", "print every config key with its default, from the config's schema (what config/README.md "
                        "shows)")
    cache = command("cache", "inspect and maintain the compiled-function cache")
    cache.add_argument("action", choices=("info", "verify", "prune", "clear"),
                       help="info: entries and sizes; verify: check every file (--repair removes damaged ones); "
                            "prune: remove entries by --max-size/--older-than; clear: empty the cache")
    where = cache.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="take cache_dir from this config (this or --cache-dir is required)")
    where.add_argument("--cache-dir", help="the cache directory (this or --config is required)")
    cache.add_argument("--max-size", help="prune: keep the cache under this size, e.g. 2G (default: no size limit)")
    cache.add_argument("--older-than", help="prune: remove what was unused this long, e.g. 30d (default: no age "
                                            "limit; prune needs this or --max-size)")
    cache.add_argument("--repair", action="store_true", help="verify: remove damaged files (rebuilt when next needed)")
    cache.add_argument("--trust-shared", action="store_true",
                       help="use a cache directory that other users can write to")
    return parser


def _config_option(parser: argparse.ArgumentParser, *, variant: bool = True) -> None:
    parser.add_argument("--config", required=True, help="the sweep's YAML config (relative paths in it: to the "
                                                        "current directory)")
    if variant:  # compare takes every variant
        parser.add_argument("--variant", metavar="ID", help="in a sweep of variants (docs/variants.md), the variant "
                                                            "to work on (status and check: default every variant)")


# The exit status of a command whose output was closed early: a shell's for a process ended by SIGPIPE
# (128 + 13), what ``yes | head -1`` gives ``yes``.
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchfit`` command.

    Output closed early (``batchfit status ... | head -4``) ends it quietly, as Unix tools end: no
    traceback, exit status `EXIT_OUTPUT_CLOSED`. Its output is flushed here, so that a closed pipe is
    met inside this function rather than in the interpreter's exit.
    """
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # later flushes (the exit's) write nowhere instead of raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OUTPUT_CLOSED


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("batchfit").setLevel(logging.INFO)
    try:
        return _dispatch(args)
    except BatchfitError as exc:
        # the model's own frames when its code raised (e.g. `batchfit simulate`)
        trace = f"\n{exc.user_traceback}" if isinstance(exc, ModelCodeError) else ""
        print(f"batchfit: {exc}{trace}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    # Each command imports what it runs, when it runs: `batchfit --help`, `status` or `init` wait
    # for no import of PyMC, PyTensor or numba, and the CPU target is set before numba loads.
    from batchfit.config import load_config
    from batchfit.numba_ops.cputarget import apply_cpu_target
    from batchfit.sweep import stages as pipeline
    from batchfit.sweep.verdict import failure_report, prediction_failure_report
    from batchfit.variants import one_variant

    if args.command == "cache":
        return _cache(args)
    if args.command == "init":
        from batchfit.project import init_project

        print(init_project(args.directory).one_line())
        return 0
    if args.command == "defaults":
        from batchfit.schema import defaults_yaml

        print(defaults_yaml(), end="")
        return 0
    if args.command == "simulate":
        from pathlib import Path

        from batchfit.model.simulate import simulate_datasets

        paths = simulate_datasets(Path(args.model), Path(args.out), args.n, seed=args.seed, prefix=args.prefix)
        print(f"simulate: wrote {len(paths)} datasets to {args.out}")
        return 0
    config = load_config(args.config)
    if args.command == "status":
        from batchfit.sweep import status

        print("\n".join(status.status_lines(config, dataset=args.dataset, variant=args.variant)))
        return 0
    if args.command == "compare":
        print(f"compare: wrote {', '.join(map(str, pipeline.run_compare(config, threads=args.threads)))}")
        return 0
    if args.command == "check":
        return _check(config, args.variant, every_model=args.every_model)
    config = one_variant(config, args.variant)
    apply_cpu_target(config.cache.cpu_target, str(args.config))
    if args.command == "sbc":
        from batchfit.sweep.stages import run_sbc

        result = run_sbc(config, threads=args.threads)
        print(result.verdict())
        return 0 if result.passed else 1
    if args.command == "debug":
        return _debug(args, config)
    if args.command == "sensitivity":
        from batchfit.outputs.sensitivity import write_sensitivity

        print(f"sensitivity: wrote {', '.join(map(str, write_sensitivity(config)))}")
        return 0
    if args.command == "predict":
        from batchfit.sweep.predict_job import run_predict

        failed, line = run_predict(config, args.datasets or None)
        print(line)
        report = prediction_failure_report(config)
        if report:
            print(report, file=sys.stderr)
        return 1 if failed else 0
    if args.command in ("compile", "run"):
        stamp = pipeline.run_compile(config, workers=args.threads)
        print(stamp.line)
    if args.command in ("fit", "run"):
        failed = pipeline.run_fit(config, getattr(args, "datasets", None) or None, threads=args.threads)
        if failed:
            print(f"fit: {failed} dataset(s) failed", file=sys.stderr)
    if args.command in ("collect", "run"):
        from batchfit.sweep.collect_job import run_collect

        print(run_collect(config, workers=args.workers).one_line())
        failed_report = failure_report(config)
        if failed_report:
            print(failed_report, file=sys.stderr)
            return 1
    return 0


def _check(config: Config, variant: str | None, *, every_model: bool = False) -> int:
    """``batchfit check``: the config's datasets and model; in a sweep of variants every variant's, a section
    each (only ``variant``'s when given). Exit 1 when any has a problem."""
    from batchfit.numba_ops.cputarget import apply_cpu_target
    from batchfit.sweep.check import check_model
    from batchfit.variants import configs_of, one_variant

    configs = {variant: one_variant(config, variant)} if variant is not None else configs_of(config)
    problems = []
    for name, variant_config in configs.items():
        apply_cpu_target(variant_config.cache.cpu_target, str(config.source))
        report = check_model(variant_config, every_model=every_model)
        lines = report.lines()
        if name is not None:
            lines = [f"variant {name} ({variant_config.results_dir}):", *(f"  {line}" for line in lines)]
        print("\n".join(lines), flush=True)
        if not report.ok:
            problems.append(name)
    if len(configs) > 1:
        print(f"check: {len(configs)} variants, " + (f"problems in {len(problems)}: {', '.join(problems)}"
                                                    if problems else "every one ok"))
    return 1 if problems else 0


def _debug(args: argparse.Namespace, config: object) -> int:
    """``batchfit debug``: its lines as they come; a model error prints the model's traceback and, unless
    ``--no-pdb``, opens pdb at the model's frame."""
    from pathlib import Path

    from batchfit.sweep.debug import debug_dataset, post_mortem

    try:
        for line in debug_dataset(config, args.dataset, draws=args.draws, tune=args.tune):  # type: ignore[arg-type]
            print(line, flush=True)
    except ModelCodeError as exc:
        print(f"batchfit: {exc}\n{exc.user_traceback}", file=sys.stderr, flush=True)
        if not args.no_pdb:
            print("batchfit: opening pdb at the model's frame where it raised (q quits)", file=sys.stderr, flush=True)
            post_mortem(exc, Path(config.model))  # type: ignore[attr-defined]
        return 1
    print("debug: ok")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from batchfit.cache import admin as cache_admin
    from batchfit.cache.store import open_cache
    from batchfit.config import load_config

    if args.config:
        config = load_config(args.config)
        cache = open_cache(config.cache_dir, trust_shared=config.cache.trust_shared or args.trust_shared)
    else:
        cache = open_cache(args.cache_dir, trust_shared=args.trust_shared)
    if args.action == "info":
        print("\n".join(cache_admin.cache_info(cache).lines()))
    elif args.action == "verify":
        problems = cache_admin.verify_cache(cache, repair=args.repair)
        print("\n".join(problems) if problems else "cache verify: every entry and file is intact")
        return 1 if problems and not args.repair else 0
    elif args.action == "prune":
        if not (args.max_size or args.older_than):
            raise BatchfitError("cache prune needs --max-size and/or --older-than")
        try:
            max_size = cache_admin.parse_size(args.max_size) if args.max_size else None
            older = cache_admin.parse_age(args.older_than) if args.older_than else None
        except ValueError as exc:
            raise BatchfitError(str(exc)) from None
        removed = cache_admin.prune_cache(cache, max_size=max_size, older_than=older)
        print(f"cache prune: removed {len(removed)} item(s)")
    else:
        cache_admin.clear_cache(cache)
        print(f"cache clear: emptied {cache.root}")
    return 0


def run() -> NoReturn:
    """The ``batchfit`` console script: `main`, then an exit without the interpreter's teardown
    (`batchfit.common.quick_exit`); an exception leaves through Python's normal exit."""
    from batchfit.common.quick_exit import quick_exit

    quick_exit(main())


if __name__ == "__main__":
    run()
