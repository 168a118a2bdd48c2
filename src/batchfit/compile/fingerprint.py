"""Content addresses for compiled code: a model's graphs plus the compiling environment.

A cache key (``batchfit.compile.graphs.sampler_key``) combines

* the model's generative graph (:func:`model_fingerprint`: operations, constants, transforms,
  the ranks and dtypes of every ``pm.Data``, and the log densities registered by dispatch for
  ops such as ``pm.CustomDist``, which the graph itself does not show);
* the graphs that are actually compiled (log density and expansion, see :func:`graph_fingerprint`);
* the environment (:func:`environment_fingerprint`): library versions, PyTensor flags, CPU target
  and a digest of batchfit's own source code (:func:`code_digest`), which generates the callbacks.

Data *values* and lengths are not part of it: they are runtime inputs of the compiled
functions, which is what lets one compile serve every dataset.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import version
from typing import Any

import numpy as np

from batchfit import __version__
from batchfit.common.hashing import package_sources, sources_digest
from batchfit.compat.pymc import dispatched_densities
from batchfit.model.imports import is_user_file

LIBRARIES = ("pymc", "pytensor", "numba", "llvmlite", "nutpie", "numpy")


@functools.cache
def environment_fingerprint() -> str:
    """Library versions, PyTensor flags and CPU target: anything that changes generated code."""
    import llvmlite.binding as llvm
    import numba
    import pytensor

    # numba's own choice (numba.core.codegen): the configured name and features when set, the host's
    # otherwise; a generic name sets the features to "" (none), which must not read as "unset".
    features = numba.config.CPU_FEATURES
    llvm_target = (llvm.get_process_triple(), numba.config.CPU_NAME or llvm.get_host_cpu_name(),
                   features if features is not None else llvm.get_host_cpu_features().flatten())
    flags = {
        name: str(getattr(pytensor.config, name))
        for name in ("floatX", "mode", "linker", "optimizer", "optimizer_including",
                     "optimizer_excluding", "numba__fastmath", "numba__cache")
    }
    parts = {
        "batchfit": __version__,
        "batchfit_code": code_digest(),
        "python": sys.version,
        "machine": platform.machine(),
        "libraries": {name: version(name) for name in LIBRARIES},
        "pytensor_flags": flags,
        "llvm_target": llvm_target,
    }
    return hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()


@functools.cache
def code_digest() -> str:
    """sha256 of batchfit's own Python sources.

    batchfit generates the sampler callbacks and builds the graphs it compiles, so any change to
    its code may change compiled code; ``__version__`` alone is not bumped on every change.
    """
    return sources_digest(package_sources())


def describe(value: Any) -> str:
    """A stable text description of an op property, type or constant (no memory addresses)."""
    from pytensor.graph.basic import Variable
    from pytensor.graph.fg import AbstractFunctionGraph
    from pytensor.graph.op import Op
    from pytensor.graph.type import Type

    if value is None or isinstance(value, (str, int, float, bool, complex)):
        return repr(value)
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(map(describe, value)) if isinstance(value, (set, frozenset)) else map(describe, value)
        return f"{type(value).__name__}({','.join(items)})"
    if isinstance(value, Mapping):
        return "{" + ",".join(sorted(f"{describe(k)}:{describe(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.ascontiguousarray(value)
        return f"array({arr.dtype.str},{arr.shape},{hashlib.sha256(arr.tobytes()).hexdigest()})"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, Op):
        return describe_op(value)
    if isinstance(value, Type):
        return f"{type(value).__qualname__}:{value}"
    if isinstance(value, AbstractFunctionGraph):  # inner graphs, mutable or frozen (interned)
        return graph_fingerprint(value.outputs, value.inputs)
    if isinstance(value, Variable):
        return graph_fingerprint([value])
    if isinstance(value, (slice, range)):
        return repr(value)
    if isinstance(value, types.FunctionType):
        return describe_function(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    state = getattr(value, "__dict__", None)
    if state is not None:
        return f"{type(value).__module__}.{type(value).__qualname__}{describe(_public_state(state))}"
    return f"{type(value).__module__}.{type(value).__qualname__}:{value!r}"


def _public_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """An object's attributes that describe it: public ones, and private ones holding arrays.

    Private attributes mostly hold lazily filled caches (``frozendict._hash``), and ``tag`` holds
    annotations that compiling adds to graph nodes (``tag.imported_by``): PyTensor interns
    inner-graph nodes across models, so reading either would make the key depend on what the
    process compiled before. Arrays are data, though, wherever an object keeps them: a fitted
    scipy spline (PyMC's ``SplineWrapper`` op, ``pm.Interpolated``) holds its knots and
    coefficients only in private attributes, and two splines must not share a key.
    """
    return {k: v for k, v in state.items() if k != "tag" and (not k.startswith("_") or _holds_arrays(v))}


def _holds_arrays(value: Any) -> bool:
    """An array, or a tuple or list with one among its items."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(item, np.ndarray) for item in items)


def describe_function(func: types.FunctionType) -> str:
    """A Python function by what it computes: its code, defaults and closure values.

    A name is not enough: ``pm.CustomDist(logp=lambda v, mu: ...)`` registers a closure whose
    code and captured values define the log density, and two model files (or two datasets whose
    ``build_model`` captures a value from the data) can hold lambdas of the same name.
    Plain functions of installed libraries are described by name (their versions are in the
    key); their closures are not, since PyMC wraps the user's function in one.
    """
    name = f"{func.__module__}.{func.__qualname__}"
    if (func.__closure__ is None and not _is_user_code(func)) or func in _OPEN_FUNCTIONS:
        return name  # the second case: a closure that refers to itself
    _OPEN_FUNCTIONS.add(func)
    try:
        cells = tuple(cell.cell_contents for cell in func.__closure__ or () if _cell_is_set(cell))
        return f"{name}[{_describe_code(func.__code__)}|{describe(func.__defaults__)}|{describe(cells)}]"
    finally:
        _OPEN_FUNCTIONS.discard(func)


_OPEN_FUNCTIONS: set[types.FunctionType] = set()


def _is_user_code(func: types.FunctionType) -> bool:
    """A function defined in a model file or another place no library version pins."""
    return is_user_file(func.__code__.co_filename)


def _cell_is_set(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


def _describe_code(code: types.CodeType) -> str:
    """Bytecode, constants (nested code included) and names a code object uses."""
    consts = tuple(_describe_code(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    text = f"{code.co_code.hex()}|{describe(consts)}|{code.co_names}|{code.co_varnames}"
    return hashlib.sha256(text.encode()).hexdigest()


def describe_op(op: Any) -> str:
    """An op by class and properties (``__props__``), or by its state when it declares none.

    Log densities that PyMC attaches to an op class by dispatch (``pm.CustomDist``) are part of
    it: they are compiled, but no graph or property shows them.
    """
    cls = f"{type(op).__module__}.{type(op).__qualname__}"
    props = getattr(op, "__props__", None)
    if props is not None:
        state = {p: getattr(op, p) for p in props}
    else:
        state = _public_state(vars(op))
    densities = dispatched_densities(type(op))
    if densities:
        state = {**state, "__dispatched__": densities}
    return cls + describe(state)


def graph_fingerprint(outputs: Sequence[Any], inputs: Iterable[Any] = ()) -> str:
    """sha256 of a graph's structure: ops, wiring, constants and the types of its root inputs."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import graph_inputs, toposort
    from pytensor.tensor.random.type import RandomType

    outputs = list(outputs)
    position: dict[Any, str] = {var: f"in{i}" for i, var in enumerate(inputs)}
    lines: list[str] = []
    for var in graph_inputs(outputs):
        if var in position:
            continue
        if isinstance(var, Constant):
            desc = f"const {describe(var.type)} {describe(var.data)}"
        elif isinstance(var.type, RandomType):
            desc = f"rng {describe(var.type)}"
        elif isinstance(var, SharedVariable):
            desc = f"shared {var.name} {describe(var.type)}"
        else:
            desc = f"root {var.name} {describe(var.type)}"
        position[var] = f"r{len(lines)}"
        lines.append(desc)
    for n, node in enumerate(toposort(outputs)):
        args = ",".join(position[i] for i in node.inputs)
        lines.append(f"n{n} {describe_op(node.op)}({args})")
        for j, out in enumerate(node.outputs):
            position[out] = f"n{n}.{j}"
    lines.append("out " + ",".join(position[o] for o in outputs))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def model_fingerprint(model: Any) -> str:
    """Structure of a PyMC model: its generative graph, value types, transforms and bounds."""
    rvs = [*model.free_RVs, *model.observed_RVs]
    outputs = [*rvs, *model.deterministics, *model.potentials,
               *(model.rvs_to_values[rv] for rv in model.observed_RVs)]
    extra = {
        "names": [v.name for v in outputs],
        "values": [describe(model.rvs_to_values[rv].type) for rv in model.free_RVs],
        "transforms": [describe(model.rvs_to_transforms.get(rv)) for rv in model.free_RVs],
        "check_bounds": model.check_bounds,
    }
    digest = hashlib.sha256(graph_fingerprint(outputs).encode() + describe(extra).encode())
    return digest.hexdigest()



def structure_of(model: Any) -> str:
    """A model's structure id (its fingerprint), memoised on the model: a job asks once per dataset."""
    if getattr(model, "_batchfit_fingerprint", None) is None:
        model._batchfit_fingerprint = model_fingerprint(model)
    return model._batchfit_fingerprint
