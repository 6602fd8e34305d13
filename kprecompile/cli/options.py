"""Options shared by the commands, declared once, and the request they resolve to."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from ..cache.layout import CacheLayout
from ..errors import InputError
from ..inputs.environment import DEFAULT_ENGINE, ENGINES
from ..inputs.serve_line import ServeLine, human_readable_int, log_ignored, read_line, read_with_parser
from ..inputs.serving import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    KV_CACHE_DTYPES,
    ServingParams,
)
from ..selection.request import Request, parse_capture_sizes, resolve_requests
from ..vllm.releases import DEFAULT_RELEASE
from ..vllm.serve_parser import serve_flags
from . import completion

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

_SERVING_OPTIONS = (
    "tensor_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "kv_cache_dtype",
    "dtype",
    "enforce_eager",
    "num_speculative_tokens",
    "trust_remote_code",
)
_SELECTION_OPTIONS = (
    "speculative_config",
    "revision",
    "model_spec",
    "target_names",
    "cudagraph_capture_sizes",
    "engine",
    "vllm_version",
    "attention_backend",
    "families",
)


class OneOf(click.Choice):
    """A closed set: `--help` lists it and the shell completes it (click's Choice); a value
    outside it is refused as every input error is, in one line naming the option."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.choices:
            return value
        field = max(param.opts, key=len) if param is not None else "value"
        raise InputError(field, value, "one of " + ", ".join(self.choices))


def combined(options: list[Decorator]) -> Decorator:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def selection_options(multiple_models: bool = False) -> Decorator:
    """The model, serving parameters, engine selection and targets (bake takes several models)."""
    return combined(
        [
            click.argument("serve_line", nargs=-1, type=click.UNPROCESSED, metavar="[MODEL] [VLLM SERVE FLAGS]..."),
            click.option(
                "--model",
                "model_spec",
                multiple=multiple_models,
                metavar="MODEL",
                shell_complete=completion.models,
                help="Preset name, path to a config.json or a directory holding one, or a Hugging Face id "
                "(org/name) in the local Hugging Face cache" + ("; repeatable." if multiple_models else "."),
            ),
            click.option(
                "--trust-remote-code",
                is_flag=True,
                help="Let vLLM run the model's own code for its config (its auto_map), as vllm serve "
                "--trust-remote-code does.",
            ),
            click.option(
                "--revision",
                default=None,
                metavar="REV",
                help="Branch, tag or commit of a Hugging Face --model [default: main].",
            ),
            click.option(
                "-tp",
                "--tp",
                "--tensor-parallel-size",
                "tensor_parallel_size",
                type=int,
                default=1,
                show_default=True,
                help="Tensor-parallel size: attention heads are split across this many ranks.",
            ),
            click.option(
                "--target",
                "target_names",
                multiple=True,
                default=("auto",),
                show_default=True,
                metavar="TARGET",
                shell_complete=completion.targets,
                help="GPU to compile for (gfx942, gfx950, sm90, ...) or auto; repeatable.",
            ),
            click.option(
                "--max-num-seqs",
                type=int,
                default=DEFAULT_MAX_NUM_SEQS,
                show_default=True,
                help="Most sequences in one step (vLLM --max-num-seqs): the largest decode batch.",
            ),
            click.option(
                "--max-num-batched-tokens",
                type=int,
                default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                show_default=True,
                help="Most tokens in one step (vLLM --max-num-batched-tokens): the largest prefill chunk.",
            ),
            click.option(
                "--max-model-len",
                default=None,
                metavar="N",
                help="Longest sequence, as vllm serve takes it (8192, 32k, 32K, auto) "
                "[default: the config's max_position_embeddings].",
            ),
            click.option(
                "--block-size",
                type=int,
                default=DEFAULT_BLOCK_SIZE,
                show_default=True,
                help="KV-cache tokens per block.",
            ),
            click.option(
                "--kv-cache-dtype",
                type=OneOf(KV_CACHE_DTYPES),
                default="auto",
                show_default=True,
                help="auto (the model dtype), fp8 or fp8_e4m3 (the target's FP8).",
            ),
            click.option(
                "--dtype",
                default="auto",
                show_default=True,
                callback=_dtype,
                shell_complete=completion.dtypes,
                help="auto, bfloat16, float16 or half (vLLM's spellings).",
            ),
            click.option(
                "--cudagraph-capture-sizes",
                default=None,
                metavar="N,N,...",
                help="Token counts graphs are captured for [default: vLLM's rule from --max-num-seqs].",
            ),
            click.option("--enforce-eager", is_flag=True, help="The engine runs without CUDA/HIP graphs."),
            click.option(
                "--num-speculative-tokens",
                type=int,
                default=0,
                show_default=True,
                help="Draft tokens per step (MTP / speculative decoding).",
            ),
            click.option(
                "--speculative-config",
                "speculative_config",
                default=None,
                metavar="JSON",
                help="vLLM's speculative config; its num_speculative_tokens is used.",
            ),
            click.option(
                "--engine",
                type=OneOf(ENGINES),
                default=DEFAULT_ENGINE,
                show_default=True,
                help=f"{' or '.join(ENGINES)}: vllm-aiter is vLLM with VLLM_ROCM_USE_AITER=1 unless set, vllm "
                "vLLM's own defaults, aiter AITER's API called directly.",
            ),
            click.option(
                "--vllm-version",
                default=None,
                metavar="VERSION",
                help="The vLLM release the server runs: its backend selection and capture sizes "
                f"[default: the installed vLLM's, else {DEFAULT_RELEASE}].",
            ),
            click.option(
                "--family",
                "families",
                multiple=True,
                metavar="FAMILY",
                shell_complete=completion.families,
                help="Plan only this kernel family (fp8_bmm, mla_decode, ...); repeatable "
                "[default: all the engine runs].",
            ),
            click.option(
                "--attention-backend",
                default=None,
                shell_complete=completion.attention_backends,
                help="The engine's attention backend [env: VLLM_ATTENTION_BACKEND; default: chosen from the flags].",
            ),
            json_option,
        ]
    )


json_option = click.option("--json", "json_output", is_flag=True, help="Print one JSON document.")
signing_key_option = click.option(
    "--signing-key",
    "signing_key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The ed25519 private key to sign the archive with (`kprecompile key generate`); "
    "default $KPRECOMPILE_SIGNING_KEY.",
)

# vLLM's own spellings of --dtype.
DTYPE_SPELLINGS = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}


