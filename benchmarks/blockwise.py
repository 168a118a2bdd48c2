"""Benchmark: a 50-group, 4-dimensional batched MvNormal under numba vs C vs Python.

Measures, for the log density and its gradient w.r.t. all value variables:

* evaluation time (median of many calls) with ``mode="NUMBA"`` (numba backend, with
  ``batchfit.numba_ops.linalg`` registered), PyTensor's C backend and ``mode="FAST_COMPILE"`` (the
  Python fallback). Note: in PyTensor 3.3 ``mode="FAST_RUN"`` resolves to the *numba*
  linker unless ``config.linker`` is set, so the C backend is requested explicitly as
  ``mode="CVM"`` (= ``Mode(linker="cvm", optimizer="fast_run")``, FAST_RUN's rewrites with
  C thunks). Comparing NUMBA with plain "FAST_RUN" would time numba against itself;
* compile time of the numba version in a fresh process with an empty cache directory
  (cold) and in another fresh process reusing that directory (warm). Compile time includes
  the first call, since numba compiles lazily.

Run from the repository root::

    .venv/bin/python benchmarks/blockwise.py            # full run
    .venv/bin/python benchmarks/blockwise.py --quick    # fewer evaluations

The figures are printed as one table, with the date, machine and versions, followed by what
each backend runs (see :func:`describe_function`): how many nodes are C code, Python
``perform`` or numba, and for every ``Blockwise`` node its batch shape and how its batch is
looped. A JSON copy goes to ``benchmarks/results/`` (git-ignored). The compile caches live in
a temporary directory, so nothing is written to the repository besides that file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

N_GROUPS, DIM, N_OBS = 50, 4, 20


# --------------------------------------------------------------------------------------------
# The benchmark model (built in child processes, after PYTENSOR_FLAGS is set)
# --------------------------------------------------------------------------------------------


def build_model(seed: int = 0):
    """Per-group means and covariances ``diag(sd_g) C_g diag(sd_g)`` (batched LKJ correlation),
    ``N_OBS`` observations of every group: likelihood = one MvNormal with a batch of 50
    4x4 covariance matrices (Blockwise Cholesky, triangular solves, and their gradients)."""
    import numpy as np
    import pymc as pm

    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        corr = pm.LKJCorr("corr", n=DIM, eta=2.0, shape=(N_GROUPS, DIM, DIM))
        sd = pm.HalfNormal("sd", 2.0, shape=(N_GROUPS, DIM))
        mu = pm.Normal("mu", 0.0, 3.0, shape=(N_GROUPS, DIM))
        cov = sd[:, :, None] * corr * sd[:, None, :]
        pm.MvNormal("y", mu=mu, cov=cov, observed=rng.normal(size=(N_OBS, N_GROUPS, DIM)))
    return model


def _logp_dlogp(model):
    from batchfit.numba_ops.nopython import model_graphs

    outputs, inputs = model_graphs(model)
    return outputs, inputs


def _point_args(model, inputs, seed: int = 1):
    import numpy as np

    rng = np.random.default_rng(seed)
    point = model.initial_point()
    return [point[v.name] + rng.normal(scale=0.2, size=point[v.name].shape) for v in inputs]


def child_compile() -> dict:
    """Compile (and first-call) the numba logp+gradient; report seconds."""
    t_start = time.perf_counter()
    import pytensor

    import batchfit.numba_ops.linalg  # noqa: F401
    from batchfit.numba_ops.nopython import fallbacks_in_function

    t_imported = time.perf_counter()
    model = build_model()
    outputs, inputs = _logp_dlogp(model)
    t_graph = time.perf_counter()
    fn = pytensor.function(inputs, outputs, mode="NUMBA")
    args = _point_args(model, inputs)
    fn(*args)
    t_compiled = time.perf_counter()
    fallbacks = [str(f) for f in fallbacks_in_function(fn)]
    return {
        "import_s": t_imported - t_start,
        "graph_s": t_graph - t_imported,
        "compile_s": t_compiled - t_graph,
        "fallbacks": fallbacks,
    }


def _median_call_time(fn, args, budget_s: float, min_calls: int, max_calls: int) -> tuple[float, int]:
    """Median wall time of single calls, over as many calls as fit in ``budget_s``."""
    import statistics

    for _ in range(3):  # warm up
        fn(*args)
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def _blockwise_loop(node) -> str:
    """How a VM backend (C or Python) runs a Blockwise node, read from the gufunc PyTensor built for it.

    ``Blockwise`` has no C code in PyTensor 3.3 (its ``c_code`` raises NotImplementedError), so
    every VM backend runs ``Blockwise.perform``: a NumPy/SciPy gufunc over the whole batch when
    the core op names one (``gufunc_spec``: det, slogdet, inv, matmul), otherwise a Python loop
    calling the core op's thunk once per batch element (``_vectorize_node_perform``).
    """
    spec = node.op.gufunc_spec or getattr(node.op.core_op, "gufunc_spec", None)
    if spec is not None:
        return f"one {spec[0]} call for the whole batch"
    gufunc = node.tag.gufunc  # set by Blockwise.prepare_node when the thunk was made
    core_thunk = gufunc.__kwdefaults__["core_thunk"]
    core = "C thunk" if hasattr(core_thunk, "cthunk") else "Python perform"
    return f"Python loop, one {type(node.op.core_op).__name__} {core} per batch element"


def _blockwise_calls(fn, args, nodes, repeats: int = 5) -> dict:
    """Output shape and median seconds of each Blockwise node over ``repeats`` calls of ``fn``.

    ``Blockwise.perform`` looks up ``node.tag.gufunc`` at every call, so wrapping it records
    shapes and times without changing what runs; the wrappers are removed afterwards.
    """
    import statistics

    seen: dict = {node: {"shape": None, "times": []} for node in nodes}
    originals = {node: node.tag.gufunc for node in nodes}

    def recording(node, gufunc):
        def record(*inputs):
            start = time.perf_counter()
            outputs = gufunc(*inputs)
            seen[node]["times"].append(time.perf_counter() - start)
            seen[node]["shape"] = tuple(int(d) for d in outputs[0].shape)
            return outputs
        return record

    try:
        for node, gufunc in originals.items():
            node.tag.gufunc = recording(node, gufunc)
        for _ in range(repeats):
            fn(*args)
    finally:
        for node, gufunc in originals.items():
            node.tag.gufunc = gufunc
    return {node: (v["shape"], statistics.median(v["times"])) for node, v in seen.items()}


def describe_function(fn, args) -> dict:
    """What a compiled logp+gradient function runs: nodes per implementation and every Blockwise node.

    For the VM linkers (C, Python) each node's thunk says whether it is C code (``cthunk``) or a
    Python ``perform``; each Blockwise node is listed with its batch shape at ``args`` and how its
    batch is looped. The numba linker compiles the whole graph into one function; only
    object-mode fallbacks would leave it.
    """
    from collections import Counter

    import numpy as np
    from pytensor.link.numba.linker import NumbaLinker
    from pytensor.tensor.blockwise import Blockwise, BlockwiseWithCoreShape

    from batchfit.numba_ops.nopython import fallbacks_in_function

    fgraph = fn.maker.fgraph
    if isinstance(fn.maker.linker, NumbaLinker):
        nodes = fgraph.toposort()
        blockwise = [str(n.op) for n in nodes if isinstance(n.op, Blockwise | BlockwiseWithCoreShape)]
        fallbacks = [str(f) for f in fallbacks_in_function(fn)]
        return {"linker": "numba", "nodes": {"numba nopython": len(nodes) - len(fallbacks),
                                              "numba object mode": len(fallbacks)},
                "blockwise": [{"op": op, "runs": "compiled loop inside the one numba function"} for op in blockwise],
                "fallbacks": fallbacks, "per_element_python_calls": 0}
    vm = fn.vm
    kinds = Counter("C" if hasattr(thunk, "cthunk") else "Python perform" for thunk in vm.thunks)
    blockwise = [node for node in vm.nodes if isinstance(node.op, Blockwise)]
    measured = _blockwise_calls(fn, args, blockwise)
    rows, calls = [], 0
    for node in blockwise:
        shape, seconds = measured[node]
        batch = shape[: node.op.batch_ndim(node)]
        runs = _blockwise_loop(node)
        if runs.startswith("Python loop"):
            calls += int(np.prod(batch))
        rows.append({"op": str(node.op), "batch": batch, "output_shape": shape, "median_s": seconds, "runs": runs})
    return {"linker": type(fn.maker.linker).__name__, "nodes": dict(kinds), "blockwise": rows,
            "fallbacks": [], "per_element_python_calls": calls}


def child_evaluate(budget_s: float) -> dict:
    """Median logp+gradient evaluation time under the three backends."""
    import warnings

    import numpy as np
    import pytensor

    import batchfit.numba_ops.linalg  # noqa: F401

    model = build_model()
    outputs, inputs = _logp_dlogp(model)
    args = _point_args(model, inputs)
    results: dict[str, dict] = {}
    reference = None
    from pytensor.compile.mode import Mode

    c_mode = Mode(linker="cvm", optimizer="fast_run")  # what FAST_RUN meant before numba became the default
    for label, mode in (
        ("numba", "NUMBA"),
        ("c", c_mode),
        ("python", "FAST_COMPILE"),
        ("fast_run", "FAST_RUN"),  # PyTensor 3.3 default: the numba linker again
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn = pytensor.function(inputs, outputs, mode=mode)
        fn.trust_input = True
        values = fn(*args)
        if reference is None:
            reference = values
        max_rel = max(
            float(np.max(np.abs(v - r) / (np.abs(r) + 1e-12))) for v, r in zip(values, reference, strict=True)
        )
        median, calls = _median_call_time(fn, args, budget_s, min_calls=20, max_calls=200_000)
        results[label] = {"median_s": median, "calls": calls, "max_rel_diff_vs_numba": max_rel,
                          "runs": describe_function(fn, args)}
    return results


# --------------------------------------------------------------------------------------------
# Parent: fresh processes, table
# --------------------------------------------------------------------------------------------


#: Thread-count variables of the BLAS libraries NumPy, SciPy and numba's LAPACK calls may use.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _run_child(kind: str, cache_dir: Path, extra: list[str] = (), blas_threads: int | None = None) -> dict:
    env = dict(os.environ)
    if blas_threads is not None:
        env.update(dict.fromkeys(BLAS_THREAD_VARS, str(blas_threads)))
    env["PYTENSOR_FLAGS"] = f"base_compiledir={cache_dir}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child '{kind}' failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter evaluation budget")
    parser.add_argument("--budget", type=float, default=None, help="seconds of calls per backend")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="set OPENBLAS/OMP/MKL_NUM_THREADS in the evaluating process (default: inherit); "
                             "1 keeps SciPy's small LAPACK calls from waiting on BLAS worker threads")
    parser.add_argument("--child", choices=["compile", "evaluate"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget = args.budget if args.budget is not None else (1.0 if args.quick else 4.0)

    if args.child == "compile":
        print(json.dumps(child_compile()))
        return 0
    if args.child == "evaluate":
        print(json.dumps(child_evaluate(budget)))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="batchfit-bench-blockwise-"))
    try:
        cache = tmp / "cache"
        cold = _run_child("compile", cache)
        warm = _run_child("compile", cache)
        evals = _run_child("evaluate", cache, ["--budget", str(budget)], blas_threads=args.blas_threads)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    numba_t, c_t, py_t = (evals[k]["median_s"] for k in ("numba", "c", "python"))
    rows = [
        ("logp+grad, numba (NUMBA)", _fmt_time(numba_t), "1.00", f"{evals['numba']['calls']} calls"),
        (
            "logp+grad, C (FAST_RUN rewrites, linker=cvm)",
            _fmt_time(c_t),
            f"{c_t / numba_t:.2f}",
            f"{evals['c']['calls']} calls, max rel diff {evals['c']['max_rel_diff_vs_numba']:.1e}",
        ),
        (
            "logp+grad, Python (FAST_COMPILE)",
            _fmt_time(py_t),
            f"{py_t / numba_t:.1f}",
            f"{evals['python']['calls']} calls, max rel diff {evals['python']['max_rel_diff_vs_numba']:.1e}",
        ),
        (
            'logp+grad, mode="FAST_RUN" (= numba in PyTensor 3.3)',
            _fmt_time(evals["fast_run"]["median_s"]),
            f"{evals['fast_run']['median_s'] / numba_t:.2f}",
            f"{evals['fast_run']['calls']} calls, same linker as NUMBA",
        ),
        (
            "numba compile, cold (empty cache)",
            _fmt_time(cold["compile_s"]),
            "1.00",
            f"process {cold['process_wall_s']:.1f} s",
        ),
        (
            "numba compile, warm (cached)",
            _fmt_time(warm["compile_s"]),
            f"{warm['compile_s'] / cold['compile_s']:.3f}",
            f"process {warm['process_wall_s']:.1f} s",
        ),
    ]
    title = (
        f"Batched MvNormal: {N_GROUPS} groups x {DIM}-dim covariance, {N_OBS} obs/group; "
        f"logp + gradient (median per call)"
    )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("case", "time", "ratio", "notes")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    sys.path.insert(0, str(REPO / "benchmarks"))
    from common import load_average, machine_line

    blas = {v: os.environ[v] for v in BLAS_THREAD_VARS if v in os.environ}
    if args.blas_threads is not None:
        blas = dict.fromkeys(BLAS_THREAD_VARS, str(args.blas_threads))
    print(f"# blockwise: {machine_line()}; load average {load_average()}; BLAS threads: {blas or 'library default'}")
    print(title)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    print(
        f"ratios: time relative to numba (rows 1-4) / to the cold compile (rows 5-6); "
        f"C/numba = {c_t / numba_t:.2f} (>= 1 means numba is no slower than C)"
    )
    print(f"numba fallbacks: {cold['fallbacks'] or 'none'}")
    for label in ("numba", "c", "python"):
        runs = evals[label]["runs"]
        nodes = ", ".join(f"{n} {kind}" for kind, n in runs["nodes"].items())
        print(f"\nwhat the {label} backend runs ({runs['linker']}): {nodes}; "
              f"{runs['per_element_python_calls']} per-batch-element Python calls per evaluation")
        for row in runs["blockwise"]:
            if "batch" in row:
                print(f"  {row['op']}: output {'x'.join(map(str, row['output_shape']))} "
                      f"(batch {'x'.join(map(str, row['batch']))}), {_fmt_time(row['median_s'])}; {row['runs']}")
            else:
                print(f"  {row['op']}: {row['runs']}")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "blockwise.json"
    out.write_text(
        json.dumps(
            {
                "model": {"groups": N_GROUPS, "dim": DIM, "obs_per_group": N_OBS},
                "evaluate": evals,
                "compile_cold": cold,
                "compile_warm": warm,
                "blas_threads": args.blas_threads,
                "python": sys.version,
                "machine": platform.machine(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
            indent=2,
        )
    )
    print(f"written: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
