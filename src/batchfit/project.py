"""Your own project folder: where the installed workflow lives, and what ``batchfit init`` writes.

A project is a folder with its own config, model, data and ``Snakefile``; the Snakefile uses
batchfit's workflow as a Snakemake module (``module batchfit: snakefile: workflow_snakefile()``),
so ``snakemake --cores N`` runs in the folder, with paths relative to it, and the project's own
rules sit next to batchfit's.
"""

from __future__ import annotations

import importlib.resources
import json
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit import __version__
from batchfit.errors import BatchfitError
from batchfit.schema import config_schema

# What `batchfit init` writes that is not generated: from the package. The example model is a copy
# of the repository's models/hierarchical.py (tests/unit/test_project.py keeps the two equal); not named
# *.py: it is the user's code to be, which batchfit's linters and code digest leave alone.
_TEMPLATE = "template"
# Keys `init` sets; every other key of the schema is written commented out, with its default.
_SET_KEYS = {
    "model": "model.py",
    "datasets": ["data/*.csv"],
}
_EXAMPLE_DATASETS = 3
_MODEL_HEADER = """\
# The model of this project: batchfit's example (models/hierarchical.py), to adapt. The contract
# (batchfit's docs/model.md): build_model(data) returns a pm.Model; every array that
# differs between datasets enters as pm.Data(name, data[name]), named after its column; labels
# come from data.coords[column] and a dimension is not named like a pm.Data container; the
# structure does not depend on the data values. simulate(rng, index) is optional (`batchfit
# simulate`, and `batchfit init` drew data/ with it). Modules beside this file can be imported
# (`from helpers import ...`); editing one refits, as editing this file does.
"""
_WIDTH = 100


def workflow_snakefile() -> Path:
    """The Snakefile of batchfit's workflow, for ``module batchfit: snakefile: ...`` in a project.

    The workflow lives in the package, ``batchfit/workflow/``, in a wheel as in a source checkout
    (whose own ``Snakefile`` uses it too). Snakemake resolves the rules' ``script:``, ``conda:``,
    ``report:`` and schema paths relative to the rule files, inside the package.
    """
    path = Path(__file__).parent / "workflow" / "Snakefile"
    if not path.is_file():
        raise BatchfitError(f"batchfit's workflow is missing from the installed package ({path}); reinstall batchfit")
    return path


@dataclass(frozen=True)
class InitReport:
    """What `init_project` did: the files it wrote, and the files a ``data/`` it left alone holds."""

    root: Path
    written: list[Path]
    users_data: list[Path]

    def one_line(self) -> str:
        line = f"init: wrote {len(self.written)} files in {self.root}"
        if self.users_data:
            line += (f"; {self.root / 'data'} already holds {len(self.users_data)} file(s) of yours, so no example "
                     "data were written there: set config.yaml's datasets to them (files, or a table split by key "
                     "columns: {table: data/your.csv, by: ID})")
        return f"{line}; there, run: snakemake --cores 2"


def init_project(directory: str | Path) -> InitReport:
    """Scaffold a project in ``directory`` (created if needed).

    Writes config.yaml (every key of the config schema, documented), model.py (the bundled
    example model), the Snakefile, profiles/ (local and SLURM), a .gitignore and, unless data/
    already holds files (the user's own), data/ with a few simulated datasets. Refuses, writing
    nothing, when any of these files exists.
    """
    root = Path(directory)
    files = _project_files()
    existing = [root / name for name in files if (root / name).exists() or (root / name).is_symlink()]
    if existing:
        raise BatchfitError(f"batchfit init: {root} already has {', '.join(map(str, existing))}; "
                            "refusing to overwrite (choose an empty folder, or move these files away)")
    data = root / "data"
    users_data = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else []
    written = []
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    if not users_data:
        written += _write_example_data(root / "model.py", data)
    return InitReport(root, written, users_data)


def _project_files() -> dict[str, str]:
    """Relative path -> content of every file `init_project` writes, but the data."""
    template = importlib.resources.files("batchfit").joinpath(_TEMPLATE)
    profiles = importlib.resources.files("batchfit").joinpath("workflow", "profiles")
    files = {
        "config.yaml": config_template(),
        "model.py": _MODEL_HEADER + template.joinpath("model.py.template").read_text("utf-8"),
        "Snakefile": template.joinpath("Snakefile").read_text("utf-8"),
        ".gitignore": template.joinpath("gitignore").read_text("utf-8"),
    }
    for name in ("default", "slurm"):
        files[f"profiles/{name}/config.yaml"] = profiles.joinpath(name, "config.yaml").read_text("utf-8")
    return files


def _write_example_data(model: Path, data: Path) -> list[Path]:
    """A few datasets drawn by the example model's ``simulate`` (seeded: the same every time)."""
    from batchfit.model.simulate import simulate_datasets  # NumPy and PyMC: only for `batchfit init`

    return simulate_datasets(model, data, _EXAMPLE_DATASETS, prefix="dataset")


def config_template() -> str:
    """config.yaml of a new project: every key of the config schema with its description.

    Generated from the schema, so it lists exactly the keys batchfit reads. The keys `init`
    sets are active; every other one is commented out with its default, so removing the ``# ``
    of a line (and of its section's line) sets it.
    """
    schema = config_schema()
    lines = [f"# batchfit {__version__} config of this project (written by `batchfit init`).",
             *_comment(schema["description"], ""),
             "# Run snakemake and batchfit in this folder: the relative paths below are relative to it.",
             "# Keys commented out have the value shown, batchfit's default; remove the '# ' to change one.", ""]
    for key, spec in schema["properties"].items():
        if key in _SET_KEYS:
            lines += [*_comment(_describe(spec), ""), f"{key}: {json.dumps(_SET_KEYS[key])}", ""]
        else:
            lines += [*(f"# {line}" for line in _entry(key, spec, "")), ""]
    return "\n".join(lines)


def _entry(key: str, spec: Mapping[str, Any], indent: str) -> list[str]:
    """One key with its description and default; a section's keys nested under it."""
    lines = _comment(_describe(spec), indent)
    children = dict(_children(spec))
    if not children:
        return lines + [f"{indent}{key}:" + (f" {json.dumps(spec['default'])}" if "default" in spec else "")]
    lines.append(f"{indent}{key}:")
    for name, child in children.items():
        lines += _entry(name, child, indent + "  ")
    return lines


def _children(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """A section's keys; for a map of named entries (``columns``), one example entry."""
    yield from spec.get("properties", {}).items()
    extra = spec.get("additionalProperties")
    if isinstance(extra, Mapping) and "properties" in extra:
        yield "your_column", {"description": "one entry per text column, by its name", **extra}


def _describe(spec: Mapping[str, Any]) -> str:
    """A key's description, and its choices when it has a fixed set."""
    text = " ".join(str(spec.get("description", "")).split())
    choices = spec.get("enum")
    if choices and "default" not in spec:
        text += " One of: " + ", ".join(map(json.dumps, choices)) + "."
    return text


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, _WIDTH - len(indent) - 2)]