def _dtype(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value.lower() not in DTYPE_SPELLINGS:
        raise InputError("--dtype", value, "auto, bfloat16, float16 or half (serving in float32 is not planned)")
    return DTYPE_SPELLINGS[value.lower()]


def speculative_tokens(config: str | None, num_speculative_tokens: int) -> int:
    """Draft tokens per step from vLLM's `--speculative-config` JSON, or --num-speculative-tokens."""
    if config is None:
        return num_speculative_tokens
    try:
        document = json.loads(config)
    except (ValueError, RecursionError):
        raise InputError(
            "--speculative-config",
            config[:80],
            'a JSON object such as \'{"method": "mtp", "num_speculative_tokens": 1}\'',
        ) from None
    tokens = document.get("num_speculative_tokens") if isinstance(document, dict) else None
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise InputError("--speculative-config", config[:80], "a JSON object with an integer num_speculative_tokens")
    if num_speculative_tokens not in (0, tokens):
        expected = f"the same as --speculative-config's num_speculative_tokens ({tokens}), or left out"
        raise InputError("--num-speculative-tokens", num_speculative_tokens, expected)
    return tokens


def _cache_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # An empty path would be the current directory: never a cache root by accident.
    if value is not None and not value.strip():
        raise InputError("--cache-dir", value, "a directory path")
    return value


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    callback=_cache_dir,
    help="Cache root [env: KPRECOMPILE_CACHE_DIR; default: the user cache directory].",
)


class ServeLineCommand(click.Command):
    """A command that takes a `vllm serve` line (`plan`, `warm`, `verify`, `export`, `bake`): its own
    options are click's; a positional model and the flags it does not declare go, untouched, to
    its `serve_line` argument (`inputs/serve_line.py` reads them)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, split_serve_line(self, args))


def split_serve_line(command: click.Command, words: list[str]) -> list[str]:
    """A serve-line command's words as click should see them: its own options first, then `--` and
    the rest of the `vllm serve` line untouched (click would read `-O.mode=3` as a cluster of
    one-letter options, `-h` among them). A list its own option takes the way vllm serve spells
    it (`--cudagraph-capture-sizes 1 2 4`) is joined with commas."""
    arities: dict[str, int] = {"-h": 0, "--help": 0}  # click adds its help option to every command
    for param in command.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                arities[name] = 0 if param.is_flag or param.count else param.nargs
    table = serve_flags()
    own, rest, index = [], [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            rest += words[index:]
            break
        name, equals, _ = word.partition("=")
        arity = arities.get(name) if word.startswith("-") else None
        if arity is None:
            rest.append(word)
            continue
        if equals or arity == 0:
            own.append(word)
            continue
        values = words[index : index + arity]
        index += len(values)
        if table.get(name) in ("+", "*"):  # vllm serve's list spelling: the words up to the next flag
            while index < len(words) and not words[index].startswith("-"):
                values = [",".join([*values, words[index]])]
                index += 1
        own += [word, *values]
    return [*own, "--", *rest] if rest else own


def requests(options: dict[str, Any], layout: CacheLayout | None = None) -> tuple[Request, ...]:
    """Resolve the selection options (popped from `options`) into checked requests; where vLLM's
    own selector is asked, its answers are remembered in `layout`'s cache."""
    selection = {name: options.pop(name) for name in _SELECTION_OPTIONS}
    chosen = {name: options.pop(name) for name in _SERVING_OPTIONS}
    line = _serve_line(options.pop("serve_line"), chosen, selection)
    chosen["num_speculative_tokens"] = speculative_tokens(
        selection["speculative_config"], chosen["num_speculative_tokens"]
    )
    serving = ServingParams(
        **chosen,
        cudagraph_capture_sizes=parse_capture_sizes(selection["cudagraph_capture_sizes"]),
    )
    specs = selection["model_spec"]
    several = isinstance(specs, tuple)  # bake's repeatable --model
    specs = tuple(specs) if several else (specs,) if specs else ()
    if line.model is not None:
        if specs and not several and line.model != specs[0]:
            expected = f"the positional model ({line.model}), or left out: vllm serve takes one model"
            raise InputError("--model", specs[0], expected)
        specs = tuple(dict.fromkeys([*specs, line.model]))
    if not specs:
        raise InputError("--model", "nothing", "a model: positional, as vllm serve takes it, or --model")
    resolved = resolve_requests(
        specs,
        serving,
        selection["target_names"],
        engine=selection["engine"],
        attention_backend=selection["attention_backend"],
        families=selection["families"],
        vllm_release=selection["vllm_version"],
        layout=layout,
        revision=selection["revision"],
    )
    if line.quantization is not None:
        for request in resolved:
            _check_quantization(request.model, line.quantization)
    return resolved


