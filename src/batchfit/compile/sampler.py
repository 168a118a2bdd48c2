"""A compiled structure as nutpie sees it: the cached callbacks plus the per-process functions
(initial points, shapes, coordinates) that turn one dataset's model into a nutpie sampler model.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchfit.cache.store import Fetched
from batchfit.compat.nutpie import coordinate_index, nutpie_model
from batchfit.compile.callbacks import Slot, WrapperSpec
from batchfit.compile.fingerprint import structure_of
from batchfit.compile.graphs import slot_of, slot_variable
from batchfit.errors import ModelContractError
from batchfit.model.model_file import swappable_inputs
from batchfit.model.python_mode import python_mode


@dataclass(frozen=True)
class CompileReport:
    """How a compiled model was obtained, for the one log line per job."""

    key: str
    hit: bool
    seconds: float
    compile_seconds: float
    installed: bool = False  # from the sweep's compiled bundle (`batchfit.cache.bundle`)

    @classmethod
    def of(cls, fetched: Fetched[Any]) -> CompileReport:
        return cls(fetched.key, fetched.hit, fetched.seconds, fetched.compile_seconds, fetched.installed)

    def line(self) -> str:
        if self.hit:
            source = " (installed from the compiled bundle)" if self.installed else ""
            return (f"cache hit {self.key[:12]}{source}: ready in {self.seconds:.2f} s "
                    f"(saved {self.compile_seconds:.1f} s of compiling)")
        return f"cache miss {self.key[:12]}: compiled in {self.compile_seconds:.1f} s"


@dataclass(frozen=True)
class StartPoint:
    """Where nutpie's chains start: PyMC's ``initvals`` overrides (by variable name, a transformed name
    taking an unconstrained value) and the free variables jittered by U(-1, 1) on the unconstrained
    space (None: every continuous one, as nutpie's ``compile_pymc_model`` and so ``pm.sample`` with
    nutpie jitter them). The sampler settings ``initvals`` and ``jitter_rvs`` (`batchfit.config`);
    not part of any cache key: the initial point is evaluated per process, never compiled into an entry.
    """

    initvals: Mapping[str, Any] = field(default_factory=dict, hash=False)
    jitter_rvs: tuple[str, ...] | None = None

    @property
    def is_default(self) -> bool:
        """Whether the chains start where they start without any setting."""
        return not self.initvals and self.jitter_rvs is None

    def key(self) -> str:
        """The start as text, to reuse a function made for an equal one."""
        return json.dumps([self.initvals, self.jitter_rvs], sort_keys=True)

    def overrides(self) -> dict[str, Any] | None:
        """``initvals`` as ``make_initial_point_fn`` takes them: arrays, or PyMC's strategy names."""
        return {name: value if isinstance(value, str) else np.asarray(value) for name, value in self.initvals.items()} \
            or None

    def jittered(self, model: Any) -> set[Any]:
        """The random variables of ``model`` whose start is jittered."""
        from pymc.vartypes import continuous_types

        if self.jitter_rvs is None:  # a discrete variable (pm.sample's own path) cannot hold the noise
            return {rv for rv in model.free_RVs if rv.dtype in continuous_types}
        return {model[name] for name in self.jitter_rvs}

    def point_function(self, model: Any) -> Callable[[Any], dict[str, np.ndarray]]:
        """PyMC's seeded initial-point function of ``model`` for this start, on the unconstrained space
        (``pymc.initial_point.make_initial_point_fn``, as nutpie's ``compile_pymc_model`` makes it):
        jitter is added to the ``initvals``. Compiled by PyTensor's Python backend: evaluated once per
        chain, it needs no numba."""
        from pymc.initial_point import make_initial_point_fn

        with python_mode():
            return make_initial_point_fn(model=model, overrides=self.overrides(), jitter_rvs=self.jittered(model),
                                         return_transformed=True)


DEFAULT_START = StartPoint()


