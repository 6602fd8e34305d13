"""A pasted `vllm serve` line: its positional model and the flags kprecompile does not declare.

`kprecompile warm deepseek-ai/DeepSeek-R1 --tensor-parallel-size 8 --port 8000` takes a `vllm
serve` line as it is. kprecompile's own options read the flags that change kernels; the rest of
the line is read here. Where vLLM is importable, by the release's own `vllm serve` parser (its
spellings: `--max-model-len 32k`, `-O3`, `--compilation-config.cudagraph_capture_sizes`); without
it, against the table of every flag the supported releases take (`vllm/serve_flags.json`) and a
mirror of vLLM's human-readable integers. A flag that changes kernels in a way kprecompile does not
plan is refused, naming it; the others are accepted and listed once at INFO.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

logger = logging.getLogger(__name__)

# Flags whose values kprecompile reads from the rest of the line, by vLLM's destination name.
_CAPTURE_FLAGS = ("--compilation-config", "-cc", "-O", "--cuda-graph-sizes")
_ATTENTION_CONFIG_FLAGS = ("--attention-config", "-ac")
_QUANTIZATION_FLAGS = ("--quantization", "-q")
# Flags that change the model kprecompile reads or the kernels it plans, which it cannot follow.
_REFUSED = {
    "--hf-overrides": "left out: give a config.json with the overrides applied as --model",
    "--hf-config-path": "left out: give that config as --model",
}


@dataclass(frozen=True)
class ServeLine:
    """What the rest of a `vllm serve` line says that decides kernels."""

    model: str | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    attention_backend: str | None = None
    quantization: str | None = None
    # The flags accepted and not read, as given (for the INFO line).
    ignored: tuple[str, ...] = field(default=())
    # Settings kprecompile's own options read that the line set another way (vLLM's parser takes
    # abbreviations and aliases: `--max-num-seq 8`), by vLLM's name for them.
    settings: tuple[tuple[str, Any], ...] = ()


# vLLM's names of the settings kprecompile's own options read.
OWN_SETTINGS = (
    "tensor_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_dtype",
    "dtype",
    "enforce_eager",
    "trust_remote_code",
    "revision",
    "speculative_config",
    "attention_backend",
)


def human_readable_int(value: str, field_name: str = "--max-model-len") -> int | None:
    """vLLM's spellings of a token count (`argparse_utils.human_readable_int_or_auto`, newest
    release): `32k` is 32,000, `32K` 32,768, `25.6k` 25,600; `auto` or -1 is None (vLLM derives it)."""
    text = value.strip()
    if text.lower() == "auto" or text == "-1":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    try:
        if match is None:
            return int(text)
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
    except ValueError:
        raise InputError(field_name, value, "a token count as vllm serve takes it (8192, 32k, 32K, auto)") from None


def split_flag(word: str) -> tuple[str, str | None]:
    """`--port=8000` -> ('--port', '8000'); `-O3` -> ('-O', '3'); `-O.mode=3` -> ('-O', 'mode=3');
    `-cc.mode=3` -> ('-cc.mode', '3'), whose caller splits the key from the flag."""
    name, equals, value = word.partition("=")
    if name.startswith("-O") and not name.startswith("--") and name != "-O":
        return "-O", name[2:].lstrip(".") + (equals + value if equals else "")
    return name, value if equals else None


def read_without_vllm(
    words: Sequence[str], flags: dict[str, str], own_options: Sequence[str] = ()
) -> tuple[str | None, dict[str, list[str]], list[str]]:
    """(positional model, values by flag, flags as given) of a `vllm serve` line's words, with the
    table's arities; an unknown flag is an input error naming the nearest ones."""
    model, values, given = None, {}, []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-") or _is_number(word):
            if model is not None:
                raise InputError("MODEL", word, f"one positional model, as vllm serve takes it (got {model} first)")
            model = word
            continue
        name, inline = split_flag(word)
        base, dot, _ = name.partition(".")  # `--compilation-config.mode=3`: a key of a JSON flag
        known = flags.get(name) or (flags.get(base) if dot else None)
        if known is None:
            names = [*own_options, *(flag for flag in flags if flag.startswith("--"))]
            near = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=3)
            expected = "an option of kprecompile's or a flag vllm serve takes" + (
                f" ({', '.join(near)}?)" if near else ""
            )
            raise InputError("option", name, expected)
        given.append(word)
        taken: list[str] = [] if inline is None else [inline]
        if inline is None and known != "0":
            while index < len(words) and (not words[index].startswith("-") or _is_number(words[index])):
                taken.append(words[index])
                index += 1
                if known in ("1", "?"):
                    break
            if known in ("1", "+") and not taken:
                raise InputError(name, "no value", "a value, as vllm serve takes it")
        values.setdefault(base if dot else name, []).append(
            f"{name[len(base) + 1 :]}={taken[0] if taken else ''}" if dot else " ".join(taken)
        )
    return model, values, given


def _is_number(word: str) -> bool:
    return re.fullmatch(r"-?\d+(\.\d+)?", word) is not None


