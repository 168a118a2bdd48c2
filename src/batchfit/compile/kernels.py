"""batchfit's numba implementations of ops PyTensor's numba backend would otherwise run in object
mode, which a cached callback cannot call; importing this module registers all of them.

- `batchfit.compile.linalg`: a ``Blockwise`` whose core output shape is not known ahead of time;
- `batchfit.compile.splines`: PyMC's ``SplineWrapper`` (``pm.Interpolated``).
"""

import batchfit.compile.linalg  # noqa: F401
import batchfit.compile.splines  # noqa: F401
