"""Where a cold compile's CPU goes: the log density's callback by level, the walk back's reach, nutpie's compile.

    python benchmarks/compile_profile.py [--models NAME ...]

For each model (default: the held-out models of benchmarks/heldout_models.py; corpus names work too),
three fresh processes on empty caches, each timed in CPU seconds of its own (``time.process_time``;
numba compiles on one thread), so that other work on a shared machine hardly moves the figures:

* levels: PyTensor's rewrite of the log density and its gradient, then the logp callback's compile
  (`batchfit.compile.callbacks.make_callback`), split by numba's compile events into the node
  functions (each compiled while the graph's function is typed, kernels included), the graph's
  own function (typing, lowering and LLVM over the whole linked graph) and the callback's own
  level (the same again around it, and its cache entry);
* walk: the second worker's walk back over the whole graph (`batchfit.compile.ahead`, as if the
  other worker never came), then the same callback's compile: the node functions it still
  compiles were typed otherwise by the walk (work lost beside the other worker); 0 is exact;
* nutpie: ``nutpie.compile_pymc_model`` of the same model (both callbacks, as a user meets it).

The levels say how much of the log density's worker the walk can take over (the node functions)
and how much it cannot (the two levels above them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _model(config_path: str):
    from batchfit.config import load_config
    from batchfit.data.dataset import load_dataset
    from batchfit.data.discovery import discover_datasets
    from batchfit.model.model_file import build_model, load_model_file

    config = load_config(config_path)
    datasets = discover_datasets(config.data_sources)
    dataset_id = next(iter(datasets))
    return build_model(load_model_file(config.model), load_dataset(dataset_id, datasets[dataset_id]))


def child(mode: str, config_path: str) -> None:
    """One measurement in this (fresh) process, on empty caches; prints a JSON line."""
    root = Path(tempfile.mkdtemp(prefix="compile-profile-"))
    if mode == "nutpie":
        os.environ["PYTENSOR_FLAGS"] = f"base_compiledir={root}"
        import nutpie

        model = _model(config_path)
        start = time.process_time()
        nutpie.compile_pymc_model(model)
        print(json.dumps({"nutpie": time.process_time() - start}))
        return

    from batchfit.cache.store import open_cache

    cache = open_cache(root)  # before numba and PyTensor load: their caches go there
    from numba.core import event

    from batchfit.compat.pytensor import graph_function
    from batchfit.compile.ahead import compile_back_to_meet
    from batchfit.compile.callbacks import make_callback
    from batchfit.compile.graphs import SamplerGraphs, compile_sampler_functions, sampler_key

    model = _model(config_path)
    graphs = SamplerGraphs.of(model)
    key = sampler_key(model, graphs)
    start = time.process_time()
    spec, functions = compile_sampler_functions(model, graphs, ("logp",))
    out = {"rewrite": time.process_time() - start}
    if mode == "walk":
        start = time.process_time()
        out["walked"] = compile_back_to_meet(functions["logp"].maker.fgraph, lambda: False)
        out["walk"] = time.process_time() - start

    stack: list[float] = []
    compiled: list[tuple[int, str, float]] = []  # depth, qualified name, inclusive CPU

    class Compiles(event.Listener):
        def on_start(self, ev):
            stack.append(time.process_time())

        def on_end(self, ev):
            func = ev.data["dispatcher"].py_func
            name = f"{func.__module__}:{func.__qualname__}"
            compiled.append((len(stack) - 1, name, time.process_time() - stack.pop()))

    event.register("numba:compile", Compiles())
    start = time.process_time()
    make_callback(spec, "logp", key, cache, graph_function(functions["logp"].vm.jit_fn))
    out["callback"] = time.process_time() - start
    graph = sum(cpu for depth, name, cpu in compiled if depth == 0 and name.endswith("numba_funcified_fgraph"))
    nodes = [(name, cpu) for depth, name, cpu in compiled if depth == 1 and name.startswith("pytensor.")]
    node_cpu = sum(cpu for _, cpu in nodes)
    out.update(node_functions=node_cpu, n_node_functions=len(nodes), graph_level=graph - node_cpu,
               callback_level=out["callback"] - graph)
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", help="held-out or corpus case names (default: every held-out model)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests"))
    import heldout_models
    from common import RESULTS, child_env, fresh_dir, load_average, machine_line, run_tracked
    from testkit import parity_corpus

    cases = {**heldout_models.cases(), **parity_corpus.cases()}
    names = args.models or list(heldout_models.cases())
    out = fresh_dir(RESULTS / "compile_profile")
    print(f"# compile_profile: {machine_line()}; load average {load_average()}")
    print(f"{'model':40s} {'rewrite':>7s} {'nodes':>6s} {'(n)':>4s} {'graph':>6s} {'callback':>8s} {'walk':>6s} "
          f"{'again':>6s} {'(n)':>4s} {'nutpie':>7s}   (CPU seconds)")
    for name in names:
        config = parity_corpus.write_case(cases[name], out / "cases", out / "unused-cache")
        results = {}
        for mode in ("levels", "walk", "nutpie"):
            r = run_tracked([sys.executable, __file__, "--child", mode, str(config)], env=child_env(),
                            cwd=config.parent).check()
            results[mode] = r.json()
        levels, walk = results["levels"], results["walk"]
        print(f"{name:40s} {levels['rewrite']:7.1f} {levels['node_functions']:6.1f} {levels['n_node_functions']:4d} "
              f"{levels['graph_level']:6.1f} {levels['callback_level']:8.1f} {walk['walk']:6.1f} "
              f"{walk['node_functions']:6.1f} {walk['n_node_functions']:4d} {results['nutpie']['nutpie']:7.1f}",
              flush=True)
    print(f"load average at the end {load_average()}")


if __name__ == "__main__":
    main()
