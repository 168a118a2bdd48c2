"""The CPU that compiled code is generated for: this host's, or a generic one that runs on any node.

numba generates machine code for the host CPU by default (its name and features, e.g. AVX-512),
which is fastest but may not run, and is never loaded from the cache, on another CPU type: on a
cluster with mixed node types every fit job on another type would compile again. numba's portable
target is the CPU name ``generic`` (``NUMBA_CPU_NAME``; its features then default to none). numba
reads it once, when it is imported, so it is set in the environment before that: this process
and every child (the compile worker, Snakemake's jobs) then generate and look up the same code.
The target is part of every cache key (`batchfit.compile.fingerprint.environment_fingerprint`), so
entries for different targets coexist in one cache.
"""

from __future__ import annotations

import os
import sys

from batchfit.errors import BatchfitError

CPU_TARGETS = ("host", "generic")


def apply_cpu_target(target: str, source: str = "the config") -> None:
    """Make numba compile for ``target`` ('host' or 'generic') in this process and its children.

    Raises if numba is already loaded for another target: its code generator cannot be changed.
    """
    if target not in CPU_TARGETS:
        raise BatchfitError(f"cache.cpu_target in {source} must be one of {', '.join(CPU_TARGETS)}, not {target!r}")
    wanted = "generic" if target == "generic" else None
    if "numba" in sys.modules:
        import numba

        if numba.config.CPU_NAME != wanted:
            raise BatchfitError(
                f"cache.cpu_target '{target}' (in {source}) must be set before numba is loaded, and this process "
                f"already loaded it for CPU {numba.config.CPU_NAME or 'host'}; run batchfit in a new process"
            )
        return
    if wanted:
        os.environ["NUMBA_CPU_NAME"] = wanted
    else:
        os.environ.pop("NUMBA_CPU_NAME", None)
