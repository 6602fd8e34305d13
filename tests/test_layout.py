"""The package layout: each stage imports only the stages below it (CONTRIBUTING.md), lazy imports
and type-only imports included, so that the tree shows the data flow and no package loops."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "kprecompile"

# Bottom to top. The loose modules (errors, progress, wording, _version) are below everything; the
# package root (its lazy public API) and __main__ are above everything.
STAGES = ("cache", "inputs", "platforms", "tracing", "vllm", "shapes", "selection", "warmup", "serve", "cli")
FOUNDATION = ("errors", "progress", "wording", "_version")
TOP = ("__init__", "__main__")


def _stage(module: str) -> str:
    """`kprecompile.warmup.warming` -> `warmup`; a loose module is its own stage."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _rank(stage: str) -> int:
    if stage in FOUNDATION:
        return -1
    if stage in TOP:
        return len(STAGES)
    return STAGES.index(stage)


def imports_of(path: Path, source: str | None = None) -> list[tuple[str, int]]:
    """(imported kprecompile module, line) for every import in the file, at any depth."""
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(relative.parts[:-1])
    found = []
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names] if node.module is None else [target]
            found += [(name, node.lineno) for name in names if name.startswith("kprecompile")]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.startswith("kprecompile")]
    return found


def upward_imports(path: Path, source: str | None = None) -> list[str]:
    """Imports of `path` that reach a stage above its own."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    own = _stage(module)
    problems = []
    for imported, line in imports_of(path, source):
        stage = _stage(imported)
        if stage != own and _rank(stage) > _rank(own):
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {own} imports {imported} ({stage})")
    return problems


def test_every_package_is_a_known_stage():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert packages == set(STAGES)
    loose = {path.stem for path in PACKAGE.glob("*.py")}
    assert loose == set(FOUNDATION) | set(TOP)


def test_each_stage_imports_only_the_stages_below_it():
    problems = [problem for path in sorted(PACKAGE.rglob("*.py")) for problem in upward_imports(path)]
    assert problems == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("inputs/serving.py", "from ..vllm import releases\n"),  # a top-level import
        ("cache/layout.py", "def f():\n    from ..inputs import settings\n"),  # a lazy one
        ("tracing/trace.py", "import kprecompile.warmup.pool\n"),  # an absolute one
    ],
)
def test_an_upward_import_is_reported(module, source):
    # The negative control: the check sees each kind of import that would run back up.
    [problem] = upward_imports(PACKAGE / module, source)
    assert module in problem
