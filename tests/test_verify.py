"""Keys that cover every registered variable and the toolchain, and `verify` explaining them.

Each test gets a copy of the session's baked cache (DeepSeek-V2-Lite, 3 sequences, FP8 BMM and
MLA decode, real compiles), changes the environment or the cache, and asks about gfx942.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import BAKED_MODEL as MODEL
from helpers import BAKED_SERVING as SERVING
from helpers import baked_manifest

from kprecompile.cache.entries import compiled_files
from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.manifest import Manifest, manifest_key, read_manifest, write_manifest
from kprecompile.cli import main
from kprecompile.inputs.environment import VARIABLES, compute_hash, fingerprint, registered_values
from kprecompile.inputs.targets import TARGETS
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.warmup.verification import verify
from kprecompile.warmup.warming import warm

GFX942 = TARGETS["gfx942"]
# Each variable's value when unset, under the default engine profile (vllm-aiter: AITER on).
DEFAULTS = registered_values({})
# A value other than the default, as its owner would read it, for each registered variable.
FLIPPED = {
    **{
        variable.name: ("0" if DEFAULTS[variable.name] == "1" else "1")
        for variable in VARIABLES
        if variable.kind != "string"
    },
    "VLLM_ATTENTION_BACKEND": "ROCM_AITER_TRITON_MLA",
    "GPU_ARCHS": "gfx950",
    "CU_NUM": "80",
    "FLASH_ATTENTION_TRITON_AMD_AUTOTUNE": "1",
}
# Another spelling of each boolean default (vLLM lower-cases; int flags are read with int()).
DEFAULT_SPELLED = {
    variable.name: {"1": "True", "0": "FALSE"}[DEFAULTS[variable.name]]
    if variable.kind == "bool"
    else DEFAULTS[variable.name]
    for variable in VARIABLES
    if DEFAULTS[variable.name] is not None
}


@pytest.fixture(autouse=True)
def clean_triton_environment(monkeypatch):
    for name in ("AMDGCN_USE_BUFFER_OPS", "TRITON_DEFAULT_FP_FUSION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def layout(warm_copy) -> CacheLayout:
    """A private copy of the baked cache, for tests that change it."""
    return warm_copy


@pytest.fixture
def baked_layout(baked) -> CacheLayout:
    """The session's baked cache itself, for tests that only ask (verify writes nothing)."""
    return CacheLayout.of(baked[0])


def gfx942_manifest(layout) -> Manifest:
    return baked_manifest(layout, GFX942).manifest


def verdict(layout, deep=False):
    [result] = verify(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, deep=deep).targets
    return result


def test_the_warmed_configuration_verifies_warm(baked_layout):
    result = verdict(baked_layout, deep=True)
    assert result.status == "warm" and result.kernels > 3 and result.problems == ()


@pytest.mark.parametrize("name", sorted(FLIPPED))
def test_flipping_a_registered_variable_changes_the_key_and_verify_names_it(baked_layout, monkeypatch, name):
    before = compute_hash()
    monkeypatch.setenv(name, FLIPPED[name])
    assert compute_hash() != before
    result = verdict(baked_layout)
    assert result.status == "mismatch"
    assert any(reason.startswith(f"environment: {name} was ") for reason in result.reasons), result.reasons


@pytest.mark.parametrize("name", sorted(DEFAULT_SPELLED))
def test_an_explicit_default_equals_unset(baked_layout, monkeypatch, name):
    before = compute_hash()
    monkeypatch.setenv(name, DEFAULT_SPELLED[name])
    assert compute_hash() == before
    assert verdict(baked_layout).status == "warm"


def test_the_engine_profile_is_a_default_not_part_of_the_key(baked_layout, monkeypatch):
    """vllm-aiter with AITER unset runs the kernels vllm runs with VLLM_ROCM_USE_AITER=1: one cache."""
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    assert compute_hash(engine="vllm") == compute_hash(engine="vllm-aiter")
    [result] = verify(Request(MODEL, SERVING, select(MODEL, engine="vllm"), (GFX942,)), baked_layout).targets
    assert result.status == "warm"
    monkeypatch.delenv("VLLM_ROCM_USE_AITER")
    [result] = verify(Request(MODEL, SERVING, select(MODEL, engine="vllm"), (GFX942,)), baked_layout).targets
    assert result.status == "mismatch"


