"""Finding a Triton kernel's definition in an installed library's source without importing it.

Importing a module runs its top-level code. A journal record names its kernel as
`module:qualified.name`, and journals travel in archives, so replay must not import a module
because a record names it: it first finds the module's file through the package's search path
(as the import system would, executing nothing, not even the packages above it) and reads it,
and only a file that defines a Triton kernel of that name is imported, by the tracing that
imports the library's modules anyway.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import keyword
import os
from pathlib import Path

# A library's largest kernel module is a few hundred kilobytes.
MAX_SOURCE_BYTES = 4 << 20


class KernelSourceError(Exception):
    """Why a record's kernel was not found in its library's source."""


def well_formed_module(module: str) -> bool:
    """Whether `module` is an absolute dotted name of plain identifiers: no relative name, no
    keyword, no dunder part (`x.__main__` runs a command line at import)."""
    parts = module.split(".")
    return all(
        part.isidentifier() and not keyword.iskeyword(part) and not (part.startswith("__") and part.endswith("__"))
        for part in parts
    )


def well_formed_qualname(qualname: str) -> bool:
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in qualname.split("."))


def module_file(module: str) -> Path | None:
    """The source file of `module`, found as the import system finds it, executing nothing;
    None when its top-level package is not installed. KernelSourceError when the package has
    no such module or it is not a Python source file."""
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name is only searched for, never run
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    if not rest:
        origin = spec.origin if isinstance(spec.loader, importlib.machinery.SourceFileLoader) else None
        if not origin:
            raise KernelSourceError(f"{module} is not a Python source file")
        return Path(origin)
    if spec.submodule_search_locations is None:
        raise KernelSourceError(f"{top} is not a package")
    locations = [str(location) for location in spec.submodule_search_locations]
    name = top
    for index, part in enumerate(rest):
        name = f"{name}.{part}"
        found = _find_in(locations, part)
        if found is None:
            raise KernelSourceError(f"the installed {top} has no module {name}")
        path, locations = found
        if index < len(rest) - 1 and not locations:
            raise KernelSourceError(f"{name} is not a package")
    if path is None:
        raise KernelSourceError(f"{module} is a namespace package, with no source")
    return path


def _find_in(locations: list[str], part: str) -> tuple[Path | None, list[str]] | None:
    """`part` in a package's directories as Python's path finder finds it (a package, else a
    module, else the directories of a namespace package): (its source file, its own
    directories when a package); None when absent. PathFinder itself cannot be asked: for a
    namespace package it reads the parent module, which must not be imported."""
    namespace = []
    for location in locations:
        directory = os.path.join(location, part)
        if os.path.isfile(os.path.join(directory, "__init__.py")):
            return Path(directory, "__init__.py"), [directory]
        if any(os.path.exists(os.path.join(location, part + suffix)) for suffix in _EXTENSION_SUFFIXES):
            raise KernelSourceError(f"{part} in {location} is a compiled extension, not a Python source file")
        if os.path.isfile(directory + ".py"):
            return Path(directory + ".py"), []
        if os.path.isdir(directory):
            namespace.append(directory)
    return (None, namespace) if namespace else None


_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def defines_kernel(path: Path, qualname: str) -> bool:
    """Whether the source at `path` defines `qualname` as a function decorated with a `jit`
    (`triton.jit`, `gluon.jit`, with or without arguments), at module level or in a class,
    also inside `if`, `try` and `with` blocks (vLLM defines ROCm kernels under
    `if current_platform.is_rocm():`)."""
    with path.open("rb") as file:
        source = file.read(MAX_SOURCE_BYTES + 1)
    if len(source) > MAX_SOURCE_BYTES:
        return False
    try:
        statements = ast.parse(source, filename=str(path)).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    *classes, name = qualname.split(".")
    for class_name in classes:
        found = [node for node in _definitions(statements) if isinstance(node, ast.ClassDef)]
        named = [node for node in found if node.name == class_name]
        if not named:
            return False
        statements = named[-1].body
    return any(
        isinstance(node, ast.FunctionDef) and node.name == name and any(_is_jit(d) for d in node.decorator_list)
        for node in _definitions(statements)
    )


def _definitions(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a block, with those of its `if`, `try` and `with` blocks (never a
    function's: a kernel defined in a function cannot be looked up by name)."""
    found: list[ast.stmt] = []
    for statement in statements:
        if isinstance(statement, (ast.If, ast.Try, ast.TryStar)):
            blocks = [statement.body, statement.orelse]
            if isinstance(statement, (ast.Try, ast.TryStar)):
                blocks += [statement.finalbody, *(handler.body for handler in statement.handlers)]
            for block in blocks:
                found += _definitions(block)
        elif isinstance(statement, ast.With):
            found += _definitions(statement.body)
        else:
            found.append(statement)
    return found


def _is_jit(decorator: ast.expr) -> bool:
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Attribute):
        return decorator.attr == "jit"
    return isinstance(decorator, ast.Name) and decorator.id == "jit"
