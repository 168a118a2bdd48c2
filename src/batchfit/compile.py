"""Compile a PyMC model into nutpie sampler functions once, cache them on disk, reuse them for every dataset.

nutpie drives the sampler through two C callbacks, ``logp`` (log density and gradient) and
``expand`` (the draw's full set of variables). nutpie's own callbacks close over the data arrays
and the compiled PyTensor function, which numba refuses to cache. batchfit generates its own
callbacks instead, whose only inputs are nutpie's arguments and a *user-data record*: an int64
array holding the number of parameters, the number of expanded values, and for each data input
its address and shape. Nothing dataset-specific is compiled in, so

* the callbacks are cached by numba under a content key (see :mod:`batchfit.fingerprint`), and
  a later process loads the machine code without compiling anything;
* one compiled pair serves every dataset of the same structure, whatever its lengths: datasets
  differ only in the record.

A miss compiles in a child process (``python -m batchfit.compile``): the parent then loads the
entry exactly like any later process would, so every fit runs the very same machine code (code
JIT-compiled in-process can differ in the last bit from code emitted for the cache), and the
parent's memory never holds an LLVM compile.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.cache import (
    CacheDir,
    CorruptEntry,
    compile_lock,
    damage_message,
    heal,
    is_damage_error,
    read_entry,
    record_event,
    register_wrapper,
    remove_entry,
    retry_after_healing,
    write_entry,
)
from batchfit.errors import BatchfitError, ModelContractError
from batchfit.extras import warm_extras
from batchfit.fingerprint import environment_fingerprint, graph_fingerprint, model_fingerprint
from batchfit.modelfile import swappable_inputs

log = logging.getLogger("batchfit")

HEADER = 2  # record[0] = number of parameters, record[1] = number of expanded values


@dataclass(frozen=True)
class Slot:
    """One data input of the compiled functions: a ``pm.Data`` container or a dimension length."""

    kind: str  # "data", "dim", or "shape" (the runtime shape of a free parameter)
    name: str
    ndim: int
    dtype: str


@dataclass(frozen=True)
class WrapperSpec:
    """What the generated callbacks read from the user-data record, in the compiled argument order."""

    logp: tuple[Slot, ...]
    expand: tuple[Slot, ...]

    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every slot once, in record order."""
        return tuple(dict.fromkeys((*self.logp, *self.expand)))

    def offsets(self) -> dict[Slot, int]:
        """Position of each slot's address in the record; its shape follows."""
        offsets, pos = {}, HEADER
        for slot in self.slots:
            offsets[slot] = pos
            pos += 1 + slot.ndim
        return offsets

    def record_length(self) -> int:
        return HEADER + sum(1 + s.ndim for s in self.slots)

    def to_json(self) -> dict[str, Any]:
        return {k: [dataclasses.asdict(s) for s in getattr(self, k)] for k in ("logp", "expand")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WrapperSpec:
        return cls(*(tuple(Slot(**s) for s in data[k]) for k in ("logp", "expand")))


def _slot_reads(slots: Sequence[Slot], offsets: dict[Slot, int]) -> tuple[list[str], str]:
    """Source lines turning record entries into arrays, and the argument list for the inner call."""
    lines = []
    for i, slot in enumerate(slots):
        pos = offsets[slot]
        dims = "".join(f"rec[{pos + 1 + d}], " for d in range(slot.ndim))
        lines.append(f"        a{i} = carray(as_ptr(rec[{pos}]), ({dims}), {np.dtype(slot.dtype).name}_)")
    return lines, "".join(f", a{i}" for i in range(len(slots)))


def wrapper_source(spec: WrapperSpec, kind: str) -> str:
    """Python source of the logp or expand callback for nutpie's C interface."""
    offsets = spec.offsets()
    reads, args = _slot_reads(getattr(spec, kind), offsets)
    size = spec.record_length()
    if kind == "logp":
        head = [
            "def batchfit_logp(dim, x_, out_, logp_, rec_):",
            f"    rec = carray(rec_, ({size},), int64_)",
            "    n = rec[0]",
            "    if dim != n:",
            "        return -1",
            "    try:",
            "        x = carray(x_, (n,))",
            "        out = carray(out_, (n,))",
            "        logp = carray(logp_, ())",
        ]
        tail = [
            f"        value, grad = inner(x{args})",
            "        logp[()] = value",
            "        out[:] = grad",
            "        if not np.isfinite(value):",
            "            return 4",
            "        if not np.all(np.isfinite(out)):",
            "            return 3",
            "    except Exception:",
            "        return 1",
            "    return 0",
        ]
    else:
        head = [
            "def batchfit_expand(dim, expanded, x_, out_, rec_):",
            f"    rec = carray(rec_, ({size},), int64_)",
            "    n = rec[0]",
            "    m = rec[1]",
            "    if dim != n or expanded != m:",
            "        return -1",
            "    try:",
            "        x = carray(x_, (n,))",
            "        out = carray(out_, (m,))",
        ]
        tail = [
            f"        (values,) = inner(x{args})",
            "        out[:] = values",
            "    except Exception:",
            "        return -2",
            "    return 0",
        ]
    return "\n".join([*head, *reads, *tail]) + "\n"


@functools.cache
def _as_ptr_intrinsic() -> Any:
    """A numba intrinsic turning an integer address into a void pointer (built once, lazily)."""
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def as_ptr(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)

        return types.voidptr(address), codegen

    return as_ptr


def _missing_inner(*args: Any) -> None:
    """Stands in for the PyTensor function when a callback should load from the cache.

    numba cannot compile a call to it, so a callback that misses the cache fails loudly
    instead of silently compiling: the caller then rebuilds the entry.
    """
    raise RuntimeError("batchfit callback was not found in the cache")


def _callback(spec: WrapperSpec, kind: str, key: str, cache: CacheDir, inner: Callable) -> Any:
    """Create the numba cfunc for one callback, loading it from the cache when present."""
    import numba
    from numba.core import types

    source = wrapper_source(spec, kind)
    env: dict[str, Any] = {
        "__name__": __name__,
        "np": np,
        "carray": numba.carray,
        "as_ptr": _as_ptr_intrinsic(),
        "inner": inner,
        **{f"{np.dtype(s.dtype).name}_": np.dtype(s.dtype) for s in spec.slots},
        "int64_": np.dtype("int64"),
    }
    exec(compile(source, f"batchfit_{kind}", "exec"), env)
    py_func = env[f"batchfit_{kind}"]
    register_wrapper(py_func, key, cache)
    f64 = types.CPointer(types.double)
    if kind == "logp":
        sig = types.int64(types.uint64, f64, f64, f64, types.voidptr)
    else:
        sig = types.int64(types.uint64, types.uint64, f64, f64, types.voidptr)
    if inner is _missing_inner:
        return _load_cfunc(py_func, sig)
    return numba.cfunc(sig, cache=True)(py_func)


def _load_cfunc(py_func: Callable, sig: Any) -> Any:
    """Load a cached cfunc without compiling anything.

    ``numba.cfunc(..., cache=True)`` first initializes numba's whole typing and lowering
    registry (about half a second per process) although loading machine code needs none of
    it; this goes straight to the cache and fails if the entry is not there.
    """
    from numba.core.ccallback import CFunc
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import nrt

    cfunc = CFunc(py_func, (sig.args, sig.return_type), {}, {})
    cfunc.enable_caching()
    with global_compiler_lock:
        context = cfunc._targetdescr.target_context
        nrt.rtsys.initialize(context)  # the memory-management symbols the machine code links to
        cres = cfunc._cache._load_overload(cfunc._sig, context)
    if cres is None:
        raise LookupError("the callback is not in numba's cache index")
    cfunc._library = cres.library
    cfunc._wrapper_name = cres.fndesc.llvm_cfunc_wrapper_name
    cfunc._wrapper_address = cres.library.get_pointer_to_function(cfunc._wrapper_name)
    cfunc._cache_hits += 1
    return cfunc


def _slot_of(var: Any, model: Any) -> Slot:
    """Classify a shared input of the compiled functions as data or a dimension length."""
    for name, length in model.dim_lengths.items():
        if length is var:
            return Slot("dim", name, var.type.ndim, var.type.dtype)
    if var.name in model.named_vars and model.named_vars[var.name] is var:
        return Slot("data", var.name, var.type.ndim, var.type.dtype)
    raise ModelContractError(
        f"the model reads the shared variable '{var.name}', which is neither a pm.Data container "
        "nor a dimension length: batchfit cannot swap it between datasets. Wrap the array in "
        f"pm.Data('{var.name}', data['{var.name}'])."
    )


def slot_variable(slot: Slot, model: Any) -> Any:
    """The model's shared variable for a slot."""
    try:
        return model.dim_lengths[slot.name] if slot.kind == "dim" else model.named_vars[slot.name]
    except KeyError:
        raise ModelContractError(
            f"the model has no {'dimension' if slot.kind == 'dim' else 'pm.Data container'} "
            f"'{slot.name}' although models of this structure do"
        ) from None


@dataclass(frozen=True, eq=False)
class SamplerGraphs:
    """The graphs batchfit compiles for a model, and the callback spec they imply.

    Built before compiling, so that the cache key covers exactly what is compiled: the log
    density, the expansion and the generated callback source. The gradient is derived from the
    log density by PyTensor (whose version is in the key), so it is built only for compiling.
    """

    inputs: tuple[Any, ...]
    logp: Any
    expanded: Any
    spec: WrapperSpec
    _model_logp: Any
    _values: tuple[Any, ...]
    _cuts: dict[Any, Any]

    @classmethod
    def of(cls, model: Any) -> SamplerGraphs:
        """Graphs of nutpie's two callbacks with every parameter size a runtime input.

        The free parameters arrive as one flat vector; each is cut out and reshaped with a shape
        vector that is an *input* (one per parameter, filled in from the record), so a dataset
        with more groups needs no new compile.
        """
        import pytensor.tensor as pt
        from pytensor.graph.replace import clone_replace

        flat = pt.dvector("__batchfit_flat")
        values = tuple(model.rvs_to_values[rv] for rv in model.free_RVs)
        shapes = [pt.lvector(f"__batchfit_shape_{v.name}", shape=(v.type.ndim,)) for v in values]
        sizes = [pt.prod(s, dtype="int64") for s in shapes]
        ends = pt.cumsum(pt.stack(sizes)) if sizes else []
        cuts = {}
        for i, (value, shape) in enumerate(zip(values, shapes, strict=True)):
            start = ends[i - 1] if i else 0
            cuts[value] = flat[start:ends[i]].reshape(shape, ndim=value.type.ndim).astype(value.type.dtype)
        model_logp = model.logp()
        remaining = [v for v in model.unobserved_value_vars if v not in values]
        expanded = pt.concatenate([*(v.ravel() for v in values),
                                   *(pt.as_tensor(v, allow_xtensor_conversion=True).ravel() for v in remaining)])
        logp, expanded = clone_replace([model_logp, expanded.astype("float64")], cuts)
        inputs = (flat, *shapes)
        shape_slots = tuple(Slot("shape", v.name, 1, "int64") for v in values)
        spec = WrapperSpec(
            logp=(*shape_slots, *(_slot_of(v, model) for v in _shared_inputs(inputs, [logp]))),
            expand=(*shape_slots, *(_slot_of(v, model) for v in _shared_inputs(inputs, [expanded]))),
        )
        return cls(inputs, logp, expanded, spec, model_logp, values, cuts)

    def logp_and_gradient(self) -> list[Any]:
        """The logp callback's outputs: the log density and its gradient as one flat vector."""
        import pytensor.tensor as pt
        from pytensor.graph.replace import clone_replace

        grads = pt.grad(self._model_logp, list(self._values)) if self._values else []
        grad = pt.concatenate([g.ravel() for g in grads]) if grads else pt.zeros((0,))
        (grad,) = clone_replace([grad.astype("float64")], self._cuts)
        return [self.logp, grad]

    def fingerprint(self) -> str:
        """Content address of the compiled graphs and of the callback source generated for them."""
        parts = [graph_fingerprint([self.logp, self.expanded], self.inputs),
                 wrapper_source(self.spec, "logp"), wrapper_source(self.spec, "expand")]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _shared_inputs(inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """The shared variables a compiled function of ``outputs`` reads, in its argument order.

    PyTensor's ``pytensor.function`` collects them with ``rebuild_collect_shared`` (public in
    ``pytensor.compile.rebuild``), so the callbacks' argument order is known before compiling;
    ``compile_sampler_functions`` checks it against the compiled functions.
    """
    from pytensor.compile.rebuild import rebuild_collect_shared

    _, _, (_, _, _, shared) = rebuild_collect_shared(list(outputs), list(inputs), copy_inputs_over=True)
    return shared


def compile_sampler_functions(model: Any, graphs: SamplerGraphs | None = None) -> tuple[WrapperSpec, Any, Any]:
    """Compile both callbacks' graphs with PyTensor's numba backend; the spec lists their inputs."""
    from pymc.pytensorf import compile as compile_pymc

    import batchfit.linalg  # noqa: F401 - registers numba implementations PyTensor lacks

    graphs = graphs or SamplerGraphs.of(model)
    with model:
        logp_fn = compile_pymc(list(graphs.inputs), graphs.logp_and_gradient(), mode="NUMBA",
                               on_unused_input="ignore")
        expand_fn = compile_pymc(list(graphs.inputs), [graphs.expanded], mode="NUMBA", on_unused_input="ignore")
    n_shapes = len(model.free_RVs)
    compiled = WrapperSpec(
        logp=(*graphs.spec.logp[:n_shapes], *(_slot_of(v, model) for v in logp_fn.get_shared())),
        expand=(*graphs.spec.expand[:n_shapes], *(_slot_of(v, model) for v in expand_fn.get_shared())),
    )
    if compiled != graphs.spec:  # the key covered the predicted callback source: it must be the real one
        raise BatchfitError(f"PyTensor ordered the compiled functions' data inputs unexpectedly: "
                            f"{compiled} != {graphs.spec}")
    return graphs.spec, logp_fn, expand_fn


def build_entry(model: Any, cache: CacheDir, key: str, graphs: SamplerGraphs | None = None) -> float:
    """Compile the callbacks for ``model`` into the cache under ``key``; return compile seconds."""
    start = time.perf_counter()
    spec, logp_fn, expand_fn = compile_sampler_functions(model, graphs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Cannot cache compiled function.*")
        for kind, fn in (("logp", logp_fn), ("expand", expand_fn)):
            _callback(spec, kind, key, cache, fn.vm.jit_fn)
            if not list(cache.numba_dir.glob(f"batchfit_{kind}*-{key}.*.nbc")):
                raise BatchfitError(
                    f"numba could not cache the {kind} callback; the model uses an operation that "
                    "cannot be disk-cached (run 'batchfit check' to see which)"
                )
    # Functions the fit stage compiles through PyTensor land in PyTensor's numba cache too.
    SamplerFunctions(model).shapes()
    warm_extras(model)
    seconds = time.perf_counter() - start
    write_entry(cache, key, {"spec": spec.to_json(), "compile_seconds": seconds})
    return seconds


@dataclass(frozen=True)
class ModelSource:
    """How a child process rebuilds the same model: the model file, one dataset and its coding."""

    model_file: Path
    dataset_id: str
    dataset_path: Path
    coding: dict[str, Any] = dataclasses.field(default_factory=dict)  # Coding.for_dataset(dataset_id)


def sampler_key(model: Any, graphs: SamplerGraphs | None = None) -> str:
    """Content address of a model's compiled callbacks.

    It covers the generative graph (the posterior predictive and initial points are compiled
    from it), the graphs compiled into the callbacks with their generated source, and the
    environment (library versions, flags, CPU, batchfit's code).
    """
    graphs = graphs or SamplerGraphs.of(model)
    parts = (model_fingerprint(model), graphs.fingerprint(), environment_fingerprint())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


@dataclass
class CompileReport:
    """How a compiled model was obtained, for the one log line per job."""

    key: str
    hit: bool
    seconds: float
    compile_seconds: float

    def line(self) -> str:
        if self.hit:
            return (f"cache hit {self.key[:12]}: ready in {self.seconds:.2f} s "
                    f"(saved {self.compile_seconds:.1f} s of compiling)")
        return f"cache miss {self.key[:12]}: compiled in {self.compile_seconds:.1f} s"


class CompiledModel:
    """A model structure's cached callbacks plus the per-process functions around them."""

    def __init__(self, key: str, spec: WrapperSpec, logp: Any, expand: Any, template: Any, report: CompileReport):
        self.key = key
        self.spec = spec
        self.logp = logp
        self.expand = expand
        self.report = report
        self.fingerprint = model_fingerprint(template)
        self.functions = SamplerFunctions(template)

    def matches(self, model: Any) -> bool:
        """Whether ``model`` has the structure these callbacks were compiled for."""
        if getattr(model, "_batchfit_fingerprint", None) is None:
            model._batchfit_fingerprint = model_fingerprint(model)
        return model._batchfit_fingerprint == self.fingerprint

    def sampler_for(self, model: Any) -> Any:
        """A nutpie sampler model for ``model`` (same structure, its own data), without compiling.

        The data arrays are kept alive by the returned object, which nutpie holds while sampling.
        """
        from nutpie.compile_pymc import CompiledPyMCModel

        if not self.matches(model):
            raise ModelContractError("the model's structure differs from the compiled one")
        values = self.functions.load_values(model)
        free_shapes, remaining_shapes = self.functions.shapes()
        names = [*self.functions.free_names, *self.functions.remaining_names]
        shapes = [*free_shapes, *remaining_shapes]
        sizes = [int(np.prod(s)) for s in shapes]
        ends = np.cumsum([0, *sizes])
        n_dim = int(ends[len(free_shapes)])
        n_expanded = int(ends[-1])
        for name, shape in zip(self.functions.free_names, free_shapes, strict=True):
            values[Slot("shape", name, 1, "int64")] = np.array(shape, dtype=np.int64)
        record = np.zeros(self.spec.record_length(), dtype=np.int64)
        record[0], record[1] = n_dim, n_expanded
        for slot, pos in self.spec.offsets().items():
            record[pos] = values[slot].ctypes.data
            record[pos + 1: pos + 1 + slot.ndim] = values[slot].shape
        slices = [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:], strict=True)]
        dims, coords = nutpie_dims_and_coords(model, names, shapes, self.functions)
        return CompiledPyMCModel(
            dims=dims,
            reparameterized_names=list(self.functions.reparameterized),
            compiled_logp_func=self.logp,
            compiled_expand_func=self.expand,
            initial_point_func=self.functions.initial_point(self.functions.free_names),
            shared_data={slot.name + ":" + slot.kind: v for slot, v in values.items()},
            shared_var_keys={},
            user_data=record,
            n_expanded=n_expanded,
            shape_info=(names, slices, shapes),
            logp_func=None,
            expand_func=None,
            _n_dim=n_dim,
            _shapes={name: tuple(shape) for name, shape in zip(names, shapes, strict=True)},
            _coords=coords,
        )


def nutpie_dims_and_coords(model: Any, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                           functions: SamplerFunctions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Dims of each traced variable and coordinate labels, as nutpie's trace builder expects."""
    import pandas as pd

    lengths = functions.dim_lengths()
    coords = {name: coordinate_index(vals) if vals is not None else pd.RangeIndex(lengths[name])
              for name, vals in model.coords.items()}
    dims = {name: tuple(d) for name, d in model.named_vars_to_dims.items()}
    shape_of = dict(zip(names, shapes, strict=True))
    for rv in model.free_RVs:
        value_name = model.rvs_to_values[rv].name
        same_shape = shape_of.get(rv.name) == shape_of.get(value_name)
        if value_name in functions.reparameterized and rv.name in dims and same_shape:
            dims[value_name] = dims[rv.name]
    return dims, coords


def coordinate_index(labels: Sequence[Any]) -> Any:
    """Coordinate labels as a pandas Index of a type nutpie's trace accepts.

    nutpie converts int64, float64 and text indexes (an int32 index, which PyMC keeps for
    ``coords={"site": np.unique(codes)}`` of an int32 column, fails the whole sample with
    "Could not convert to Value"); other labels become text.
    """
    import pandas as pd

    index = pd.Index(list(labels))
    kind = index.dtype.kind
    if kind in "iu":
        return index.astype("int64")
    if kind == "f":
        return index.astype("float64")
    return pd.Index([str(label) for label in labels], dtype=object)


def _load(cache: CacheDir, key: str) -> tuple[WrapperSpec, Any, Any, float] | None:
    """Load an entry's callbacks; None if absent, CorruptEntry if damaged."""
    entry = read_entry(cache, key)
    if entry is None:
        return None
    spec = WrapperSpec.from_json(entry["spec"])
    try:
        logp = _callback(spec, "logp", key, cache, _missing_inner)
        expand = _callback(spec, "expand", key, cache, _missing_inner)
    except Exception as exc:
        # Absent from numba's index, or unreadable; anything else (an API change, say) is not
        # fixed by rebuilding.
        if not (isinstance(exc, LookupError) or is_damage_error(exc, cache)):
            raise
        raise CorruptEntry(f"numba could not load it ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
    return spec, logp, expand, float(entry.get("compile_seconds", 0.0))


def compile_model(model: Any, cache: CacheDir, *, source: ModelSource | None = None,
                  lock_timeout: float = 600.0) -> CompiledModel:
    """Return the compiled callbacks for ``model``, compiling them only if no process did before.

    With ``source`` a miss compiles in a child process (see module docstring); without it, in
    this process. Concurrent callers wait on a per-key lock so only one of them compiles.
    """
    start = time.perf_counter()
    graphs = SamplerGraphs.of(model)
    key = sampler_key(model, graphs)
    loaded = _load_checked(cache, key)
    hit = loaded is not None
    if loaded is None:
        with compile_lock(cache, key, lock_timeout):
            loaded = _load_checked(cache, key)
            hit = loaded is not None
            if loaded is None:
                if source is None:
                    build_entry(model, cache, key, graphs)
                else:
                    _build_in_child(source, cache, key)
                loaded = _load_checked(cache, key)
        if loaded is None:
            raise BatchfitError(f"cache entry {key[:12]} was compiled but cannot be loaded from {cache.root}")
    spec, logp, expand, compile_seconds = loaded
    seconds = time.perf_counter() - start
    report = CompileReport(key, hit, seconds, compile_seconds)
    record_event(cache, "hit" if hit else "miss", key, seconds, compile_seconds if hit else 0.0)
    # The per-process functions compile through PyTensor, which reads its own files in the cache.
    return retry_after_healing(cache, f"cache entry {key[:12]}",
                               lambda: CompiledModel(key, spec, logp, expand, model, report))


def _load_checked(cache: CacheDir, key: str) -> tuple[WrapperSpec, Any, Any, float] | None:
    """Load an entry; a damaged one is reported, removed and treated as absent."""
    try:
        return _load(cache, key)
    except CorruptEntry as exc:
        warnings.warn(f"cache entry {key[:12]} in {cache.root} is damaged: {exc}; rebuilding it", stacklevel=3)
        remove_entry(cache, key)
        return None


# Exit code of a compile worker that found damaged cache files, removed them and should be run again.
HEALED_EXIT = 3


def _build_in_child(source: ModelSource, cache: CacheDir, key: str) -> None:
    """Compile an entry in a fresh interpreter that rebuilds the same model.

    A worker that hit damaged cache files removes them and exits with HEALED_EXIT; it is then
    run once more (in a fresh process, so no half-loaded numba state is reused) and the damage
    is reported here, in the job's own warnings.
    """
    cmd = [sys.executable, "-m", "batchfit.compile", "--cache-dir", str(cache.root), "--key", key,
           "--model-file", str(source.model_file), "--dataset-id", source.dataset_id,
           "--dataset-path", str(source.dataset_path), "--coding", json.dumps(source.coding)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == HEALED_EXIT:
        healed = json.loads(proc.stdout.strip().splitlines()[-1])["healed"]
        warnings.warn(f"compiling cache entry {key[:12]}: {healed}", stacklevel=3)
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise BatchfitError(f"compiling the model failed in the compile worker: {detail}")


class SamplerFunctions:
    """Functions compiled once per process from a template model and shared by all its datasets.

    They read the template's shared variables, so each dataset's values are copied into those
    before use (``load_values``). Initial points and shapes come from here; the log density and
    expansion from the cached callbacks.
    """

    def __init__(self, template: Any):
        import pytensor
        from pymc.initial_point import make_initial_point_fn

        self.template = template
        self.slots = [_slot_of(var, template) for var in swappable_inputs(template)]
        self.free_names = [template.rvs_to_values[rv].name for rv in template.free_RVs]
        free_values = [template.rvs_to_values[rv] for rv in template.free_RVs]
        remaining = [v for v in template.unobserved_value_vars if v.name not in self.free_names]
        self.remaining_names = [v.name for v in remaining]
        self.reparameterized = [template.rvs_to_values[rv].name for rv in template.free_RVs
                                if template.rvs_to_transforms.get(rv) is not None]
        # Evaluated once per chain, so PyTensor's Python backend is fast enough, and it spares
        # the process numba's start-up: the sampler's hot code comes ready-made from the cache.
        with pytensor.config.change_flags(mode="FAST_COMPILE"):
            self._point_fn = make_initial_point_fn(
                model=template, jitter_rvs=set(template.free_RVs), return_transformed=True
            )
        self._shape_fn = pytensor.function(
            free_values, [v.shape for v in remaining], mode="FAST_COMPILE", on_unused_input="ignore"
        )
        unlabelled = [name for name, vals in template.coords.items() if vals is None]
        self._dim_fn = pytensor.function(
            [], [template.dim_lengths[name] for name in unlabelled], mode="FAST_COMPILE"
        )
        self._unlabelled = unlabelled
        self._lock = threading.Lock()

    def load_values(self, model: Any) -> dict[Slot, np.ndarray]:
        """Copy every data container and dimension length of ``model`` into the template.

        All of them, not only the callbacks' inputs: initial points, shapes and the optional
        outputs read others (a dimension length that sizes a parameter, say). Returns the arrays.
        """
        values = {}
        for slot in self.slots:
            value = np.asarray(slot_variable(slot, model).get_value(borrow=True), dtype=slot.dtype, order="C")
            value.flags.writeable = False
            slot_variable(slot, self.template).set_value(value, borrow=True)
            values[slot] = value
        return values

    def shapes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Shapes of the free (transformed) and remaining variables for the loaded values."""
        point = self._point_fn(0)
        free = [tuple(np.shape(point[name])) for name in self.free_names]
        remaining = [tuple(int(n) for n in s) for s in self._shape_fn(*(point[n] for n in self.free_names))]
        return free, remaining

    def dim_lengths(self) -> dict[str, int]:
        """Lengths of the dimensions that have no coordinate labels, for the loaded values."""
        return {name: int(n) for name, n in zip(self._unlabelled, self._dim_fn(), strict=True)}

    def initial_point(self, names: Sequence[str]) -> Callable[[Any], np.ndarray]:
        """nutpie's initial-point callback: a flat float64 vector of jittered start values."""

        def flat_point(seed: Any) -> np.ndarray:
            with self._lock:
                point = self._point_fn(seed)
            return np.concatenate([np.asarray(point[n], dtype="float64").ravel() for n in names])

        return flat_point


def main(argv: Sequence[str] | None = None) -> int:
    """Compile worker: rebuild a model from its file and one dataset, compile it into the cache."""
    from batchfit.cache import open_cache
    from batchfit.coding import Coding
    from batchfit.data import load_dataset
    from batchfit.modelfile import build_model, load_model_file

    parser = argparse.ArgumentParser(prog="python -m batchfit.compile")
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--dataset-id", required=True)
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--coding", default="{}", help="the dataset's text-column coding (JSON)")
    args = parser.parse_args(argv)
    cache = open_cache(args.cache_dir, trust_shared=True)  # the parent already checked it
    coding = json.loads(args.coding)
    dataset = load_dataset(args.dataset_id, Path(args.dataset_path), Coding.from_json(coding) if coding else None)
    model = build_model(load_model_file(Path(args.model_file)), dataset)
    graphs = SamplerGraphs.of(model)
    key = sampler_key(model, graphs)
    if key != args.key:
        print(f"the model built from {args.model_file} differs between processes (key {key[:12]} "
              f"!= {args.key[:12]}): build_model must be deterministic", file=sys.stderr)
        return 2
    try:
        seconds = build_entry(model, cache, key, graphs)
    except Exception as exc:
        if not is_damage_error(exc, cache):
            raise
        removed = heal(cache)
        if not removed:  # nothing damaged on disk: retrying would fail the same way
            raise
        print(json.dumps({"healed": damage_message(cache, removed)}))
        return HEALED_EXIT
    print(json.dumps({"key": key, "compile_seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
