"""`kprecompile cache dir | ls | rm | prune`: see and manage what the cache holds, as `uv cache`
and `hf cache` do for theirs."""

from __future__ import annotations

import datetime
import re
import time

import click

from ..cache.inventory import Configuration, configurations, directory_size
from ..cache.pruning import DeletionPlan, execute, plan_prune, plan_rm
from ..cache.staging import importing
from ..cache.usage import using
from ..errors import InputError
from ..inputs import settings
from ..inputs.targets import resolve_target
from ..wording import human_size
from . import options
from .examples import epilog
from .output import Output, plural

_UNITS = {
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
# A unit is required (B for bytes): a bare `--max-size 10` was read as 10 bytes and evicted everything.
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)\s*", re.IGNORECASE)


# Kernel entries come by the thousand (one per kernel), and so do the lock files an earlier
# kprecompile left: the summary counts them, `-v` lists each, as uv's and hf's cache commands do.
_COUNTED_ONLY = frozenset({"entry", "lock"})


@click.group(name="cache")
def command() -> None:
    """See and manage what the cache holds (dir, ls, rm, prune)."""


@command.command(name="dir", epilog=epilog("cache dir"))
@options.cache_dir_option
@options.json_option
def cache_dir(cache_dir, json_output) -> None:
    """Print the cache root."""
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    output.document({"cache_dir": str(layout.root), "layers": [str(layer) for layer in layout.layers]})
    output.data(str(layout.root))


@command.command(name="ls", epilog=epilog("cache ls"))
@options.cache_dir_option
@options.json_option
def cache_ls(cache_dir, json_output) -> None:
    """List each configuration: model, serving parameters, engine, target, toolchain, kernels,
    size, last served and status, then totals."""
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    found = configurations(layout)
    current = _current_toolchains(layout, found)
    recorded = _recorded_counts(layout, found)
    documents = [
        {**configuration.as_dict(current.get(configuration.key)), "recorded": recorded[configuration.key]}
        for configuration in found
    ]
    unique = {
        name: size
        for configuration in found
        for name, size in [*configuration.entries.items(), *configuration.modules.items()]
    }
    root_bytes = directory_size(layout.root)
    output.document(
        {
            "cache_dir": str(layout.root),
            "configurations": documents,
            "kernels": len(unique),
            "kernel_bytes": sum(unique.values()),
            "cache_bytes": root_bytes,
        }
    )
    if not found:
        output.data(f"no configurations in {layout.root} ({human_size(root_bytes)})")
        return
    rows = [
        ["MODEL", "TARGET", "ENGINE", "SERVING", "TOOLCHAIN", "KERNELS", "RECORDED", "SIZE", "LAST SERVED", "STATUS"]
    ]
    for configuration, document in zip(found, documents, strict=True):
        toolchain = {True: "current", False: "other", None: "unknown"}[document["toolchain_current"]]
        rows.append(
            [
                document["model"] + ("" if configuration.writable else " (layer)"),
                document["target"],
                _engine_in_short(document),
                _serving_in_short(document["serving"]),
                toolchain,
                f"{document['kernels']:,}",
                f"{document['recorded']:,}",
                human_size(document["bytes"]),
                "never" if document["last_served"] is None else _ago(document["last_served"]),
                document["status"],
            ]
        )
    output.table(rows)
    output.data(
        f"{plural(len(found), 'configuration')}, {plural(len(unique), 'kernel')} "
        f"({human_size(sum(unique.values()))}); {layout.root}: {human_size(root_bytes)}"
    )