def test_an_unrelated_variable_changes_nothing(baked_layout, monkeypatch):
    before = compute_hash()
    for name, value in {"VLLM_LOGGING_LEVEL": "DEBUG", "HOME_GROWN_FLAG": "1", "OMP_NUM_THREADS": "3"}.items():
        monkeypatch.setenv(name, value)
    assert compute_hash() == before and verdict(baked_layout).status == "warm"


def test_a_triton_knob_changes_triton_keys_and_a_rewarm_compiles_only_those(layout, monkeypatch):
    old = gfx942_manifest(layout)
    monkeypatch.setenv("AMDGCN_USE_BUFFER_OPS", "0")
    assert fingerprint().triton == {"AMDGCN_USE_BUFFER_OPS": "false"}
    result = verdict(layout)
    assert result.status == "mismatch"
    assert any("AMDGCN_USE_BUFFER_OPS was unset at warm, 'false' here" in reason for reason in result.reasons)

    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=2)
    new = read_manifest(layout, json.loads(open(report.manifests[0]).read())["key"])
    old_keys, new_keys = {job.key for job in old.jobs}, {job.key for job in new.jobs}
    assert new_keys != old_keys
    assert report.failed == 0
    assert report.compiled == len(new_keys - old_keys) and report.cached == len(new_keys & old_keys)
    assert verdict(layout).status == "warm"
    # The old configuration is still warm, from its own binaries.
    monkeypatch.delenv("AMDGCN_USE_BUFFER_OPS")
    assert verdict(layout).status == "warm"


def test_an_engine_flag_changes_the_plan_not_the_binaries(layout, monkeypatch):
    monkeypatch.setenv("VLLM_ROCM_USE_AITER_FP8BMM", "0")
    assert verdict(layout).status == "mismatch"
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=2)
    # Only the MLA decode kernels remain, all already compiled: no compile worker starts.
    assert report.compiled == 0 and report.cached == report.kernels > 0 and report.workers == 0
    assert {family.family for family in report.families if family.kernels} == {"mla_decode"}


def test_damaged_and_lost_artifacts_are_found_and_compiled_again(layout):
    """A truncated binary is found by verify, an altered one of the same size only by --deep,
    a deleted entry by both; the next warm compiles exactly those three, with as many workers
    as --jobs allows."""
    manifest = gfx942_manifest(layout)
    truncated, altered, lost = manifest.jobs[0], manifest.jobs[-1], manifest.jobs[1]
    [binary] = layout.triton_entry(truncated.key).glob("*.hsaco")
    binary.write_bytes(binary.read_bytes()[:100])
    result = verdict(layout)
    assert result.status == "incomplete"
    [problem] = result.problems
    assert problem.key == truncated.key and "bytes" in problem.problem

    [binary] = layout.triton_entry(altered.key).glob("*.hsaco")
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))
    assert [problem.key for problem in verdict(layout).problems] == [truncated.key]
    deep = verdict(layout, deep=True)
    assert deep.status == "incomplete"
    assert {(problem.key, "sha256" in problem.problem) for problem in deep.problems} == {
        (truncated.key, False),
        (altered.key, True),
    }

    shutil.rmtree(layout.triton_entry(lost.key))
    assert compiled_files(layout, lost.key) is None
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=2)
    # Two entries were damaged (replaced), one was lost; the rest are found in the cache.
    assert (report.replaced, report.compiled, report.failed, report.workers) == (2, 3, 0, 2)
    assert report.cached == len(manifest.jobs) - 3
    assert verdict(layout, deep=True).status == "warm"


def test_a_missing_kernel_is_named(layout):
    manifest = gfx942_manifest(layout)
    shutil.rmtree(layout.triton_entry(manifest.jobs[1].key))
    result = verdict(layout)
    assert result.status == "incomplete"
    assert [(p.key, p.problem) for p in result.problems] == [(manifest.jobs[1].key, "not in the cache")]
    assert result.problems[0].kernel == manifest.jobs[1].kernel