def read_line(words: Sequence[str], flags: dict[str, str], own_options: Sequence[str] = ()) -> ServeLine:
    """The line read against the table (a builder without vLLM); `own_options`, the command's, are
    suggested for a flag neither takes."""
    model, values, given = read_without_vllm(words, flags, own_options)
    for flag, expected in _REFUSED.items():
        if flag in values:
            raise InputError(flag, values[flag][0], expected)
    capture = None
    for flag in _CAPTURE_FLAGS:
        for value in values.get(flag, ()):
            sizes = _capture_sizes(flag, value)
            capture = sizes if sizes is not None else capture
    backend = None
    for flag in _ATTENTION_CONFIG_FLAGS:
        for value in values.get(flag, ()):
            backend = _json_field(flag, value, "backend") or backend
    quantization = next((values[flag][-1] for flag in _QUANTIZATION_FLAGS if flag in values), None)
    read = {*_CAPTURE_FLAGS, *_ATTENTION_CONFIG_FLAGS, *_QUANTIZATION_FLAGS}
    ignored = tuple(word for word in given if split_flag(word)[0].partition(".")[0] not in read)
    return ServeLine(model, capture, backend, quantization, ignored)


def _capture_sizes(flag: str, value: str) -> tuple[int, ...] | None:
    if flag == "--cuda-graph-sizes":
        return tuple(_positive(flag, part) for part in value.split())
    if value.startswith("cudagraph_capture_sizes="):
        text = value.partition("=")[2]
        try:
            parts = json.loads(text) if text.startswith("[") else text.split(",")
        except ValueError:
            raise InputError(flag, value, "cudagraph_capture_sizes=[1,2,4], as vllm serve takes it") from None
        if not isinstance(parts, list):
            raise InputError(flag, value, "cudagraph_capture_sizes=[1,2,4], as vllm serve takes it")
        return tuple(_positive(flag, part) for part in parts)
    if value.startswith("{"):
        sizes = _json_field(flag, value, "cudagraph_capture_sizes")
        if sizes is not None and not isinstance(sizes, list):
            raise InputError(flag, value[:80], "cudagraph_capture_sizes as a list of token counts")
        return None if sizes is None else tuple(_positive(flag, part) for part in sizes)
    return None  # an optimization level, or another key: no capture sizes


def _json_field(flag: str, value: str, key: str) -> Any:
    if not value.startswith("{"):
        return value.partition("=")[2] or None if value.startswith(f"{key}=") else None
    try:
        document = json.loads(value)
    except ValueError:
        raise InputError(flag, value[:80], "a JSON object, as vllm serve takes it") from None
    return document.get(key) if isinstance(document, dict) else None


def _positive(flag: str, part: Any) -> int:
    try:
        number = 0 if isinstance(part, bool) else int(part)
    except (TypeError, ValueError):
        number = 0
    if number <= 0:
        raise InputError(flag, part, "positive token counts")
    return number


def read_with_parser(words: Sequence[str], parser: Any, max_model_len: str | None) -> tuple[ServeLine, int | None]:
    """The line read by the installed release's own `vllm serve` parser; also the model length
    as it reads `--max-model-len`."""
    line = [*words, *(["--max-model-len", max_model_len] if max_model_len is not None else [])]
    namespace = parser.parse_args(line)
    given = [word for word in words if word.startswith("-") and not _is_number(word)]
    for flag, expected in _REFUSED.items():
        if any(split_flag(word)[0] == flag for word in given) and getattr(namespace, flag[2:].replace("-", "_"), None):
            raise InputError(flag, getattr(namespace, flag[2:].replace("-", "_")), expected)
    names = {split_flag(word)[0].partition(".")[0] for word in given}
    capture = None
    if names & set(_CAPTURE_FLAGS):
        sizes = _attribute(getattr(namespace, "compilation_config", None), "cudagraph_capture_sizes")
        old = getattr(namespace, "cuda_graph_sizes", None) if "--cuda-graph-sizes" in names else None
        capture = tuple(sizes) if sizes else tuple(old) if old else None
    backend = None
    if names & set(_ATTENTION_CONFIG_FLAGS):
        backend = _attribute(getattr(namespace, "attention_config", None), "backend")
        backend = getattr(backend, "name", backend)
    quantization = getattr(namespace, "quantization", None) if names & set(_QUANTIZATION_FLAGS) else None
    read = {*_CAPTURE_FLAGS, *_ATTENTION_CONFIG_FLAGS, *_QUANTIZATION_FLAGS}
    ignored = tuple(
        word
        for word in given
        if split_flag(word)[0].partition(".")[0] not in read
        and _destination(parser, split_flag(word)[0]) not in OWN_SETTINGS
    )
    model = getattr(namespace, "model_tag", None)
    length = getattr(namespace, "max_model_len", None) if max_model_len is not None else None
    settings = tuple(
        (name, _plain(getattr(namespace, name)))
        for name in OWN_SETTINGS
        if hasattr(namespace, name) and getattr(namespace, name) != parser.get_default(name)
    )
    line = ServeLine(model, capture, backend, quantization, ignored, settings)
    return line, (None if length == -1 else length)


def _destination(parser: Any, flag: str) -> str | None:
    """The setting a flag sets in an argparse parser, abbreviations included (argparse's rule: a
    prefix of exactly one option)."""
    actions = parser._option_string_actions
    if flag in actions:
        return actions[flag].dest
    matches = {actions[name].dest for name in actions if name.startswith(flag)}
    return matches.pop() if len(matches) == 1 else None


def _plain(value: Any) -> Any:
    """An enum's name (vLLM parses `--attention-backend` into one from 0.13), else the value."""
    import enum

    return value.name if isinstance(value, enum.Enum) else value


def _attribute(value: Any, name: str) -> Any:
    if value is None:
        return None
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def log_ignored(line: ServeLine, log: Callable[..., None] = logger.info) -> None:
    if line.ignored:
        log("vllm serve flags not read (they change no kernel kprecompile plans): %s", " ".join(line.ignored))
