"""A compile worker process: ``python -m batchfit.compile.worker_process``, started by `batchfit.compile.worker_pool`.

It rebuilds the model from its file and one dataset and compiles (part of) the entry into the
cache. Started before its work is known (`batchfit.common.standby`), it imports what needs no
environment first and numba and PyTensor only once its parent has told it theirs, so this
module imports neither at its top.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

from batchfit.cache.heal import is_damage_error
from batchfit.cache.store import open_cache
from batchfit.common import collector
from batchfit.common.quick_exit import quick_exit
from batchfit.compat.numba import compiling_once
from batchfit.compat.pytensor import cached_by_pytensor
from batchfit.compile.entry import build_entry
from batchfit.compile.graphs import SamplerGraphs, sampler_key
from batchfit.compile.worker_pool import DAMAGED_EXIT, PARTS, UNSUPPORTED_EXIT
from batchfit.errors import CachedPathUnsupported
from batchfit.model.model_file import build_model, load_model_file
from batchfit.settings import OutputSettings

log = logging.getLogger("batchfit")


def _standby_start() -> list[str] | None:
    """A `batchfit.common.standby` worker's imports, then its arguments (None if its parent sent none).

    What the model file, the graphs and numba's compile import (the slow part of the worker's start),
    done while the parent is still importing, reading the data and computing the key. First
    xarray, pandas and SciPy's sparse arrays, which read none of WORKER_ENVIRONMENT:
    the compile job starts this process before it has read its config. Then, once its parent
    has said what they are (one line, `worker_environment`), numba and PyTensor.
    """
    import scipy.sparse  # noqa: F401
    import xarray  # noqa: F401

    early = {"numba", "pytensor"} & sys.modules.keys()
    if early:  # a library's new import: they would ignore the parent's environment
        raise RuntimeError(f"the compile worker imported {sorted(early)} before its environment")
    environment = sys.stdin.readline()
    if not environment:
        return None
    for name, value in json.loads(environment).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    import pymc  # noqa: F401
    import pytensor.link.numba.dispatch  # noqa: F401

    work = sys.stdin.read()
    return json.loads(work) if work else None


def main(argv: Sequence[str] | None = None) -> int:
    """Compile worker: rebuild a model from its file and one dataset, compile it into the cache.

    Without ``argv``, a `batchfit.common.standby` process, which reads them from stdin (`_standby_start`).
    """
    if argv is None:
        argv = _standby_start()
        if argv is None:  # its parent died, or needed no worker
            return 0
    parser = argparse.ArgumentParser(prog="python -m batchfit.compile.worker_process")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--dataset", required=True, help="a snapshot of the dataset the parent loaded (pickle)")
    parser.add_argument("--outputs", default="{}", help="the optional outputs to pre-compile (JSON)")
    parser.add_argument("--params", default="{}", help="build_model's keyword parameters (JSON)")
    parser.add_argument("--part", choices=sorted(PARTS), default="all", help="what of the entry to compile")
    parser.add_argument("--claims", help="the directory where this worker and the other claim the node functions "
                                         "each compiles, so that none is compiled twice")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(message)s")
    log.setLevel(logging.INFO)  # batchfit's own lines; other libraries' warnings and worse
    logging.captureWarnings(True)
    cache = open_cache(args.cache_dir, trust_shared=True)  # the parent already checked it
    params = json.loads(args.params)
    dataset = pickle.loads(Path(args.dataset).read_bytes())  # written by this worker's parent, the same code
    model = build_model(load_model_file(Path(args.model_file)), dataset, params)
    graphs = SamplerGraphs.of(model)  # still paused (the __main__ block): the graphs live to the end
    key = sampler_key(model, graphs)
    if key != args.key:
        print(json.dumps({"unsupported": f"the model built from {args.model_file} differs between processes "
                                         f"(key {key[:12]} != {args.key[:12]}): for the cached path, build_model "
                                         "must build the same model from the same dataset every time"}))
        return UNSUPPORTED_EXIT
    outputs = json.loads(args.outputs)
    collector.resume()  # the compile's own garbage (numba's IR and types) is collected, the heap so far is not walked
    try:
        with compiling_once(Path(args.claims), cached_by_pytensor) if args.claims else contextlib.nullcontext():
            manifest = build_entry(model, cache, key, graphs, OutputSettings(
                bool(outputs.get("log_likelihood")), bool(outputs.get("posterior_predictive")),
                sensitivity=bool(outputs.get("sensitivity"))), args.part)
    except CachedPathUnsupported as exc:
        print(json.dumps({"unsupported": str(exc)}))
        return UNSUPPORTED_EXIT
    except Exception as exc:
        if not is_damage_error(exc, cache):
            raise  # batchfit's bug: the traceback goes to the parent, which fails the structure with it
        # Not healed nor retried here: the parent heals once all workers are done (see build_in_child).
        print(json.dumps({"damaged": f"{type(exc).__name__}: {exc}"}))
        return DAMAGED_EXIT
    print(json.dumps({"key": key, "manifest": manifest}))
    return 0


if __name__ == "__main__":
    collector.pause()  # the imports and the model live to the end (batchfit.common.collector); main resumes
    quick_exit(main())  # the work is done, its files closed: no interpreter teardown
