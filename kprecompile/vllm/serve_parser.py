"""`vllm serve`'s own argument parser, and the table of its flags for builders without vLLM.

Where vLLM is importable, a pasted `vllm serve` line is read by the release's own parser: the one
`vllm/entrypoints/cli/serve.py` builds (found by reading that file, not by a list of module paths
that moves between releases), under the target's platform (its `EngineArgs` defaults ask the
device). Without vLLM, `serve_flags.json` says which flags the supported releases take and how
many values each reads: generated from their parsers by `scripts/serve_flags.py`, and checked
against each tested release's parser in tests/in_vllm.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..inputs.targets import Target

# {"releases": [...], "flags": {flag: arity}}, written by scripts/serve_flags.py.
FLAGS_TABLE = "serve_flags.json"


def arity(action: Any) -> str:
    """How many values a parser action reads, as the table records it: argparse's nargs, "0" for
    a switch, "1", "?", "*" or "+"."""
    if action.nargs is None:
        return "1"
    return str(action.nargs)


@functools.cache
def serve_flags() -> dict[str, str]:
    """Every option string some supported release's `vllm serve` takes, and its arity."""
    document = json.loads((resources.files(__package__) / FLAGS_TABLE).read_text())
    return document["flags"]


def _parser_module() -> str:
    """The module `vllm serve` takes `make_arg_parser` from, as its own source imports it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("vllm")
    source = Path(spec.origin).parent / "entrypoints" / "cli" / "serve.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "make_arg_parser" for alias in node.names):
            return node.module
    raise ImportError(f"{source} imports no make_arg_parser")


@functools.cache
def release_parser(target: Target) -> Any:
    """The installed release's `vllm serve` parser, built as on the target's host."""
    from ..platforms.vllm_platform import target_imports
    from ..tracing.libraries import import_library_module
    from .engine_config import plugin_hook_off

    with plugin_hook_off(), target_imports(target):
        flexible = import_library_module("vllm.utils.argparse_utils").FlexibleArgumentParser
        parser = import_library_module(_parser_module()).make_arg_parser(flexible(prog="vllm serve"))

    def refuse(message: str) -> None:
        raise InputError("vllm serve line", message, "what the installed vLLM's `vllm serve` takes")

    parser.error = refuse  # argparse prints usage and exits; kprecompile says one line
    return parser


def parser_flags(parser: Any) -> dict[str, str]:
    """Every option string of a parser and its arity (the table's rows)."""
    return {string: arity(action) for action in parser._actions for string in action.option_strings}
