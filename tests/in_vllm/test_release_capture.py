"""vLLM's default CUDA-graph capture sizes, as the release's own `VllmConfig` computes them on each
kind of GPU, against kprecompile's rule for builders without vLLM (`releases.capture_sizes`): the
sizes enter every manifest key, so a difference is a cache a server never finds."""

from __future__ import annotations

from importlib import resources

import pytest

from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.triton_driver import active_target
from kprecompile.platforms.vllm_platform import use_target_platform
from kprecompile.vllm.engine_config import engine_config
from kprecompile.vllm.releases import RELEASE_LINES, capture_sizes, release_line

MODEL = (resources.files("kprecompile.inputs.presets") / "llama-3.1-8b-instruct.json").read_text()
# (max-num-seqs, max-num-batched-tokens, speculative tokens): the grid alone; a batch limit off
# the grid; max-num-seqs off the grid; the sm100 ceiling reached; decode batches of 1 + k tokens.
CASES = ((1, 2048, 0), (3, 2048, 0), (64, 100, 0), (300, 400, 0), (1024, 8192, 0), (8, 2048, 2), (600, 8192, 1))
CAPTURE_FIELDS = (
    "capture_scales_with_speculation",
    "capture_batched_tokens",
    "capture_ceiling_sm100",
    "capture_decodes",
)


def _rows(release: str, targets: tuple[str, ...]) -> list[dict]:
    rows = []
    for name in targets:
        target = TARGETS[name]
        for seqs, tokens, speculative in CASES:
            serving = ServingParams(
                max_model_len=4096, max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=speculative
            )
            # vLLM's modules imported as on the target's host, as the build subprocess does.
            with active_target(target):
                use_target_platform(target)
                config = engine_config(MODEL, serving, target)
            rows.append(
                {
                    "target": name,
                    "case": (seqs, tokens, speculative),
                    "vllm": tuple(config.compilation_config.cudagraph_capture_sizes),
                    "mirror": capture_sizes(release, seqs, tokens, 1 + speculative, None, target),
                }
            )
    return rows


def _check(release: str, targets: tuple[str, ...]) -> None:
    rows = _rows(release, targets)
    assert [row for row in rows if row["vllm"] != row["mirror"]] == []
    # Negative control: the cases tell this line's capture rule from its neighbours' (the nearest
    # older and newer lines whose capture rule differs): one of their rules misses on some case.
    line = release_line(release)
    rule = [getattr(line, field) for field in CAPTURE_FIELDS]
    index = RELEASE_LINES.index(line)
    neighbours = [
        next((other for other in reversed(RELEASE_LINES[:index]) if _differs(other, rule, targets)), None),
        next((other for other in RELEASE_LINES[index + 1 :] if _differs(other, rule, targets)), None),
    ]
    for other in filter(None, neighbours):
        wrong = [
            row
            for row in rows
            if capture_sizes(other.first_release, *row["case"][:2], 1 + row["case"][2], None, TARGETS[row["target"]])
            != row["vllm"]
        ]
        assert wrong, f"the cases do not tell line {line.name} from {other.name}"


def _differs(other, rule: list, targets: tuple[str, ...]) -> bool:
    fields = [getattr(other, field) for field in CAPTURE_FIELDS]
    if "sm100" not in targets:
        fields[2], rule = None, [*rule[:2], None, *rule[3:]]
    return fields != rule


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("capture-rocm")
def test_the_capture_size_rule_is_the_releases_on_rocm(release):
    _check(release, ("gfx942",))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.vllm_process("capture-nvidia")
def test_the_capture_size_rule_is_the_releases_on_nvidia_sm90_and_sm100(release):
    _check(release, ("sm90", "sm100"))
