"""Content digests: of a file, and of batchfit's own source code (the one place either is computed).

Files are hashed to record what a fit was made from (data, model file, the modules it imports)
and to check cache files; batchfit's sources, to tell a cache key (`batchfit.compile.fingerprint`),
a fit's provenance (`batchfit.fitting.provenance`) or a cached summary (`batchfit.outputs.summary_cache`)
made by other code from one made by this code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the batchfit package's directory

# Package data, not code: the workflow shipped with the package (rules and thin rule scripts, which
# Snakemake runs) and `batchfit init`'s project template.
_NOT_CODE = frozenset({"workflow", "template"})


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's content (read in blocks: data files may be large)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def package_sources(*parts: str, package: Path = PACKAGE) -> list[Path]:
    """batchfit's Python files under each of ``parts`` (subpackages or modules, as package-relative
    paths such as ``"fitting"`` or ``"config.py"``; none: the whole package, but `_NOT_CODE`), sorted.
    """
    roots = [package / part for part in parts] or [package]
    found = {path for root in roots for path in ([root] if root.suffix == ".py" else root.rglob("*.py"))
             if path.relative_to(package).parts[0] not in _NOT_CODE}
    missing = [str(root.relative_to(package)) for root in roots if not root.exists()]
    if missing:
        raise FileNotFoundError(f"batchfit has no {', '.join(missing)} (a source digest names it)")
    return sorted(found)


def sources_digest(files: Iterable[Path], root: Path = PACKAGE) -> str:
    """sha256 over the ``root``-relative names and contents of ``files``: a renamed or moved module
    changes it as an edited one does."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(Path(path).relative_to(root).as_posix().encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()
