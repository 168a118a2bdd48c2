"""The user code a model file imports: its folder made importable, and its modules found for provenance.

A model file may import helpers of the user's own: a module or package beside it (``from helpers
import simulate``, as ``python model.py`` allows), a module on ``PYTHONPATH`` or a package of
theirs installed in editable mode (``from myproject.priors import hyperpriors``). Editing such a
helper changes the model as surely as editing the model file, so its content must be part of
every fit's digest (`batchfit.fitting.provenance`), or the plan keeps fits of the old model.

**The model's folder.** `use` makes a loaded model file's folder importable, for its import
and for every call batchfit makes into it (`batchfit.model.model_file`); it stays so until another
model file's code runs, so an import inside a function that runs later (a ``pm.CustomDist``
logp) works too. Unlike ``python model.py``, the folder is searched *after* everything else:

* a top-level name is served from the folder only when no other finder (the standard library,
  installed packages, ``PYTHONPATH``, editable installs) has a module or package of that name,
  so a file beside the model (``numpy.py``, ``statistics.py``) never replaces a library module,
  also not for a library's own lazy imports; a model that imports such a name is refused with
  an error naming the file (`ModelImports.shadowed`);
* only modules and packages with an ``__init__.py`` are served, not bare directories (a
  project's ``data/`` and ``results/`` would otherwise import as namespace packages);
* each loaded model file has its own: the modules it imported from its folder are taken out of
  ``sys.modules`` while another model file's code runs, and put back when its own runs again,
  so two model files in different folders that each import their own ``helpers`` each get
  theirs, and a model file loaded anew (after an edit) imports its helpers anew.

**Provenance.** The plan runs at every Snakemake parse and must not import the model (that
imports PyMC and runs the user's code), so the imports are read from the source with `ast` and
located with importlib's finders, which read directories but execute nothing:
`importlib.util.find_spec` of a top-level name imports no parent, and a submodule is looked up
in its parent's ``submodule_search_locations`` by each finder on ``sys.meta_path`` (editable
installs add one); names are resolved as the loader does, the model's folder last. Modules
under the installed packages and the standard library (`compat.library_roots`) are pinned by
the library versions in the digest and not followed; batchfit is covered by its own code hash.
Imports made by other means (``importlib.import_module(name)``, ``exec``) are not seen.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from batchfit.common.hashing import file_sha256
from batchfit.compat.python import library_roots

_COVERED_ELSEWHERE = frozenset({"batchfit"})  # batchfit's modules are in the digest's code_hash


def model_folder(path: str | Path) -> Path:
    """The folder whose modules a model file may import: its own, symlinks resolved (as Python's
    ``sys.path[0]`` for a script)."""
    return Path(path).resolve().parent


# ---------------------------------------------------------------------------------------------
# The model's folder, importable


@dataclass(eq=False)
class FolderModules:
    """The modules one loaded model file imported from its folder (kept here while another
    model file's are in ``sys.modules``)."""

    folder: Path
    stashed: dict[str, ModuleType] = field(default_factory=dict)


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Serves a top-level module or package from the active model's folder when nothing else has it."""

    folder: Path | None = None

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None or self.folder is None:  # a submodule: its parent's path finds it
            return None
        local = _local_spec(fullname, self.folder)
        if local is None:
            return None
        other = _spec_elsewhere(fullname, self.folder)
        return local if other is None or _is_namespace(other) else None


_FINDER = _FolderFinder()
_MODEL_FOLDERS: set[Path] = set()  # every folder `use` made importable in this process
_active: FolderModules | None = None


def use(modules: FolderModules) -> None:
    """Make ``modules.folder`` importable and its model's modules the ones ``sys.modules`` holds.

    Called before a model file runs and before each call into it; cheap when it is already the
    one in use. The modules of the model file in use before are taken out of ``sys.modules``
    and kept with it.
    """
    global _active
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if _active is modules:
        return
    if _active is not None:
        _active.stashed = _take_modules_from(_active.folder)
    for name, module in modules.stashed.items():
        sys.modules.setdefault(name, module)
    modules.stashed = {}
    finder = sys.path_importer_cache.get(str(modules.folder))
    if finder is not None:  # files written since it listed the folder
        finder.invalidate_caches()
    _MODEL_FOLDERS.add(modules.folder)
    _FINDER.folder, _active = modules.folder, modules


def _take_modules_from(folder: Path) -> dict[str, ModuleType]:
    """Remove the modules imported from ``folder`` (with their submodules) from ``sys.modules``."""
    tops = {name for name, module in list(sys.modules.items()) if "." not in name and _home(name, module) == folder}
    return {name: sys.modules.pop(name) for name in list(sys.modules) if name.partition(".")[0] in tops}


def _home(name: str, module: ModuleType) -> Path | None:
    """The folder top-level module ``name`` was imported from as a file or package directly in it."""
    spec = getattr(module, "__spec__", None)
    if spec is None or spec.name != name:  # e.g. a model file, imported as batchfit_model_...
        return None
    return _spec_home(spec)


def _spec_home(spec: importlib.machinery.ModuleSpec) -> Path | None:
    """The folder that holds top-level module ``spec`` as a file or package directly in it."""
    name = spec.name
    if spec.submodule_search_locations:
        location = Path(os.path.realpath(list(spec.submodule_search_locations)[0]))
        return location.parent if location.name == name else None
    if spec.has_location and spec.origin:
        origin = Path(os.path.realpath(spec.origin))
        return origin.parent if origin.name.partition(".")[0] == name else None
    return None


def _local_spec(name: str, folder: Path) -> importlib.machinery.ModuleSpec | None:
    """Top-level module or package ``name`` in ``folder`` (not a bare directory)."""
    spec = _ask(importlib.machinery.PathFinder, name, [str(folder)])
    return None if spec is None or _is_namespace(spec) else spec


def _ask(finder: object, name: str, path: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
    """``finder.find_spec(name, path)``, None when it has none or raises.

    The scan asks every finder on ``sys.meta_path`` about names an import may never reach (``from a
    import b`` where ``b`` is an attribute; a submodule whose parent is not imported), and a finder of
    another library may raise on those (importlib's own namespace paths raise ``KeyError`` for a parent
    missing from ``sys.modules``). Whatever it raises, what it would find is nothing the scan can follow,
    and an import that needs it fails when the model runs, with Python's own error.
    """
    find = getattr(finder, "find_spec", None)
    if find is None:
        return None
    try:
        return find(name, path)
    except Exception:  # noqa: BLE001 - another library's finder: see above
        return None


def _spec_elsewhere(name: str, folder: Path) -> importlib.machinery.ModuleSpec | None:
    """Where top-level ``name`` is found by every finder but the model folder's, ``folder`` left off
    ``sys.path`` (Snakemake puts a project's folder there, a fit job does not: both must agree)."""
    for finder in list(sys.meta_path):
        if finder is _FINDER:
            continue
        path = [entry for entry in sys.path if not _same_folder(entry, folder)] \
            if finder is importlib.machinery.PathFinder else None
        spec = _ask(finder, name, path)
        if spec is not None and _spec_home(spec) != folder:  # a finder of its own may search sys.path
            return spec
    return None


def _same_folder(entry: str, folder: Path) -> bool:
    return os.path.realpath(entry or os.curdir) == str(folder)


def _is_namespace(spec: importlib.machinery.ModuleSpec) -> bool:
    return spec.origin in (None, "namespace") and spec.submodule_search_locations is not None


# ---------------------------------------------------------------------------------------------
# The user modules a model file imports, found without running it


@dataclass(frozen=True)
class ModelImports:
    """What a model file imports of the user's code, found from the sources."""

    modules: dict[str, str]  # module name -> sha256 of its file
    shadowed: dict[str, tuple[str, str]]  # name -> (its file beside the model, what importing it loads)
    files: dict[str, str]  # module name -> its file

    def shadow_error(self, model_file: str | Path) -> str:
        """Why the model file cannot import a module beside it ('' if it can)."""
        return "; ".join(
            f"{Path(local).name} beside {Path(model_file).name} has the name of the module '{name}' "
            f"({other}), which is what `import {name}` loads: rename {Path(local).name}"
            for name, (local, other) in self.shadowed.items())


def user_imports(path: str | Path) -> dict[str, str]:
    """Module name -> sha256 of its file, for every user module ``path`` imports, directly or not."""
    return scan(path).modules


def user_import_files(path: str | Path) -> list[str]:
    """The files of every user module ``path`` imports, directly or not: what a job that builds the
    model reads besides the model file (the workflow declares them as its inputs)."""
    return sorted(set(scan(path).files.values()))


def scan(path: str | Path) -> ModelImports:
    """The user modules ``path`` imports, directly or not, and the files beside it that its imports
    cannot reach because a library module of that name is found first."""
    folder = model_folder(path)
    finder = sys.path_importer_cache.get(str(folder))
    if finder is not None:  # files written since it listed the folder
        finder.invalidate_caches()
    found: dict[str, str] = {}
    files: dict[str, str] = {}
    shadowed: dict[str, tuple[str, str]] = {}
    pending = [(Path(path), "", True)]
    seen_files = {Path(path).resolve()}
    while pending:
        source, package, own = pending.pop()
        for name in _imported_names(source, package):
            if own and "." not in name:
                collision = _shadowing(name, folder)
                if collision is not None:
                    shadowed[name] = collision
            spec = _find_spec(name, folder)
            if spec is None or not spec.has_location or spec.origin is None or name in found:
                continue
            origin = Path(spec.origin).resolve()
            local = _resolves_locally(name.partition(".")[0], folder)
            if not (local or is_user_file(origin)) or name.partition(".")[0] in _COVERED_ELSEWHERE:
                continue
            found[name] = file_sha256(origin)
            files[name] = str(origin)
            if origin.suffix == ".py" and origin not in seen_files:
                seen_files.add(origin)
                pending.append((origin, name if spec.submodule_search_locations is not None
                                else name.rpartition(".")[0], own and local))
    return ModelImports(dict(sorted(found.items())), shadowed, dict(sorted(files.items())))


@functools.cache
def is_user_file(filename: str | Path) -> bool:
    """A file no library version pins: not under the installed packages or the standard library.

    Both sides are compared resolved (`library_roots` is): a process started through a symlinked
    prefix finds the same files its own as one started through the real one.
    """
    real = os.path.realpath(filename)
    return not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in library_roots())


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


def _find_spec(name: str, folder: Path) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` would be loaded from, ``folder`` importable as `use` makes it, without
    executing any module.

    An already imported module answers with its own spec, unless it came from a model's folder
    (another model's ``helpers`` may be the one imported now). A top-level name is resolved by
    `_top_level_spec` and a submodule by the finders on ``sys.meta_path`` with its parent's search
    locations, found the same way.
    """
    parent, _, _ = name.rpartition(".")
    if not parent:
        return _top_level_spec(name, folder)
    module = sys.modules.get(name)
    if module is not None and not _from_model_folder(name):
        return getattr(module, "__spec__", None)
    parent_spec = _find_spec(parent, folder)
    if parent_spec is None or parent_spec.submodule_search_locations is None:
        return None  # a name taken from a module, not a submodule
    for finder in list(sys.meta_path):
        spec = _ask(finder, name, list(parent_spec.submodule_search_locations))
        if spec is not None:
            return spec
    return None


def _top_level_spec(name: str, folder: Path) -> importlib.machinery.ModuleSpec | None:
    """Top-level ``name`` as an import finds it with ``folder`` importable: imported already, found
    by another finder (a bare directory only if ``folder`` has no such module), or in ``folder``."""
    module = sys.modules.get(name)
    if module is not None and not _from_model_folder(name):
        return getattr(module, "__spec__", None)
    other = _spec_elsewhere(name, folder)
    if other is not None and not _is_namespace(other):
        return other
    return _local_spec(name, folder) or other


def _resolves_locally(name: str, folder: Path) -> bool:
    """Whether top-level ``name`` is imported from ``folder``."""
    local = _local_spec(name, folder)
    return local is not None and _same_place(_top_level_spec(name, folder), local)


def _shadowing(name: str, folder: Path) -> tuple[str, str] | None:
    """(the file beside the model, what is loaded instead) when ``folder`` has a module ``name``
    that an import does not reach."""
    local = _local_spec(name, folder)
    if local is None:
        return None
    spec = _top_level_spec(name, folder)
    if spec is None or _same_place(spec, local):
        return None
    return str(local.origin), str(spec.origin or ", ".join(spec.submodule_search_locations or []))


def _same_place(a: importlib.machinery.ModuleSpec | None, b: importlib.machinery.ModuleSpec) -> bool:
    return a is not None and a.origin is not None and b.origin is not None and (
        os.path.realpath(a.origin) == os.path.realpath(b.origin))


def _from_model_folder(name: str) -> bool:
    """Whether imported module ``name`` belongs to a model folder `use` made importable."""
    top = name.partition(".")[0]
    module = sys.modules.get(top)
    return module is not None and _home(top, module) in _MODEL_FOLDERS
