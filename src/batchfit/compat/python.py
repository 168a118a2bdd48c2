"""The Python standard library: where installed packages live; pathlib's interning on CPython 3.12.0-3.12.5."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import ModuleType
from typing import Any


@functools.cache
def library_roots() -> tuple[str, ...]:
    """Directories of installed packages and the standard library (code pinned by versions), symlinks resolved.

    ``sysconfig`` gives them under the prefix as Python was started (``~/proj/.venv/bin/python`` with
    ``/home`` a symlink), while a module's file is compared with them resolved: both sides are real paths.
    """
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(sorted({os.path.realpath(paths[k]) for k in keys if k in paths}))


class _SysWithoutIntern(ModuleType):
    """``sys`` as pathlib sees it, but ``intern`` returns the string itself (an equal string)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)

    @staticmethod
    def intern(string: str) -> str:
        return string


def stop_pathlib_interning() -> None:
    """Keep pathlib from interning the parts of every path it parses, on the Pythons where
    interned strings are never freed.

    CPython 3.12.0 to 3.12.5 make every interned string immortal
    (https://github.com/python/cpython/issues/113993; mortal again from 3.12.6,
    gh-123065), and their pathlib interns each part of a path it parses (``sys.intern`` in
    ``PurePath._parse_path``, ``Lib/pathlib.py``; gone in 3.14, gh-119518): every distinct file
    name a process touches stays in memory (https://github.com/python/cpython/issues/121780).
    A job goes through several paths per dataset (data, fit, sidecar, summary entry, temporary
    names), so interning makes collect's peak memory grow with the sweep. pathlib reaches
    ``sys.intern`` through its module global ``sys``, which gets a stand-in; interning changes no
    string's value, only which object holds it.
    """
    import pathlib

    if (3, 12) <= sys.version_info[:2] and sys.version_info[:3] < (3, 12, 6) \
            and not isinstance(pathlib.sys, _SysWithoutIntern):
        pathlib.sys = _SysWithoutIntern("sys")
