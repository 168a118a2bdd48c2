"""batchfit's numba implementations of ops PyTensor's numba backend would otherwise run in object
mode, which a cached callback cannot call, and the checks that find such ops.

`register` registers the implementations, a module per op family, as importing
``pytensor.link.numba.dispatch`` registers PyTensor's:

- `batchfit.numba_ops.linalg`: a ``Blockwise`` whose core output shape is not known ahead of time;
- `batchfit.numba_ops.splines`: PyMC's ``SplineWrapper`` (``pm.Interpolated``).

Importing this package registers nothing and loads neither numba nor PyTensor: a job sets numba's
CPU target (`batchfit.numba_ops.cputarget`) before numba loads, and finds object-mode ops
(`batchfit.numba_ops.nopython`) without the implementations' imports (PyMC, SciPy's splines,
PyTensor's linear algebra), which only what compiles a graph needs.
"""


def register() -> None:
    """Register batchfit's numba implementations with PyTensor's numba backend; calling it again changes nothing."""
    import batchfit.numba_ops.linalg  # noqa: F401
    import batchfit.numba_ops.splines  # noqa: F401
