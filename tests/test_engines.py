"""Engine selection: vLLM's flags and backend choice decide which families are planned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import kprecompile_cli

from kprecompile.errors import InputError
from kprecompile.inputs.models import load_model
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import SELECTION_FLAGS, select
from kprecompile.vllm.releases import release_line

DEEPSEEK = load_model("deepseek-r1")
LLAMA = load_model("llama-3.1-8b-instruct")
GPT_OSS = load_model(str(Path(__file__).parent / "models" / "gpt-oss-20b-bf16.json"))


def planned(model, environ, engine="vllm-aiter", backend=None):
    selection = select(model, engine, backend, environ)
    return selection.attention_backend, selection.planned


@pytest.mark.parametrize(
    "model, engine, environ, backend, families",
    [
        (DEEPSEEK, "vllm-aiter", {}, "ROCM_AITER_MLA", ("fp8_bmm", "mla_decode")),
        (DEEPSEEK, "vllm-aiter", {"VLLM_ROCM_USE_AITER_FP8BMM": "0"}, "ROCM_AITER_MLA", ("mla_decode",)),
        (DEEPSEEK, "vllm-aiter", {"VLLM_ROCM_USE_AITER_MLA": "0"}, "TRITON_MLA", ("fp8_bmm",)),
        (
            DEEPSEEK,
            "vllm-aiter",
            {"VLLM_ATTENTION_BACKEND": "ROCM_AITER_TRITON_MLA"},
            "ROCM_AITER_TRITON_MLA",
            ("fp8_bmm", "mla_decode", "mla_prefill"),
        ),
        (DEEPSEEK, "vllm", {}, "TRITON_MLA", ()),
        (DEEPSEEK, "vllm", {"VLLM_ROCM_USE_AITER": "1"}, "ROCM_AITER_MLA", ("fp8_bmm", "mla_decode")),
        (LLAMA, "vllm-aiter", {}, "ROCM_AITER_FA", ()),
        (
            LLAMA,
            "vllm-aiter",
            {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"},
            "ROCM_AITER_UNIFIED_ATTN",
            ("prefix_prefill", "paged_decode"),
        ),
        (LLAMA, "vllm-aiter", {"VLLM_ROCM_USE_AITER_MHA": "0"}, "TRITON_ATTN", ()),
        (
            LLAMA,
            "vllm-aiter",
            {"VLLM_ROCM_USE_AITER_MHA": "0", "VLLM_V1_USE_PREFILL_DECODE_ATTENTION": "1"},
            "ROCM_ATTN",
            (),
        ),
        (LLAMA, "vllm", {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"}, "TRITON_ATTN", ()),
    ],
)
def test_flags_select_the_backend_and_its_families(model, engine, environ, backend, families):
    assert planned(model, environ, engine) == (backend, families)


def test_every_family_the_backend_runs_is_listed_with_a_reason_when_not_planned():
    selection = select(LLAMA, "vllm", None, {})
    assert [(choice.family, choice.backend) for choice in selection.choices] == [("triton_attn", "TRITON_ATTN")]
    assert "kprecompile engine install vllm==0.12.0" in selection.choices[0].skip_reason
    # From 0.19 too TRITON_ATTN is traced from the installed release (its builder and KV-cache view).
    [newer] = select(LLAMA, "vllm", "TRITON_ATTN", {}, vllm_release="0.33.0").choices
    assert newer.family == "triton_attn" and "kprecompile engine install vllm==0.33.0" in newer.skip_reason
    # TRITON_MLA's decode is vLLM's own kernel too.
    [bmm, fp4_bmm, decode, _] = select(DEEPSEEK, "vllm", None, {}).choices
    assert (bmm.family, fp4_bmm.family) == ("fp8_bmm", "fp4_bmm") and fp4_bmm.skip_reason
    assert (decode.family, decode.backend) == ("triton_mla", "TRITON_MLA")
    assert "kprecompile engine install vllm==0.12.0" in decode.skip_reason


def test_aiter_backends_list_vllms_kernels_around_their_prebuilt_attention():
    """ROCM_AITER_MLA's prefill is AITER's, but with cached context vLLM merges the partial results
    with its own Triton kernel up to 0.18 (traced from the installed vLLM), and with its compiled
    operator from 0.19 (tests/test_vllm.py checks that against 0.33.0's own dispatcher)."""
    for backend in ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA"):
        [merge] = [c for c in select(DEEPSEEK, "vllm-aiter", backend, {}).choices if c.family == "mla_merge"]
        assert (merge.family, merge.backend) == ("mla_merge", backend)
        assert merge.skip_reason.endswith(
            "traced from an installed vLLM: kprecompile engine install vllm==0.12.0, then --vllm-version 0.12.0"
        )
        [newer] = [
            c
            for c in select(DEEPSEEK, "vllm-aiter", backend, {}, vllm_release="0.33.0").choices
            if c.family == "mla_merge"
        ]
        assert newer.skip_reason.startswith("vLLM 0.32 and newer merge prefill results with their compiled")
    # ROCM_AITER_FA: AITER's attention is prebuilt, vLLM's gather and merge around it are not.
    prefix, decode, context = select(LLAMA, "vllm-aiter", None, {}).choices
    assert (
        prefix.skip_reason
        == decode.skip_reason
        == ("ROCM_AITER_FA runs AITER's prebuilt CK/assembly attention (ROCM_AITER_UNIFIED_ATTN runs Triton's)")
    )
    assert context.family == "aiter_fa_context" and "kprecompile engine install vllm==0.12.0" in context.skip_reason
    [newer] = [
        c
        for c in select(LLAMA, "vllm-aiter", "ROCM_AITER_FA", {}, vllm_release="0.33.0").choices
        if c.family == "aiter_fa_context"
    ]
    # From 0.19 traced too (tests/test_vllm.py against 0.33.0), from the release it names.
    assert "kprecompile engine install vllm==0.33.0" in newer.skip_reason
    # TRITON_MLA's merge belongs to its own family (its impl pads V for flash-attn).
    assert "mla_merge" not in [choice.family for choice in select(DEEPSEEK, "vllm", None, {}).choices]


@pytest.mark.parametrize(
    "engine, environ, release, planned_on",
    [
        ("vllm", {}, "0.12.0", ("gfx942", "gfx950")),
        ("vllm-aiter", {}, "0.12.0", ("gfx950",)),
        ("vllm-aiter", {}, "0.11.2", ("gfx950",)),
        ("vllm-aiter", {"VLLM_ROCM_USE_AITER_LINEAR": "0"}, "0.12.0", ("gfx942", "gfx950")),
        ("vllm", {}, "0.33.0", ("gfx942", "gfx950")),
        ("vllm-aiter", {}, "0.33.0", ()),
        ("vllm-aiter", {}, "0.19.1", ()),
        ("vllm-aiter", {"VLLM_ROCM_USE_AITER_LINEAR": "0"}, "0.33.0", ("gfx942", "gfx950")),
    ],
)
def test_block_fp8_linear_runs_where_vllm_takes_its_triton_gemm(engine, environ, release, planned_on):
    """A block-FP8 model's linear layers: vLLM's Triton GEMM unless AITER's linear path takes them,
    which up to 0.12 it does on e4m3fnuz (gfx942) only, from 0.13 everywhere: AITER's Triton GEMM
    on gfx950 for vLLM's own list of shapes up to 0.30 (not traced: said), for AITER's tuned
    configs from 0.31 (in_vllm/test_release_kernels.py checks this rule against each release's own
    choice). Without vLLM installed, listed with the install command; a model without block-FP8
    weights does not list it."""
    [choice] = [
        c
        for c in select(DEEPSEEK, engine, None, environ, vllm_release=release).choices
        if c.family == "block_fp8_linear"
    ]
    if planned_on:
        assert choice.skip_reason.endswith(
            f"traced from an installed vLLM: kprecompile engine install vllm=={release}, then --vllm-version {release}"
        )
    elif release_line(release).aiter_block_fp8 == "vllm_tuned_list":
        assert choice.skip_reason.startswith(f"vLLM {release} runs block-FP8 linear layers through AITER with")
        assert "kprecompile does not trace those, which compile on first use" in choice.skip_reason
    else:
        assert choice.skip_reason.startswith("vLLM 0.31 and newer run block-FP8 linear layers through AITER with")
        # The installed amd-aiter lacks the tuned-shape lookup vLLM asks: CK for every layer.
        assert "has no such module, so every layer runs CK: nothing to compile" in choice.skip_reason
    on_targets = tuple(target for target in ("gfx942", "gfx950") if choice.skip_reason_on(target) is None)
    assert on_targets == (planned_on or ("gfx942", "gfx950"))
    if planned_on == ("gfx950",):
        assert choice.skip_reason_on("gfx942").startswith(f"vLLM {release} runs block-FP8 linear layers on gfx942")
    assert "block_fp8_linear" not in [
        c.family for c in select(LLAMA, engine, None, environ, vllm_release=release).choices
    ]


def test_vllms_own_kernels_without_vllm_installed_say_what_to_install():
    # ROCM_ATTN's kernels are traced from the installed vLLM (tests/test_vllm.py traces them).
    [choice] = select(LLAMA, "vllm", "ROCM_ATTN", {}).choices
    assert choice.family == "rocm_attn"
    assert choice.skip_reason == (
        "ROCM_ATTN runs vLLM's own Triton kernels, traced from an installed vLLM: "
        "kprecompile engine install vllm==0.12.0, then --vllm-version 0.12.0"
    )
    assert choice.missing == "vllm==0.12.0"


def test_an_explicit_backend_wins_over_the_environment():
    environ = {"VLLM_ATTENTION_BACKEND": "ROCM_AITER_MLA"}
    assert planned(DEEPSEEK, environ, backend="ROCM_AITER_TRITON_MLA")[0] == "ROCM_AITER_TRITON_MLA"


@pytest.mark.parametrize("flag", SELECTION_FLAGS)
def test_unset_equals_the_explicit_default(flag):
    for engine in ("vllm-aiter", "vllm"):
        default = select(DEEPSEEK, engine, None, {}).flags[flag]
        explicit = {flag: "1" if default else "0"}
        assert select(DEEPSEEK, engine, None, explicit).flags == select(DEEPSEEK, engine, None, {}).flags
        assert select(DEEPSEEK, engine, None, {flag: ""}).flags[flag] == default


# vLLM: os.getenv(name, "False").lower() in ("true", "1"); no stripping, no "yes".
@pytest.mark.parametrize(
    "value, on",
    [
        ("1", True),
        ("true", True),
        ("True", True),
        ("TRUE", True),
        (" 1", False),
        ("0", False),
        ("false", False),
        ("yes", False),
        ("on", False),
    ],
)
def test_boolean_spellings_read_as_vllm_reads_them(value, on):
    assert select(LLAMA, "vllm", None, {"VLLM_ROCM_USE_AITER": value}).flags["VLLM_ROCM_USE_AITER"] is on


def test_selection_is_part_of_the_plan_document():
    selection = select(DEEPSEEK, "vllm-aiter", None, {"VLLM_ROCM_USE_AITER_FP8BMM": "false"})
    document = selection.as_dict()
    assert document["engine"] == "vllm-aiter" and document["attention_backend"] == "ROCM_AITER_MLA"
    assert document["flags"]["VLLM_ROCM_USE_AITER_FP8BMM"] is False


def test_unknown_family_names_the_ones_available():
    with pytest.raises(InputError, match="--family: got 'paged_decode', expected one of fp8_bmm, fp4_bmm, mla_decode"):
        select(DEEPSEEK, families=["paged_decode"], environ={})


# The selection as each release line makes it (tests/test_vllm.py checks these mirrors against
# the real selectors of 0.11.2, 0.12.0 and 0.33.0 for every combination of the flags).
@pytest.mark.parametrize(
    "release, model, environ, requested, backend, families",
    [
        ("0.11.2", LLAMA, {}, None, "ROCM_AITER_FA", ()),
        ("0.11.2", LLAMA, {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"}, None, "ROCM_AITER_FA", ()),
        # 0.11 asks AITER's MHA flag before a named backend.
        ("0.11.2", LLAMA, {}, "ROCM_AITER_UNIFIED_ATTN", "ROCM_AITER_FA", ()),
        (
            "0.11.2",
            LLAMA,
            {"VLLM_ROCM_USE_AITER_MHA": "0"},
            "ROCM_AITER_UNIFIED_ATTN",
            "ROCM_AITER_UNIFIED_ATTN",
            ("prefix_prefill", "paged_decode"),
        ),
        (
            "0.12.0",
            LLAMA,
            {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"},
            None,
            "ROCM_AITER_UNIFIED_ATTN",
            ("prefix_prefill", "paged_decode"),
        ),
        ("0.33.0", LLAMA, {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"}, None, "ROCM_ATTN", ()),
        ("0.33.0", LLAMA, {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}, None, "ROCM_ATTN", ()),
        ("0.12.0", DEEPSEEK, {}, None, "ROCM_AITER_MLA", ("fp8_bmm", "mla_decode")),
        # Sinks skip ROCM_ATTN from 0.19; ROCM_AITER_FA takes them only from 0.23.
        ("0.22.1", GPT_OSS, {}, None, "ROCM_AITER_UNIFIED_ATTN", ("prefix_prefill", "paged_decode")),
        ("0.23.0", GPT_OSS, {}, None, "ROCM_AITER_FA", ()),
        (
            "0.19.1",
            GPT_OSS,
            {"VLLM_ROCM_USE_AITER_MHA": "0"},
            None,
            "ROCM_AITER_UNIFIED_ATTN",
            ("prefix_prefill", "paged_decode"),
        ),
        # From 0.19 AITER's MLA decode reduces with a HIP kernel: no Triton stage 2 to plan.
        ("0.32.0", DEEPSEEK, {}, None, "ROCM_AITER_MLA", ("fp8_bmm",)),
        # 0.33 turns AITER's FP8 BMM off by default (inputs/flag_defaults.json): torch.bmm.
        ("0.33.0", DEEPSEEK, {}, None, "ROCM_AITER_MLA", ()),
        ("0.33.0", DEEPSEEK, {"VLLM_ROCM_USE_AITER_FP8BMM": "1"}, None, "ROCM_AITER_MLA", ("fp8_bmm",)),
    ],
)
def test_each_release_line_selects_as_that_release_does(release, model, environ, requested, backend, families):
    selection = select(model, "vllm-aiter", requested, environ, vllm_release=release)
    assert (selection.attention_backend, selection.planned, selection.vllm_release) == (backend, families, release)


def test_rocm_aiter_triton_mla_arrived_after_0_11():
    with pytest.raises(
        InputError,
        match="--attention-backend: got 'ROCM_AITER_TRITON_MLA', expected one of "
        "ROCM_AITER_MLA, TRITON_MLA for deepseek-r1's multi-head latent attention "
        "in vLLM 0.11.2",
    ):
        select(DEEPSEEK, "vllm-aiter", "ROCM_AITER_TRITON_MLA", {}, vllm_release="0.11.2")


def test_without_vllm_installed_the_default_release_is_planned():
    from kprecompile.vllm.releases import DEFAULT_RELEASE

    assert select(DEEPSEEK, environ={}).vllm_release == DEFAULT_RELEASE
    assert select(DEEPSEEK, "aiter", environ={}).vllm_release is None


@pytest.mark.parametrize(
    "release, max_num_seqs, tokens, decode_query_len, sizes",
    [
        ("0.12.0", 3, 2048, 1, (1, 2, 4)),
        ("0.33.0", 3, 2048, 1, (1, 2, 3, 4)),
        # 0.11 and 0.12 capture up to 2 x max-num-seqs whatever the speculative tokens; 0.13 on x (1 + spec).
        ("0.12.0", 4, 2048, 2, (1, 2, 4, 8)),
        ("0.15.0", 4, 2048, 2, (1, 2, 4, 8, 16)),
        ("0.33.0", 300, 400, 1, (1, 2, 4, *range(8, 256, 8), 256, 272, 288, 300, 304, 320, 336, 352, 368, 384, 400)),
    ],
)
def test_capture_sizes_follow_the_release(release, max_num_seqs, tokens, decode_query_len, sizes):
    from kprecompile.vllm.releases import capture_sizes

    assert capture_sizes(release, max_num_seqs, tokens, decode_query_len) == sizes


def test_an_installed_release_kprecompile_was_not_tested_against_is_followed_with_one_warning(tmp_path, monkeypatch):
    """vLLM 0.13.5 installed (its distribution metadata, as pip leaves it): planned for 0.13.5 by
    its line's rules, one WARNING naming the nearest tested release; --vllm-version still names
    another."""
    info = tmp_path / "site" / "vllm-0.13.5.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.13.5\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    environment = {"KPRECOMPILE_CACHE_DIR": str(tmp_path / "c")}
    command = ["plan", "--model", "deepseek-v2-lite", "--target", "gfx942", "--family", "fp8_bmm"]
    command += ["--max-num-seqs", "4", "--json"]
    unasked = kprecompile_cli(*command, env=environment)
    assert unasked.returncode == 0, unasked.stderr
    assert json.loads(unasked.stdout)["engine"]["vllm_release"] == "0.13.5"
    warnings = [line for line in unasked.stderr.splitlines() if "not tested against" in line]
    assert len(warnings) == 1 and "the rules of its line (0.13)" in warnings[0], unasked.stderr
    assert "nearest tested release, 0.12.0" in warnings[0]
    named = kprecompile_cli(*command, "--vllm-version", "0.12.0", env=environment)
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["engine"]["vllm_release"] == "0.12.0"
    assert "not tested against" not in named.stderr


NVIDIA = {name: TARGETS[name] for name in ("sm80", "sm89", "sm90", "sm100")}
V2_LITE = load_model("deepseek-v2-lite")


@pytest.mark.parametrize(
    "model, target, release, backend",
    [
        (LLAMA, "sm80", "0.12.0", "FLASH_ATTN"),
        (LLAMA, "sm90", "0.12.0", "FLASH_ATTN"),
        (LLAMA, "sm100", "0.12.0", "FLASHINFER"),
        (V2_LITE, "sm80", "0.12.0", "TRITON_MLA"),
        (V2_LITE, "sm89", "0.11.2", "TRITON_MLA"),
        (V2_LITE, "sm90", "0.12.0", "FLASH_ATTN_MLA"),
        (V2_LITE, "sm100", "0.12.0", "CUTLASS_MLA"),
        (V2_LITE, "sm100", "0.33.0", "FLASHINFER_MLA"),
    ],
)
def test_nvidia_targets_take_vllms_cuda_selection(model, target, release, backend):
    """vLLM's CUDA priority list, first backend whose capability rule takes the GPU (held equal to
    each release's own list in tests/test_vllm.py); the ROCm flags play no part."""
    for environ in ({}, {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1"}):
        selection = select(model, "vllm-aiter", None, environ, vllm_release=release, targets=[NVIDIA[target]])
        assert selection.attention_backend == backend
        [choice] = [choice for choice in selection.choices if choice.family in ("triton_attn", "triton_mla")]
        if backend.startswith("TRITON"):
            assert choice.skip_reason.startswith(f"{backend} runs vLLM's own Triton kernels, traced from an installed")
        else:
            triton = "TRITON_MLA" if model is V2_LITE else "TRITON_ATTN"
            assert choice.skip_reason.startswith(f"{backend} runs ")
            assert choice.skip_reason.endswith(
                f"not Triton: kprecompile plans Triton kernels (--attention-backend {triton} runs vLLM's own)"
            )
        assert "fp8_bmm" not in [choice.family for choice in selection.choices]


@pytest.mark.parametrize("release", ["0.11.2", "0.12.0", "0.33.0"])
def test_a_block_fp8_model_on_nvidia_plans_its_linear_layers_where_vllm_takes_its_triton_gemm(release):
    """sm89 up to 0.18 (tests/test_vllm_linear.py checks each release's own choice); Marlin on sm80
    (and sm89 from 0.19), CUTLASS from sm90: listed with that reason."""
    reasons = {}
    for name in ("sm80", "sm89", "sm90", "sm100"):
        selection = select(DEEPSEEK, "vllm", None, {}, vllm_release=release, targets=[NVIDIA[name]])
        assert [choice.family for choice in selection.choices] == ["triton_mla", "block_fp8_linear"]
        reasons[name] = selection.choices[1].skip_reason
    assert "Marlin" in reasons["sm80"] and "CUTLASS" in reasons["sm90"] and "CUTLASS" in reasons["sm100"]
    if release == "0.33.0":
        assert "Marlin" in reasons["sm89"]
    else:
        assert reasons["sm89"].endswith(
            f"traced from an installed vLLM: kprecompile engine install vllm=={release}, then --vllm-version {release}"
        )
        targets = [NVIDIA["sm89"], NVIDIA["sm90"]]
        both = select(DEEPSEEK, "vllm", "TRITON_MLA", {}, vllm_release=release, targets=targets)
        [choice] = [c for c in both.choices if c.family == "block_fp8_linear"]
        assert choice.skip_reason_on("sm89") is None and "CUTLASS" in choice.skip_reason_on("sm90")
    # Batch-invariant mode turns Marlin off and runs vLLM's own Triton kernels: not planned anywhere.
    for name in ("sm80", "sm89", "sm90"):
        selection = select(
            DEEPSEEK, "vllm", None, {"VLLM_BATCH_INVARIANT": "1"}, vllm_release=release, targets=[NVIDIA[name]]
        )
        assert selection.flags["VLLM_BATCH_INVARIANT"] and "VLLM_BATCH_INVARIANT=1" in selection.choices[1].skip_reason


def test_a_backend_named_for_nvidia_must_be_one_vllm_runs_there():
    selection = select(LLAMA, "vllm", "TRITON_ATTN", {}, targets=[NVIDIA["sm90"]])
    assert selection.attention_backend == "TRITON_ATTN"
    with pytest.raises(
        InputError,
        match=r"--attention-backend: got 'ROCM_ATTN', expected one of FLASH_ATTN, "
        r"FLASHINFER, TRITON_ATTN, FLEX_ATTENTION for llama-3.1-8b-instruct's "
        r"grouped-query attention on sm90 in vLLM 0.12.0",
    ):
        select(LLAMA, "vllm", "ROCM_ATTN", {}, targets=[NVIDIA["sm90"]])
    # FLASH_ATTN_MLA needs sm90: vLLM refuses it on sm89.
    with pytest.raises(
        InputError, match="expected one of TRITON_MLA for deepseek-v2-lite's multi-head latent attention on sm89"
    ):  # noqa: E501
        select(V2_LITE, "vllm", "FLASH_ATTN_MLA", {}, targets=[NVIDIA["sm89"]])


def test_nvidia_targets_vllm_gives_different_backends_are_planned_apart():
    with pytest.raises(
        InputError,
        match=r"--target: got 'sm89,sm90', expected targets vLLM gives one backend; it "
        r"selects TRITON_MLA on sm89, FLASH_ATTN_MLA on sm90",
    ):
        select(V2_LITE, "vllm", None, {}, targets=[NVIDIA["sm89"], NVIDIA["sm90"]])
    named = select(V2_LITE, "vllm", "TRITON_MLA", {}, targets=[NVIDIA["sm89"], NVIDIA["sm90"]])
    assert named.attention_backend == "TRITON_MLA"


def test_mixed_rocm_and_nvidia_targets_keep_the_rocm_selection():
    """vLLM selects per platform, and binds its platform in its config modules at import: vLLM's
    own kernels are planned on the ROCm targets of a mixed request, not on its NVIDIA ones."""
    targets = [TARGETS["gfx942"], NVIDIA["sm90"]]
    unnamed = select(LLAMA, "vllm", None, {}, targets=targets)
    assert unnamed.attention_backend == select(LLAMA, "vllm", None, {}).attention_backend == "TRITON_ATTN"
    for backend in (None, "TRITON_ATTN"):
        [choice] = select(LLAMA, "vllm", backend, {}, targets=targets).choices
        assert choice.skip_reason_on("gfx942") is None
        assert choice.skip_reason_on("sm90") == (
            "vLLM selects its attention backend and binds its platform per platform: plan NVIDIA targets in a "
            "request of their own (--target sm90)"
        )
