"""PyTensor functions that run once per chain or dataset: rewritten lightly, never compiled."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def python_mode() -> Iterator[None]:
    """Compile the block's PyTensor functions for PyTensor's Python implementations only.

    ``mode="FAST_COMPILE"`` alone is not enough: PyTensor 3.3 links the inner function of a
    ``Scan`` (PyMC's ``LKJCorr`` initial point has one) with the default ``"vm"`` linker
    (``InnerFunctionOp.link_mode`` in ``pytensor/compile/inner_function.py``), which compiles
    every op's C code with g++: on an empty cache, a large part of the cold compile of
    ``models/grouped_mvnormal.py``. With no C++ compiler
    configured (``cxx=""``, PyTensor's documented switch) the VM runs each op's ``perform``.
    """
    import pytensor

    with pytensor.config.change_flags(mode="FAST_COMPILE", cxx=""):
        yield
