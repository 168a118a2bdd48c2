"""Content addresses for compiled code: a model's graph structure plus the compiling environment.

Two models get the same key exactly when their generative graphs have the same operations,
constants, transforms and data types (ranks and dtypes of every ``pm.Data``), compiled by the
same library versions, PyTensor flags and CPU. Data *values* and lengths are not part of the
key: they are runtime inputs of the compiled functions, which is what lets one compile serve
every dataset.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import version
from typing import Any

import numpy as np

from batchfit import __version__

LIBRARIES = ("pymc", "pytensor", "numba", "llvmlite", "nutpie", "numpy")


@functools.cache
def environment_fingerprint() -> str:
    """Library versions, PyTensor flags and CPU target: anything that changes generated code."""
    import llvmlite.binding as llvm
    import numba
    import pytensor

    llvm_target = (llvm.get_process_triple(), numba.config.CPU_NAME or llvm.get_host_cpu_name(),
                   numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten())
    flags = {
        name: str(getattr(pytensor.config, name))
        for name in ("floatX", "mode", "linker", "optimizer", "optimizer_including",
                     "optimizer_excluding", "numba__fastmath", "numba__cache")
    }
    parts = {
        "batchfit": __version__,
        "python": sys.version,
        "machine": platform.machine(),
        "libraries": {name: version(name) for name in LIBRARIES},
        "pytensor_flags": flags,
        "llvm_target": llvm_target,
    }
    return hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()


def describe(value: Any) -> str:
    """A stable text description of an op property, type or constant (no memory addresses)."""
    from pytensor.graph.basic import Variable
    from pytensor.graph.fg import FunctionGraph
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
    if isinstance(value, FunctionGraph):
        return graph_fingerprint(value.outputs, value.inputs)
    if isinstance(value, Variable):
        return graph_fingerprint([value])
    if isinstance(value, (slice, range)):
        return repr(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    state = getattr(value, "__dict__", None)
    if state is not None:  # public state only: private attributes hold lazily filled caches
        public = {k: v for k, v in state.items() if not k.startswith("_")}
        return f"{type(value).__module__}.{type(value).__qualname__}{describe(public)}"
    return f"{type(value).__module__}.{type(value).__qualname__}:{value!r}"


def describe_op(op: Any) -> str:
    """An op by class and properties (``__props__``), or by its state when it declares none."""
    cls = f"{type(op).__module__}.{type(op).__qualname__}"
    props = getattr(op, "__props__", None)
    if props is not None:
        return cls + describe({p: getattr(op, p) for p in props})
    state = {k: v for k, v in vars(op).items() if not k.startswith("_")}
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

