"""The code's own checks, run by the suite so that CI runs them: ruff, the import layers, the workflow's lint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit import REPO

BIN = Path(sys.executable).parent
WORKFLOW_DIR = REPO / "src" / "batchfit" / "workflow"
WORKFLOW = [str(p.relative_to(REPO)) for p in [REPO / "Snakefile", WORKFLOW_DIR / "Snakefile",
                                                *sorted((WORKFLOW_DIR / "rules").glob("*.smk"))]]


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean():
    proc = run(str(BIN / "ruff"), "check", "src", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_import_layers_hold_and_no_import_cycle_exists():
    """pyproject.toml's import-linter contracts: cli over sweep over outputs over fitting over compile
    over cache over model over data over config; no cycle between the modules of any package."""
    proc = run(str(BIN / "lint-imports"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout


def test_snakemake_lint_is_clean():
    proc = run(str(BIN / "snakemake"), "--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_the_workflow_is_formatted_as_snakefmt_formats_it():
    proc = run(str(BIN / "snakefmt"), "--check", *WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_repository_holds_no_symlink():
    """The workflow lives in the package as files: a link would be a copy in a wheel or a zip, a text file
    in a Windows clone, and would make two places of one."""
    proc = run("git", "ls-files", "--stage")
    assert proc.returncode == 0, proc.stderr
    assert [line.split("\t", 1)[1] for line in proc.stdout.splitlines() if line.startswith("120000 ")] == []


def test_no_module_is_over_the_size_a_reader_takes_in():
    """A module has one job a reader can name; past a few hundred lines it has grown several (#44)."""
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in (REPO / "src").rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > 450} == {}


def test_every_batchfit_name_the_benchmarks_use_exists():
    """The benchmarks run rarely, outside the suite: a moved or renamed function must fail here, not
    months later in a benchmark (``throughput.py`` called ``fitter.fit_datasets`` after #44 moved it)."""
    import ast
    import importlib

    missing = []
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        tree = ast.parse(script.read_text())
        aliases = {}  # `import batchfit.x.y as name` -> the module, for `name.attr`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchfit"):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("batchfit"):
                        aliases[a.asname or a.name] = importlib.import_module(a.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and not hasattr(aliases[node.value.id], node.attr)):
                missing.append(f"{script.name}: {aliases[node.value.id].__name__}.{node.attr}")
    assert missing == []


def test_the_source_names_no_issue_numbers_or_benchmark_trails():
    """Code says what and why, not when: history is in commit messages and benchmarks/HISTORY.md, what a
    benchmark measured in benchmarks/README.md; an upstream issue is linked by its URL (which a pattern such
    as ``#43`` does not match)."""
    import re

    hits = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
            for path in sorted((REPO / "src").rglob("*")) if path.suffix in (".py", ".yaml", ".smk", ".rst", ".md")
            for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"#\d{2}|benchmarks/", line)]
    assert hits == []


def test_no_test_module_imports_another():
    """Shared test helpers live in tests/testkit/: a test module importing another runs that module's
    fixtures and module-level work, and ties the two together."""
    import re

    hits = [f"{path.name}:{number}: {line.strip()}" for path in sorted((REPO / "tests").rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if re.match(r"(from|import) (tests\.)?test_\w+", line)]  # a child process's script may import its own
    assert hits == []
