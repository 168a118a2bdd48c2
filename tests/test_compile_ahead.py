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