class CompiledModel:
    """A model structure's cached callbacks plus the per-process functions around them."""

    def __init__(self, key: str, spec: WrapperSpec, logp: Any, expand: Any, template: Any, report: CompileReport,
                 functions: SamplerFunctions | None = None):
        self.key = key
        self.spec = spec
        self.logp = logp
        self.expand = expand
        self.report = report
        self.fingerprint = structure_of(template)  # computed once: the structure registry asked first
        # ``functions``: of ``template``, built already (while the callbacks compiled)
        self.functions = functions if functions is not None else SamplerFunctions(template)

    def matches(self, model: Any) -> bool:
        """Whether ``model`` has the structure these callbacks were compiled for."""
        return structure_of(model) == self.fingerprint

    def sampler_for(self, model: Any, start: StartPoint = DEFAULT_START) -> Any:
        """A nutpie sampler model for ``model`` (same structure, its own data), without compiling;
        its chains start as ``start`` says.

        The data arrays are kept alive by the returned object, which nutpie holds while sampling.
        """
        if not self.matches(model):
            raise ModelContractError("the model's structure differs from the compiled one")
        with self.functions.loaded(model) as loaded:
            free_shapes, remaining_shapes = self.functions.shapes()
            names = [*self.functions.free_names, *self.functions.remaining_names]
            shapes = [*free_shapes, *remaining_shapes]
            dims, coords = nutpie_dims_and_coords(model, names, shapes, self.functions)
        sizes = [int(np.prod(s)) for s in shapes]
        ends = np.cumsum([0, *sizes])
        n_dim = int(ends[len(free_shapes)])
        n_expanded = int(ends[-1])
        # a parameter's entry is its start in nutpie's flat vector; a data input's, its address
        starts = ends[:len(free_shapes)]
        params = {name: (int(start), shape)
                  for name, start, shape in zip(self.functions.free_names, starts, free_shapes, strict=True)}
        record = np.zeros(self.spec.record_length(), dtype=np.int64)
        record[0], record[1] = n_dim, n_expanded
        for slot, pos in self.spec.offsets().items():
            if slot.kind == "param":
                record[pos], shape = params[slot.name]
            else:
                record[pos], shape = loaded[slot].ctypes.data, loaded[slot].shape
            record[pos + 1: pos + 1 + slot.ndim] = shape
        slices = [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:], strict=True)]
        return nutpie_model(
            dims=dims,
            reparameterized_names=list(self.functions.reparameterized),
            logp=self.logp,
            expand=self.expand,
            initial_point=self.functions.initial_point(self.functions.free_names, loaded, start),
            data={slot.name + ":" + slot.kind: v for slot, v in loaded.items()},
            record=record,
            names=names,
            slices=slices,
            shapes=shapes,
            n_dim=n_dim,
            n_expanded=n_expanded,
            coords=coords,
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


class SamplerFunctions:
    """Functions compiled once per process from a template model and shared by all its datasets.

    They read the template's shared variables, so each dataset's values are copied into those
    before use (``load_values``). Initial points and shapes come from here; the log density and
    expansion from the cached callbacks.
    """

    def __init__(self, template: Any):
        import pytensor
        self.template = template
        self.slots = [slot_of(var, template) for var in swappable_inputs(template)]
        self.free_names = [template.rvs_to_values[rv].name for rv in template.free_RVs]
        free_values = [template.rvs_to_values[rv] for rv in template.free_RVs]
        remaining = [v for v in template.unobserved_value_vars if v.name not in self.free_names]
        self.remaining_names = [v.name for v in remaining]
        self.reparameterized = [template.rvs_to_values[rv].name for rv in template.free_RVs
                                if template.rvs_to_transforms.get(rv) is not None]
        # Evaluated once per chain, so PyTensor's Python backend is fast enough, and it spares
        # the process numba's start-up (and g++): the sampler's hot code comes ready-made from the cache.
        self._point_fn = DEFAULT_START.point_function(template)
        self._start_fns = {DEFAULT_START.key(): self._point_fn}  # by `StartPoint.key`, made when first asked for
        with python_mode():
            self._shape_fn = pytensor.function(free_values, [v.shape for v in remaining], on_unused_input="ignore")
            unlabelled = [name for name, vals in template.coords.items() if vals is None]
            self._dim_fn = pytensor.function([], [template.dim_lengths[name] for name in unlabelled])
        self._unlabelled = unlabelled
        self._lock = threading.Lock()

    def load_values(self, model: Any) -> dict[Slot, np.ndarray]:
        """Copy every data container and dimension length of ``model`` into the template.

        All of them, not only the callbacks' inputs: initial points, shapes and the optional
        outputs read others (a dimension length that sizes a parameter, say). Returns the arrays.
        Hold `loaded` instead while anything reads the template in a batch that samples.
        """
        values = {}
        for slot in self.slots:
            value = np.asarray(slot_variable(slot, model).get_value(borrow=True), dtype=slot.dtype, order="C")
            value.flags.writeable = False
            values[slot] = value
        self._set(values)
        return values

    @contextlib.contextmanager
    def loaded(self, model: Any) -> Iterator[dict[Slot, np.ndarray]]:
        """The template holding ``model``'s values, which no other dataset's replace meanwhile.

        Datasets sample while the next ones are prepared and the last ones finished, and nutpie's
        chain threads evaluate their initial points whenever a chain starts (`initial_point`), all
        through this one template: each loads its own values under the lock before reading it.
        """
        with self._lock:
            yield self.load_values(model)

    def _set(self, values: dict[Slot, np.ndarray]) -> None:
        for slot, value in values.items():
            slot_variable(slot, self.template).set_value(value, borrow=True)

    def shapes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Shapes of the free (transformed) and remaining variables for the loaded values."""
        point = self._point_fn(0)
        free = [tuple(np.shape(point[name])) for name in self.free_names]
        remaining = [tuple(int(n) for n in s) for s in self._shape_fn(*(point[n] for n in self.free_names))]
        return free, remaining

    def dim_lengths(self) -> dict[str, int]:
        """Lengths of the dimensions that have no coordinate labels, for the loaded values."""
        return {name: int(n) for name, n in zip(self._unlabelled, self._dim_fn(), strict=True)}

    def initial_point(self, names: Sequence[str], values: dict[Slot, np.ndarray],
                      start: StartPoint = DEFAULT_START) -> Callable[[Any], np.ndarray]:
        """nutpie's initial-point callback: a flat float64 vector of start values, jittered and
        overridden as ``start`` says (its function is made here, on the calling thread, once per start).

        Called from a chain thread when its chain starts, maybe while other datasets use the
        template: it loads its own dataset's ``values`` first.
        """
        point_fn = self._start_fns.get(start.key())
        if point_fn is None:
            point_fn = self._start_fns[start.key()] = start.point_function(self.template)

        def flat_point(seed: Any) -> np.ndarray:
            with self._lock:
                self._set(values)
                point = point_fn(seed)
            return np.concatenate([np.asarray(point[n], dtype="float64").ravel() for n in names])

        return flat_point
