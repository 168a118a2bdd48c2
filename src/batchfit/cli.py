"""The ``batchfit`` command: the sweep's stages without Snakemake, and cache upkeep.

    batchfit check   --config CONFIG          datasets and model, before any compiling
    batchfit compile --config CONFIG          fill the cache ahead of time
    batchfit fit     --config CONFIG [IDS]    fit pending (or the named) datasets
    batchfit collect --config CONFIG          combine fits; exit 1 if any dataset failed
    batchfit run     --config CONFIG          compile, fit and collect
    batchfit sbc     --config CONFIG          simulation-based calibration; exit 1 unless it passes
    batchfit cache info|verify|prune|clear --config CONFIG (or --cache-dir DIR)
    batchfit simulate --model FILE --n N --out DIR   synthetic datasets from simulate()

Errors in the user's config, data or model print one clear message and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from batchfit.errors import BatchfitError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchfit", description="Fit one PyMC model to many datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("check", "check datasets and that the model compiles fully with numba"),
                       ("compile", "compile the model into the cache (ahead of the fit jobs)"),
                       ("fit", "fit datasets in batches"),
                       ("collect", "combine the fits into posteriors.nc, summary.csv, failures.csv"),
                       ("run", "compile, fit every pending dataset, collect"),
                       ("sbc", "simulation-based calibration: simulate from the prior, fit, rank, test")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config", required=True, help="the sweep's YAML config")
        if name in ("fit", "run", "sbc"):
            p.add_argument("--threads", type=int, default=1, help="threads for a dataset's chains")
        if name == "fit":
            p.add_argument("datasets", nargs="*", help="dataset ids (default: every pending dataset)")
    sim = sub.add_parser("simulate", help="write synthetic datasets from the model file's simulate()")
    sim.add_argument("--model", required=True)
    sim.add_argument("--n", type=int, default=20)
    sim.add_argument("--out", required=True)
    sim.add_argument("--seed", type=int, default=2026)
    sim.add_argument("--prefix", default="dataset")
    cache = sub.add_parser("cache", help="inspect and maintain the compiled-function cache")
    cache.add_argument("action", choices=("info", "verify", "prune", "clear"))
    where = cache.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="take cache_dir from this config")
    where.add_argument("--cache-dir", help="the cache directory")
    cache.add_argument("--max-size", help="prune: keep the cache under this size (e.g. 2G)")
    cache.add_argument("--older-than", help="prune: remove what was unused this long (e.g. 30d)")
    cache.add_argument("--repair", action="store_true", help="verify: remove damaged files (rebuilt when next needed)")
    cache.add_argument("--trust-shared", action="store_true",
                       help="use a cache directory that other users can write to")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchfit`` command."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("batchfit").setLevel(logging.INFO)
    try:
        return _dispatch(args)
    except BatchfitError as exc:
        print(f"batchfit: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from batchfit import pipeline
    from batchfit.config import load_config
    from batchfit.cputarget import apply_cpu_target

    if args.command == "cache":
        return _cache(args)
    if args.command == "simulate":
        from pathlib import Path

        from batchfit.simulate import simulate_datasets

        paths = simulate_datasets(Path(args.model), Path(args.out), args.n, seed=args.seed, prefix=args.prefix)
        print(f"simulate: wrote {len(paths)} datasets to {args.out}")
        return 0
    config = load_config(args.config)
    apply_cpu_target(config.cache.cpu_target, str(args.config))
    if args.command == "sbc":
        from batchfit.sbc import run_sbc

        result = run_sbc(config, threads=args.threads)
        print(result.verdict())
        return 0 if result.passed else 1
    if args.command == "check":
        from batchfit.check import check_model

        report = check_model(config)
        print("\n".join(report.lines()))
        return 0 if report.ok else 1
    if args.command in ("compile", "run"):
        stamp = pipeline.run_compile(config)
        print(stamp["line"])
    if args.command in ("fit", "run"):
        failed = pipeline.run_fit(config, getattr(args, "datasets", None) or None, threads=args.threads)
        if failed:
            print(f"fit: {failed} dataset(s) failed", file=sys.stderr)
    if args.command in ("collect", "run"):
        print(pipeline.run_collect(config).one_line())
        line = pipeline.failure_line(config)
        if line:
            print(line, file=sys.stderr)
            return 1
    return 0


def _cache(args: argparse.Namespace) -> int:
    from batchfit import cache_admin
    from batchfit.cache import open_cache
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


if __name__ == "__main__":
    sys.exit(main())
