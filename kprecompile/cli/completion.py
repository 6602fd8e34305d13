"""What the shell offers after an option (`--target <TAB>`): the closed sets kprecompile accepts.

Click's completion (`_KPRECOMPILE_COMPLETE=bash_source kprecompile`, docs/reference.md) asks
these; checking a value stays with the code that reads it, whose error names what it expects.
"""

from __future__ import annotations

from click.shell_completion import CompletionItem


def _starting(values, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(value) for value in dict.fromkeys(values) if value.startswith(incomplete.lower())]


def targets(ctx, param, incomplete: str) -> list[CompletionItem]:
    from ..inputs.targets import AUTO, PRODUCTS, TARGETS

    return _starting([*TARGETS, *PRODUCTS, AUTO], incomplete)


def models(ctx, param, incomplete: str) -> list[CompletionItem]:
    """Presets by name; a path completes as a file."""
    from ..inputs.models import list_presets

    return [*_starting(list_presets(), incomplete), CompletionItem(incomplete, type="file")]


def families(ctx, param, incomplete: str) -> list[CompletionItem]:
    from ..shapes import FAMILY_NAMES

    return _starting(FAMILY_NAMES, incomplete)


def attention_backends(ctx, param, incomplete: str) -> list[CompletionItem]:
    """Every backend some supported release runs on ROCm or CUDA (which ones a model can take is
    checked against the planned release)."""
    from ..vllm.releases import CUDA_GQA, CUDA_MLA, RELEASE_LINES

    names = [*CUDA_MLA, *CUDA_GQA]
    for line in RELEASE_LINES:
        names += [*line.rocm_mla_backends, *line.rocm_gqa_backends, *line.cuda_mla_priorities_sm100]
    return [CompletionItem(name) for name in sorted(set(names)) if name.startswith(incomplete.upper())]


def dtypes(ctx, param, incomplete: str) -> list[CompletionItem]:
    from .options import DTYPE_SPELLINGS

    return _starting(DTYPE_SPELLINGS, incomplete)
