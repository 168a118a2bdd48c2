"""The user code a model file imports, found without running it, for the fits' provenance.

A model file may import helpers of the user's own: a module on ``PYTHONPATH`` or a package of
theirs installed in editable mode (``from myproject.priors import hyperpriors``). Editing such a
helper changes the model as surely as editing the model file, so its content must be part of
every fit's digest (`batchfit.provenance`), or the plan keeps fits of the old model.

The plan runs at every Snakemake parse and must not import the model (that imports PyMC and runs
the user's code), so the imports are read from the source with `ast` and located with
importlib's finders, which read directories but execute nothing: `importlib.util.find_spec` of a
top-level name imports no parent, and a submodule is looked up in its parent's
``submodule_search_locations`` by each finder on ``sys.meta_path`` (editable installs add one).
Modules under the installed packages and the standard library (`compat.library_roots`) are
pinned by the library versions in the digest and not followed; batchfit is covered by its own
code hash. Imports made by other means (``importlib.import_module(name)``, ``exec``) are not seen.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from batchfit.compat import library_roots

_COVERED_ELSEWHERE = frozenset({"batchfit"})  # batchfit's modules are in the digest's code_hash


def user_imports(path: str | Path) -> dict[str, str]:
    """Module name -> sha256 of its file, for every user module ``path`` imports, directly or not."""
    found: dict[str, str] = {}
    pending = [(Path(path), "")]
    seen_files = {Path(path).resolve()}
    while pending:
        source, package = pending.pop()
        for name in _imported_names(source, package):
            spec = _find_spec(name)
            if spec is None or not spec.has_location or spec.origin is None or name in found:
                continue
            origin = Path(spec.origin).resolve()
            if not is_user_file(origin) or name.partition(".")[0] in _COVERED_ELSEWHERE:
                continue
            found[name] = hashlib.sha256(origin.read_bytes()).hexdigest()
            if origin.suffix == ".py" and origin not in seen_files:
                seen_files.add(origin)
                pending.append((origin, name if spec.submodule_search_locations is not None
                                else name.rpartition(".")[0]))
    return dict(sorted(found.items()))


def is_user_file(filename: str | Path) -> bool:
    """A file no library version pins: not under the installed packages or the standard library."""
    return not any(str(filename).startswith(root) for root in library_roots())


def _imported_names(source: Path, package: str) -> list[str]:
    """Every module an ``import`` statement in ``source`` may load, parents first (``a``, ``a.b``).

    ``from a import b`` may import module ``a.b`` or take attribute ``b`` of ``a``; both are
    listed and `_find_spec` drops names that are no module. ``package`` resolves relative imports.
    """
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (SyntaxError, ValueError):  # the fit reports a model file that is no Python; here nothing to follow
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            if base is None:
                continue
            if base:
                names.append(base)
            names.extend(f"{base}.{alias.name}" if base else alias.name for alias in node.names if alias.name != "*")
    parents = [".".join(name.split(".")[:i]) for name in names for i in range(1, name.count(".") + 1)]
    return list(dict.fromkeys([*parents, *names]))


def _absolute(module: str, level: int, package: str) -> str | None:
    """The absolute name of ``from {'.' * level}{module} import ...`` in ``package`` (None if above the top)."""
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts) or not package:
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _find_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` would be loaded from, without executing any module.

    An already imported module answers with its own spec. Otherwise a top-level name goes to
    `importlib.util.find_spec` (which imports nothing for it) and a submodule to the finders on
    ``sys.meta_path`` with its parent's search locations, found the same way.
    """
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    parent, _, _ = name.rpartition(".")
    try:
        if not parent:
            return importlib.util.find_spec(name)
        parent_spec = _find_spec(parent)
        if parent_spec is None or parent_spec.submodule_search_locations is None:
            return None  # a name taken from a module, not a submodule
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, list(parent_spec.submodule_search_locations)) if find else None
            if spec is not None:
                return spec
    except (ImportError, ValueError):  # e.g. a finder refusing the name: nothing to follow
        return None
    return None
