"""The second compile worker's head start (`batchfit.compile.ahead`): the node functions it compiles
are the very entries the log density's compile then loads, and the walk stops where it should."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from testkit import HIERARCHICAL, table

# A fresh process: PyTensor reads its compile directory (the cache's) when imported.
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from batchfit.cache.store import open_cache
    cache = open_cache(sys.argv[1])
    from numba.core import event
    from batchfit.compat.pytensor import graph_function
    from batchfit.compile.ahead import compile_back_to_meet
    from batchfit.compile.callbacks import make_callback
    from batchfit.compile.graphs import SamplerGraphs, compile_sampler_functions, sampler_key
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    model = build_model(load_model_file(Path(sys.argv[2])), load_dataset("d", Path(sys.argv[3])))
    graphs = SamplerGraphs.of(model)
    key = sampler_key(model, graphs)
    spec, functions = compile_sampler_functions(model, graphs, ("logp",))
    fgraph = functions["logp"].maker.fgraph
    out = {"stopped_at_once": compile_back_to_meet(fgraph, lambda: True)}
    out["walked"] = compile_back_to_meet(fgraph, lambda: False)

    compiled = []

    class Compiles(event.Listener):
        def on_start(self, ev):
            func = ev.data["dispatcher"].py_func
            compiled.append(f"{func.__module__}:{func.__qualname__}")

        def on_end(self, ev):
            pass

    event.register("numba:compile", Compiles())
    make_callback(spec, "logp", key, cache, graph_function(functions["logp"].vm.jit_fn))
    out["compiled_by_the_callback"] = compiled
    # every node function is in the cache now, not by this walk's doing: the other worker's
    out["walked_again"] = compile_back_to_meet(fgraph, lambda: False)
    print(json.dumps(out))
""")


# Values in other layouts than C: the transposed design matrix of the gradient (F), the slopes' column
# views (any), the reductions a fused elemwise node returns squeezed: their node functions are typed as
# the graph's function passes them only if the walk learns those layouts (`ArgumentTypes`).
DESIGN_MATRIX = textwrap.dedent("""
    import pymc as pm
    import pytensor.tensor as pt


    def build_model(data):
        with pm.Model(coords={"groups": data.coords["group"]}) as model:
            x = pm.Data("x", data["x"])
            group = pm.Data("group", data["group"])
            y = pm.Data("y", data["y"])
            X = pt.stack([x, x**2], axis=1)
            beta = pm.Normal("beta", 0.0, 1.0, shape=2)
            slopes = pm.Normal("slopes", 0.0, 1.0, shape=(2, 2))
            a = pm.Normal("a", 0.0, 1.0, dims="groups")
            mu = a[group] + X @ beta + (X @ slopes.T)[:, 0] * (X @ slopes)[:, 1]
            pm.Normal("y_obs", mu, pm.HalfNormal("sigma", 1.0), observed=y, shape=x.shape)
        return model
""")


@pytest.mark.parametrize("model", ["hierarchical", "design-matrix"])
def test_the_walk_compiles_what_the_log_densitys_compile_then_loads(tmp_path, model):
    data = tmp_path / "d.csv"
    table(1, 40, 4).to_csv(data, index=False)
    model_file = HIERARCHICAL if model == "hierarchical" else tmp_path / "model.py"
    if model != "hierarchical":
        model_file.write_text(DESIGN_MATRIX)
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cache"), str(model_file), str(data)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["stopped_at_once"] == 0  # the other worker done: nothing compiled
    assert out["walked"] > 10  # the whole graph, from its last node back
    # The callback's compile compiled the graph's own function and numba's helpers of the callback,
    # but none of the node functions PyTensor's linker makes: each was loaded as the walk wrote it.
    pytensor_compiles = [name for name in out["compiled_by_the_callback"] if name.startswith("pytensor.")]
    assert pytensor_compiles == ["pytensor.link.utils:numba_funcified_fgraph"], out["compiled_by_the_callback"]
    assert out["walked_again"] == 0  # stops at the first node found written by another


# Two processes compile the same log density at once, each in the graph's own order, as the two
# workers of a compile job meet: with their claims (`compiling_once`) no node function is compiled by both.
RACE = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from batchfit.cache.store import open_cache
    cache = open_cache(sys.argv[1])
    from numba.core import event
    from batchfit.compat.numba import compiling_once
    from batchfit.compat.pytensor import cache_key_of, cached_by_pytensor, graph_function
    from batchfit.compile.callbacks import make_callback
    from batchfit.compile.graphs import SamplerGraphs, compile_sampler_functions, sampler_key
    from batchfit.data.dataset import load_dataset
    from batchfit.model.model_file import build_model, load_model_file

    model = build_model(load_model_file(Path(sys.argv[2])), load_dataset("d", Path(sys.argv[3])))
    graphs = SamplerGraphs.of(model)
    key = sampler_key(model, graphs)
    spec, functions = compile_sampler_functions(model, graphs, ("logp",))
    print("ready", flush=True)
    while not Path(sys.argv[5]).exists():
        time.sleep(0.01)
    compiled = []

    class Compiles(event.Listener):  # each node function compiled, with the types it was compiled for
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            function = ev.data["dispatcher"]
            if cached_by_pytensor(function.py_func):
                compiled.append(f"{cache_key_of(function)} {ev.data['args']}")

    event.register("numba:compile", Compiles())
    with compiling_once(Path(sys.argv[4]), cached_by_pytensor):
        make_callback(spec, "logp", key, cache, graph_function(functions["logp"].vm.jit_fn))
    print(json.dumps(compiled))
""")


def test_two_processes_compiling_one_graph_at_once_compile_each_node_function_once(tmp_path):
    data = tmp_path / "d.csv"
    table(1, 40, 4).to_csv(data, index=False)
    go = tmp_path / "go"
    args = [str(tmp_path / "cache"), str(HIERARCHICAL), str(data), str(tmp_path / "claims"), str(go)]
    procs = [subprocess.Popen([sys.executable, "-c", RACE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
    go.touch()
    outs = [proc.communicate(timeout=600) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-3000:] for _, err in outs]
    first, second = (set(json.loads(out.strip().splitlines()[-1])) for out, _ in outs)
    assert first | second, "neither process compiled a node function"
    assert not first & second, f"compiled by both: {sorted(first & second)}"
    assert not any((tmp_path / "claims").iterdir()), "a claim was left behind"
