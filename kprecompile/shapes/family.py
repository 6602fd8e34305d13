"""What a kernel family is: one typed object per family module.

A family is the kernels one library call compiles, as the engine makes that call. Its object
says everything the pipeline needs: the shapes the engine produces for a model within the
serving limits (pure data), how `plan` shows them, where the family does not run (its
limits), which library modules the call imports (re-imported fresh for each traced target,
because libraries keep per-arch state in modules), and the call itself on meta tensors.

The shapes and the limits are given the planned vLLM release line (`vllm.releases.ReleaseLine`;
None under the `aiter` engine, which has no vLLM): a family whose engine changed between releases
reads the line's record, never the installed vLLM's version.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from ..tracing.libraries import missing_library

if TYPE_CHECKING:
    from ..inputs.models import ModelConfig
    from ..inputs.serving import ServingParams
    from ..inputs.targets import Target
    from ..vllm.releases import ReleaseLine

# Every family kprecompile knows; each has one module in this package and one registry line.
FamilyName = Literal[
    "aiter_fa_context",
    "block_fp8_linear",
    "fp4_bmm",
    "fp8_bmm",
    "mla_decode",
    "mla_merge",
    "mla_prefill",
    "prefix_prefill",
    "paged_decode",
    "pa_prefill",
    "rocm_attn",
    "triton_attn",
    "triton_mla",
]

ShapeT = TypeVar("ShapeT")


@dataclass(frozen=True)
class KernelFamily(Generic[ShapeT]):
    name: FamilyName
    # The kernel and the engine's call, in a few words.
    description: str
    # The distribution that ships the kernels (its import name), and the module prefixes the call
    # imports afresh per target (none where its modules register operators at import).
    library: str
    traced_modules: tuple[str, ...]
    # Every shape the engine can hand the call for this model within the serving limits, in the
    # planned release line (None: no vLLM).
    enumerate_shapes: Callable[[ModelConfig, ServingParams, ReleaseLine | None], tuple[ShapeT, ...]]
    # What `plan` shows: the dimensions that decide the family's kernels.
    describe_shapes: Callable[[tuple[ShapeT, ...]], dict[str, object]]
    # One call, for progress and error messages.
    describe_call: Callable[[ShapeT], str]
    # The engine's real call, on meta tensors, for one shape on one target.
    launch: Callable[[ShapeT, Target], None]
    # Why the family does not run under these settings on this target in the planned release line, or None.
    limits: Callable[[ModelConfig, ServingParams, Target, ReleaseLine | None], str | None]
    # What a step shares with others of its trace (`Capture.shared`: vLLM's layer and metadata
    # for a request mix, which each KV-cache storage class of the mix runs): a trace split over
    # processes keeps each group in one (None: every step alone).
    step_group: Callable[[ShapeT], Hashable] | None = None

    def skip_reason(
        self, model: ModelConfig, serving: ServingParams, target: Target, line: ReleaseLine | None
    ) -> str | None:
        """Why this family is not compiled here: its limits, or its library is not installed."""
        module = self.traced_modules[0] if self.traced_modules else self.library
        return self.limits(model, serving, target, line) or missing_library(self.library, module)

    def calls(self, shapes: tuple[ShapeT, ...], target: Target) -> list[tuple[str, Callable[[], None]]]:
        """(label, call) pairs for tracing."""
        return [(self.describe_call(shape), lambda shape=shape: self.launch(shape, target)) for shape in shapes]

    def groups(self, shapes: tuple[ShapeT, ...]) -> list[Hashable] | None:
        """Each shape's `step_group`, for `trace_calls`."""
        return None if self.step_group is None else [self.step_group(shape) for shape in shapes]