def test_a_cache_baked_under_another_toolchain_says_which(layout):
    """As if the manifest came from a builder with another Triton build at another path."""
    lookup = baked_manifest(layout, GFX942)
    path, manifest = lookup.path, lookup.manifest
    parts = json.loads(json.dumps(manifest.parts))
    here_key, here_path = parts["toolchain"]["triton_key"], parts["toolchain"]["triton_path"]
    parts["toolchain"].update(triton_key="0" * 64, triton_path="/opt/builder/triton")
    path.unlink()
    write_manifest(layout, manifest.__class__(manifest_key(parts), parts, manifest.families, manifest.jobs))
    result = verdict(layout)
    assert result.status == "mismatch"
    assert result.reasons[0].startswith(
        f"toolchain mismatch: baked with Triton key {'0' * 64} at path /opt/builder/triton; this process has "
        f"{here_key} at {here_path}"
    )


def test_an_empty_cache_is_not_warmed_and_verify_writes_nothing(tmp_path):
    result = verdict(CacheLayout.of(tmp_path / "empty"))
    assert result.status == "not_warmed" and result.reasons == ("no manifest for this configuration",)
    assert not (tmp_path / "empty").exists()


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    return exited.value.code, capsys.readouterr().out


def test_verify_command_exit_status_and_json(baked_layout, capsys):
    argv = [
        "verify",
        "--model",
        "deepseek-v2-lite",
        "--target",
        "gfx942",
        "--max-num-seqs",
        "3",
        "--cache-dir",
        str(baked_layout.root),
    ]
    status, out = run(capsys, *argv, "--json")
    document = json.loads(out)
    assert status == 0 and document["warm"] is True
    assert set(document) == {
        "schema_version",
        "model",
        "warm",
        "targets",
        "manifest_key_parts",
        "deep",
        "seconds",
        "cache_dir",
    }
    assert document["targets"][0]["status"] == "warm"
    assert {"toolchain", "environment", "engine", "serving", "model_digest"} <= set(document["manifest_key_parts"])

    status, out = run(capsys, *argv[:-2], "--cache-dir", str(baked_layout.root / "elsewhere"))
    assert status == 1 and "not warm" in out and "no manifest for this configuration" in out


def test_env_command_prints_the_fingerprint_and_its_hash(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "true")
    status, out = run(capsys, "env", "--json")
    document = json.loads(out)
    assert status == 0 and document["hash"] == compute_hash()
    assert document["variables"]["VLLM_ROCM_USE_AITER"] == "1"
    assert set(document["variables"]) == {variable.name for variable in VARIABLES}
    status, out = run(capsys, "env")
    assert "VLLM_ROCM_USE_AITER " in out and out.rstrip().endswith(compute_hash())