@command.command(name="rm", epilog=epilog("cache rm"))
@click.argument("manifests", nargs=-1, metavar="[MANIFEST]...")
@click.option("--model", "model_names", multiple=True, metavar="NAME", help="Configurations of this model.")
@click.option("--target", "target_names", multiple=True, metavar="TARGET", help="Configurations for this target.")
@click.option("--all", "everything", is_flag=True, help="Every configuration of the writable cache.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@options.cache_dir_option
@options.json_option
def cache_rm(manifests, model_names, target_names, everything, dry_run, cache_dir, json_output) -> None:
    """Remove configurations (by manifest key or prefix, model, target) and the kernels no other
    configuration uses."""
    if not (manifests or model_names or target_names or everything):
        raise InputError("cache rm", "nothing", "a MANIFEST key, --model, --target or --all")
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    # Product names and any case, as everywhere else (mi300x is gfx942).
    targets = {resolve_target(name).name for name in target_names}

    def chosen(configuration: Configuration) -> bool:
        return configuration.writable and (
            everything
            or (
                (not manifests or any(configuration.key.startswith(prefix) for prefix in manifests))
                and (not model_names or configuration.model_name.lower() in {m.lower() for m in model_names})
                and (not targets or configuration.target in targets)
            )
        )

    def selected() -> list[Configuration]:
        found = [configuration for configuration in configurations(layout) if chosen(configuration)]
        if not found:
            raise InputError(
                "cache rm",
                " ".join([*manifests, *model_names, *target_names]) or "--all",
                "configurations of the writable cache (see kprecompile cache ls)",
            )
        return found

    # A typo is said at once, not after a running warm lets go of the cache; but an import
    # unpacking now may be installing what was named, so then it is looked for once it is done.
    if not importing(layout):
        selected()
    with _deleting(layout, dry_run):
        plan = plan_rm(layout, selected())  # chosen again: the cache may have changed meanwhile
        _report(output, plan, dry_run, layout)


@command.command(name="prune", epilog=epilog("cache prune"))
@click.option(
    "--max-size",
    default=None,
    metavar="SIZE",
    help="Then evict the least recently served (or warmed) configurations until the cache fits "
    "(10G, 500MB, 2GiB, 4096B).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@options.cache_dir_option
@options.json_option
def cache_prune(max_size, dry_run, cache_dir, json_output) -> None:
    """Remove what this toolchain can never serve (other toolchains, other layout versions),
    kernels no configuration references, free locks and dead imports' staging."""
    limit = parse_size(max_size) if max_size is not None else None
    output = Output(json_output)
    layout = settings.cache_layout(cache_dir)
    with _deleting(layout, dry_run):
        found = configurations(layout)
        current = _current_toolchains(layout, found)
        plan = plan_prune(layout, lambda configuration: current.get(configuration.key) is not False, limit)
        _report(output, plan, dry_run, layout)


class _deleting:  # noqa: N801
    """The exclusive usage lock, except for a dry run (which deletes nothing)."""

    def __init__(self, layout, dry_run: bool):
        self._context = None if dry_run or not layout.root.exists() else using(layout, exclusive=True)

    def __enter__(self):
        if self._context is not None:
            self._context.__enter__()

    def __exit__(self, *exc):
        if self._context is not None:
            return self._context.__exit__(*exc)
        return None


def _report(output: Output, plan: DeletionPlan, dry_run: bool, layout) -> None:
    if not dry_run:
        execute(layout, plan)
    output.document(
        {
            "cache_dir": str(layout.root),
            "dry_run": dry_run,
            "removals": [removal.as_dict() for removal in plan.removals],
            "bytes": plan.bytes,
        }
    )
    verb = "Would remove" if dry_run else "Removed"
    every = click.get_current_context().find_root().params.get("verbose", 0) > 0
    for removal in plan.removals:
        if every or removal.kind not in _COUNTED_ONLY:
            output.data(f"  {removal.kind:<13} {human_size(removal.bytes):>9}  {removal.path}  ({removal.reason})")
    nouns = (
        ("configuration", "configuration", "configurations"),
        ("entry", "kernel entry", "kernel entries"),
        ("bucket", "old bucket", "old buckets"),
        ("manifest", "unreadable manifest", "unreadable manifests"),
        ("lock", "lock file", "lock files"),
        ("staging", "staging directory", "staging directories"),
    )
    counts = [plural(plan.count(kind), one, many) for kind, one, many in nouns if plan.count(kind)]
    if not counts:
        output.data("Nothing to remove")
        return
    listed = "" if every or not any(plan.count(kind) for kind in _COUNTED_ONLY) else "; -v lists each"
    output.data(f"{verb} {', '.join(counts)} ({human_size(plan.bytes)}{listed})")


def _current_toolchains(layout, found: list[Configuration]) -> dict[str, bool | None]:
    """Per manifest key: built by this process's toolchain for its target (None: a target this
    kprecompile does not know)."""
    from ..inputs.targets import TARGETS
    from ..inputs.toolchain import current_toolchain

    by_target: dict[str, dict | None] = {}
    answers: dict[str, bool | None] = {}
    for configuration in found:
        target = configuration.target
        if target not in by_target:
            by_target[target] = (
                current_toolchain(layout, TARGETS[target], remember=False).as_dict() if target in TARGETS else None
            )
        expected = by_target[target]
        answers[configuration.key] = (
            None if expected is None else configuration.manifest.parts.get("toolchain") == expected
        )
    return answers


def parse_size(text: str) -> int:
    """`10G`, `500MB`, `2GiB`, `1.5T` or `4096B`; SI units are powers of 1000, `Ki`-style of 1024."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise InputError("--max-size", text, "a size with its unit, such as 10G, 500MB, 2GiB or 4096B")
    return int(float(match[1]) * _UNITS[match[2].lower().removesuffix("b") or "b"])


def _engine_in_short(document: dict) -> str:
    release = document["vllm_release"]
    return f"vLLM {release} {document['attention_backend']}" if release else "aiter"


def _recorded_counts(layout, found: list[Configuration]) -> dict[str, int]:
    """Per manifest key: kernels serving processes recorded in its journal on its target (see
    `kprecompile misses`)."""
    from ..cache.journal import read_records
    from ..warmup.manifest_key import journal_key

    by_journal: dict[str, dict] = {}
    counts = {}
    for configuration in found:
        key = journal_key(configuration.manifest.parts)
        if key not in by_journal:
            by_journal[key] = read_records(layout, key)
        counts[configuration.key] = sum(record.target == configuration.target for record in by_journal[key].values())
    return counts


def _serving_in_short(serving: dict) -> str:
    parts = [
        f"tp{serving.get('tensor_parallel_size', 1)}",
        f"seqs {serving.get('max_num_seqs')}",
        f"len {serving.get('max_model_len')}",
    ]
    if serving.get("kv_cache_dtype") not in (None, "auto"):
        parts.append(f"kv {serving['kv_cache_dtype']}")
    if serving.get("num_speculative_tokens"):
        parts.append(f"spec {serving['num_speculative_tokens']}")
    return ", ".join(parts)


def _ago(timestamp: float) -> str:
    seconds = max(0, time.time() - timestamp)
    if seconds < 120:
        return "just now"
    if seconds < 7200:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds // 3600:.0f} h ago"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d")