def _serve_line(words: tuple[str, ...], chosen: dict[str, Any], selection: dict[str, Any]) -> ServeLine:
    """Read the rest of a `vllm serve` line into the options (see `inputs/serve_line.py`): where vLLM
    is importable, by its own parser, else against the table of its flags; only when the line has
    more than kprecompile's own options, or a model length that is not a plain number."""
    raw_length = chosen["max_model_len"]
    plain_length = raw_length is None or raw_length.strip().isdigit()
    if not words and plain_length:
        chosen["max_model_len"] = None if raw_length is None else int(raw_length)
        return ServeLine()
    parser = _release_parser(selection)
    if parser is None:
        own = [name for param in click.get_current_context().command.params for name in getattr(param, "opts", ())]
        line = read_line(words, serve_flags(), own)
        chosen["max_model_len"] = None if raw_length is None else human_readable_int(raw_length)
    else:
        line, chosen["max_model_len"] = read_with_parser(words, parser, raw_length)
    for name, value in line.settings:
        if name in chosen:
            chosen[name] = value
        elif name == "speculative_config" and isinstance(value, dict | str):
            selection[name] = value if isinstance(value, str) else json.dumps(value)
        elif name in selection and isinstance(value, str | None):
            selection[name] = value
        else:  # a setting kprecompile cannot read in this form: refused, not ignored
            raise InputError(f"--{name.replace('_', '-')}", value, "the form vllm serve documents for it")
    if line.cudagraph_capture_sizes is not None:
        given = parse_capture_sizes(selection["cudagraph_capture_sizes"])
        if given is not None and sorted(set(given)) != sorted(set(line.cudagraph_capture_sizes)):
            raise InputError(
                "--cudagraph-capture-sizes",
                selection["cudagraph_capture_sizes"],
                "the sizes the line's compilation config names, or left out",
            )
        selection["cudagraph_capture_sizes"] = ",".join(str(size) for size in line.cudagraph_capture_sizes)
    if line.attention_backend is not None:
        if selection["attention_backend"] not in (None, line.attention_backend):
            raise InputError(
                "--attention-backend",
                selection["attention_backend"],
                f"the line's attention config's backend ({line.attention_backend}), or left out",
            )
        selection["attention_backend"] = line.attention_backend
    log_ignored(line)
    return line


def _release_parser(selection: dict[str, Any]) -> Any:
    """The installed release's `vllm serve` parser, when that release is the one planned for."""
    from ..inputs.targets import resolve_target
    from ..vllm.releases import installed_release
    from ..vllm.serve_parser import release_parser

    installed = installed_release()
    if installed is None or selection["vllm_version"] not in (None, installed):
        return None
    return release_parser(resolve_target(selection["target_names"][0]))


def _check_quantization(model: Any, quantization: str) -> None:
    """vLLM refuses a --quantization other than the checkpoint's own; without one, it would quantize
    the weights at load, which kprecompile does not plan."""
    config = model.quantization
    method = config.get("quant_method") if config is not None else None
    if method is None:
        raise InputError(
            "--quantization",
            quantization,
            f"left out: {model.name} has no quantization_config (kprecompile plans checkpoints as quantized)",
        )
    if str(method).lower() != quantization.lower():
        raise InputError(
            "--quantization", quantization, f"{method}, the quantization of {model.name}'s checkpoint (or left out)"
        )


def request(options: dict[str, Any], layout: CacheLayout | None = None) -> Request:
    [single] = requests(options, layout)
    return single