TORCH_FREE = """
import sys
from kprecompile.cli import main
for command in ("verify", "warm"):
    try:
        main([command, "--model", "deepseek-v2-lite", "--target", "gfx942", "--max-num-seqs", "3",
              "--cache-dir", sys.argv[1]])
    except SystemExit as exited:
        assert exited.code == 0, (command, exited.code)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""


def test_verify_and_warm_on_a_warm_cache_never_import_torch(layout):
    """Importing torch costs a second or more: a warm cache must be confirmed without it."""
    import subprocess
    import sys

    env = {**os.environ, "VLLM_ROCM_USE_AITER": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(layout.root)], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "torch not imported"


def _edit_first_job(field, value):
    def edit(document):
        document["jobs"][0][field] = value
        return document

    return edit


def _edit_first_artifact(change):
    def edit(document):
        artifacts = document["jobs"][0]["artifacts"]
        name = next(iter(artifacts))
        change(artifacts, name)
        return document

    return edit


# Manifest contents an adversary or a broken disk could leave: each is one warning and "not
# warm" (a rebuild by warm), never a traceback in verify, warm or the hook.
MANIFEST_DAMAGE = {
    "path-like-job-key": _edit_first_job("key", "../../../etc/passwd"),
    "long-job-key": _edit_first_job("key", "a" * 10_000),
    "artifacts-as-list": _edit_first_job("artifacts", []),
    "job-field-not-text": _edit_first_job("kernel", 7),
    "jobs-as-object": lambda document: {**document, "jobs": {"a": 1}},
    "families-as-text": lambda document: {**document, "families": "x"},
    "top-level-array": lambda document: [document],
    "path-like-file-name": _edit_first_artifact(lambda artifacts, name: artifacts.update({"../x": artifacts[name]})),
    "record-without-digest": _edit_first_artifact(lambda artifacts, name: artifacts[name].pop("sha256")),
    "negative-size": _edit_first_artifact(lambda artifacts, name: artifacts[name].update(size=-1)),
    # Well-formed, but not what was written: only the whole-document checksum sees these.
    "job-keys-swapped": lambda document: {
        **document,
        "jobs": [
            {**document["jobs"][0], "key": document["jobs"][1]["key"]},
            {**document["jobs"][1], "key": document["jobs"][0]["key"]},
            *document["jobs"][2:],
        ],
    },
    "a-job-dropped": lambda document: {**document, "jobs": document["jobs"][1:]},
    "checksum-removed": lambda document: {name: value for name, value in document.items() if name != "checksum"},
}


@pytest.mark.parametrize("damage", sorted(MANIFEST_DAMAGE))
def test_a_damaged_manifest_is_one_warning_and_a_rebuild(layout, caplog, damage):
    path = baked_manifest(layout, GFX942).path
    document = json.loads(path.read_text())
    path.write_text(json.dumps(MANIFEST_DAMAGE[damage](document)))
    assert verdict(layout).status != "warm"
    assert "ignoring unreadable manifest" in caplog.text
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=1)
    assert report.failed == 0 and report.compiled == 0
    assert verdict(layout, deep=True).status == "warm"


def test_a_stray_json_in_the_manifests_bucket_breaks_nothing(layout, capsys):
    (layout.manifests_dir / "stray.json").write_text("[1, 2, 3]")
    (layout.manifests_dir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    # Another configuration: verify explains the mismatch from every readable manifest.
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "verify",
                "--model",
                "deepseek-v2-lite",
                "--target",
                "gfx942",
                "--max-num-seqs",
                "5",
                "--cache-dir",
                str(layout.root),
            ]
        )
    assert exited.value.code == 1
    assert "not warm" in capsys.readouterr().out


def test_a_symlinked_binary_in_an_entry_is_not_served_and_warm_replaces_it(layout, tmp_path):
    """A link to a same-size, same-content file elsewhere passed `verify --deep` before: the link
    could be repointed after the check. It is a problem, and warm writes a real file."""
    job = gfx942_manifest(layout).jobs[0]
    [binary] = [path for path in compiled_files(layout, job.key) if path.suffix == ".hsaco"]
    elsewhere = tmp_path / "elsewhere.hsaco"
    shutil.copyfile(binary, elsewhere)
    binary.unlink()
    binary.symlink_to(elsewhere)
    result = verdict(layout, deep=True)
    assert result.status == "incomplete"
    assert [problem.problem for problem in result.problems] == [
        f"{binary.name} is not a regular file (a link or a directory)"
    ]
    assert compiled_files(layout, job.key) is None  # nor served by the layered manager's rule
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=1)
    assert report.replaced == 1 and report.compiled == 1 and report.failed == 0
    assert not binary.is_symlink() and verdict(layout, deep=True).status == "warm"


def test_a_damaged_entry_in_a_read_only_layer_is_compiled_anew_not_laundered(warm_copy, tmp_path):
    """A same-size alteration of a binary in a baked layer: warm must not re-record the damaged
    file as good (it did: `replaced: 1`, nothing compiled, the manifest took the bad checksum).
    It compiles the kernel into the writable root, which every reader searches first, records
    that copy, and leaves the layer as it is."""
    layout = CacheLayout.of(tmp_path / "user", (warm_copy.root,))
    job = gfx942_manifest(layout).jobs[0]
    [binary] = [path for path in compiled_files(layout, job.key) if path.suffix == ".hsaco"]
    data = bytearray(binary.read_bytes())
    data[-1] ^= 0xFF
    binary.write_bytes(bytes(data))
    assert verdict(layout, deep=True).status == "incomplete"
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=1)
    assert (report.replaced, report.compiled, report.failed) == (1, 1, 0)
    assert binary.read_bytes() == bytes(data)  # the layer is read-only to kprecompile
    [served] = [path for path in compiled_files(layout, job.key) if path.suffix == ".hsaco"]
    assert served.is_relative_to(layout.root) and served.read_bytes() != bytes(data)
    assert verdict(layout, deep=True).status == "warm"


def test_a_miss_names_the_closest_configuration_each_difference_and_the_warm_command(baked_layout, capsys):
    """The cache holds the same model warmed another way: verify says how it differs, option by
    option, and prints the warm that makes this one warm."""
    argv = [
        "verify",
        "--model",
        "deepseek-v2-lite",
        "--target",
        "gfx942",
        "--max_num_seqs",
        "5",
        "--family",
        "fp8_bmm",
        "--cache-dir",
        str(baked_layout.root),
    ]
    status, out = run(capsys, *argv)
    assert status == 1
    assert "serving: --max-num-seqs was 3 at warm, 5 here" in out
    [families] = [line for line in out.splitlines() if line.strip().startswith("engine: families ")]
    assert " at warm, fp8_bmm here (manifest " in families and "mla_decode" in families
    assert out.rstrip().endswith(
        f"to make it warm: kprecompile warm --model deepseek-v2-lite --target gfx942 --max-num-seqs 5 --family fp8_bmm "
        f"--cache-dir {baked_layout.root}"
    )


def swap_children(entry, first_suffix=".hsaco", second_suffix=".amdgcn"):
    """Exchange two files' paths in the entry's group file: each file is still the one its
    manifest recorded, but the binary's name now maps to the IR and the IR's to the binary."""
    [group] = entry.glob("__grp__*.json")
    document = json.loads(group.read_text())
    children = document["child_paths"]
    [first] = [name for name in children if name.endswith(first_suffix)]
    [second] = [name for name in children if name.endswith(second_suffix)]
    children[first], children[second] = children[second], children[first]
    group.write_text(json.dumps(document))
    return group


def test_a_group_file_that_swaps_two_files_is_damage_that_warm_rebuilds(layout):
    """Verify (even without --deep) names it, the entry no longer counts as compiled, and warm
    replaces it with an entry whose names map to their own files."""
    job = gfx942_manifest(layout).jobs[0]
    entry = layout.triton_entry(job.key)
    [group] = entry.glob("__grp__*.json")
    # Negative control: the same mapping written anew (other formatting) is still warm.
    group.write_text(json.dumps(json.loads(group.read_text()), indent=3))
    assert verdict(layout, deep=True).status == "warm" and compiled_files(layout, job.key) is not None

    swap_children(entry)
    for deep in (False, True):
        result = verdict(layout, deep=deep)
        assert result.status == "incomplete"
        assert [(problem.key, problem.problem) for problem in result.problems] == [
            (job.key, f"{group.name} maps a file name to another file, or is not a group file")
        ]
    assert compiled_files(layout, job.key) is None
    report = warm(Request(MODEL, SERVING, select(MODEL), (GFX942,)), layout, max_workers=1)
    assert (report.replaced, report.compiled, report.failed) == (1, 1, 0)
    children = json.loads(group.read_text())["child_paths"]
    assert all(os.path.basename(path) == name for name, path in children.items())
    assert verdict(layout, deep=True).status == "warm"


def test_a_group_file_naming_other_files_than_recorded_is_damage(layout):
    """A group file that drops one of the recorded files (all the others intact) is not warm."""
    job = gfx942_manifest(layout).jobs[0]
    [group] = layout.triton_entry(job.key).glob("__grp__*.json")
    document = json.loads(group.read_text())
    [ir] = [name for name in document["child_paths"] if name.endswith(".amdgcn")]
    del document["child_paths"][ir]
    group.write_text(json.dumps(document))
    assert [problem.problem for problem in verdict(layout).problems] == [
        f"{group.name} names other files than the manifest records"
    ]


def test_compiling_a_key_whose_entry_swaps_two_files_writes_it_anew(layout):
    """Without a manifest to say so, a compile must not take Triton's cache hit on the swapped
    group file (Triton's own cache manager reads whatever it maps)."""
    from kprecompile.warmup.compile import compile_job

    job = gfx942_manifest(layout).jobs[0]
    entry = layout.triton_entry(job.key)
    swap_children(entry)
    outcome = compile_job(job, layout)
    assert outcome.status == "compiled", outcome.error
    assert compiled_files(layout, job.key) is not None
    # Negative control: an intact entry is a cache hit, left as it is.
    assert compile_job(job, layout).status == "cached"
