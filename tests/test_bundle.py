"""Bake, serve from a read-only layer, export and import: real bundles and crafted archives."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import baked_manifest, kprecompile_cli, signature

from kprecompile.cache.bundle import BUNDLE_FILE
from kprecompile.cache.entries import compiled_files
from kprecompile.cache.layout import CacheLayout
from kprecompile.cache.signing import SIGNATURE_FILE
from kprecompile.cli import main
from kprecompile.errors import BundleError
from kprecompile.inputs.targets import TARGETS
from kprecompile.warmup.bundling import import_archive

SELECTION = ["--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "3"]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and modification time: any write shows."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    return exited.value.code


SERVE_FROM_LAYER = """
import json, sys
from kprecompile.selection.engines import select
from kprecompile.selection.request import Request
from kprecompile.inputs.models import load_model
from kprecompile.serve.monitor import JitMonitor
from kprecompile.warmup.preload import preload
from kprecompile.serve.runtime import activate
from kprecompile.inputs.serving import ServingParams
from kprecompile.inputs.targets import TARGETS
from kprecompile.warmup.verification import verify
layout = activate(sys.argv[1])  # layers come from KPRECOMPILE_CACHE_LAYERS, as in the image
monitor = JitMonitor("off").install()
model, serving = load_model("deepseek-v2-lite"), ServingParams(max_num_seqs=3)
targets = [TARGETS["gfx942"], TARGETS["gfx950"]]
request = Request(model, serving, select(model), tuple(targets))
report = verify(request, layout)
loaded = [preload(request, layout, target=t).as_dict() for t in targets]
print(json.dumps({"warm": report.warm, "layers": [str(p) for p in layout.layers], "preload": loaded,
                  "compiles": len(monitor.compiles)}))
"""


@pytest.mark.slow
def test_a_baked_bundle_moved_and_read_only_serves_without_a_write(baked, tmp_path):
    """The image's case: the bundle lies elsewhere than where it was baked (its group files
    still name the builder's paths) on a read-only layer. verify says warm, a serving process
    loads every kernel from it and compiles none, and not one file of the layer changes."""
    out, _, document = baked
    moved = tmp_path / "image" / "bundle"
    moved.parent.mkdir()
    shutil.move(out, moved)  # the builder's path no longer exists
    for path in [moved, *moved.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = tree(moved)
    try:
        assert str(out) in next(moved.glob("triton-v1/*/__grp__*")).read_text()  # not rewritten
        image = {"KPRECOMPILE_CACHE_LAYERS": str(moved), "VLLM_ROCM_USE_AITER": "1"}
        verify_status = kprecompile_cli(
            "verify",
            *SELECTION,
            "--target",
            "gfx942",
            "--target",
            "gfx950",
            "--cache-dir",
            tmp_path / "user",
            env=image,
        )
        assert verify_status.returncode == 0, verify_status.stdout + verify_status.stderr
        served = subprocess.run(
            [sys.executable, "-c", SERVE_FROM_LAYER, str(tmp_path / "user")],
            env={**os.environ, **image},
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(served.stdout.strip().splitlines()[-1])
        after = tree(moved)
    finally:
        for path in [moved, *moved.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
        shutil.move(moved, out)
    assert result["warm"] and result["layers"] == [str(moved)]
    kernels = sum(c["kernels"] for c in document["configurations"])
    assert sum(p["loaded"] for p in result["preload"]) == kernels and result["compiles"] == 0
    assert all(p["compiled"] == 0 for p in result["preload"])
    # Nothing was written to the baked layer, and no kernel landed in the user cache either.
    assert after == before
    assert not list((tmp_path / "user").glob("triton-v1/*/*.hsaco"))


def test_a_baked_bundle_is_readable_by_a_server_running_as_another_user(baked):
    """Every file kprecompile writes into a bundle (manifests, bundle.json, the toolchain memo) is
    0644 like Triton's own: mkstemp's 0600 would make a non-root server recompile everything."""
    out, _, _ = baked
    written = [out / "bundle.json", *out.glob("manifests-v*/*.json"), *out.glob("toolchain-v*/*.json")]
    assert len(written) > 3
    modes = {path.name: path.stat().st_mode & 0o777 for path in written}
    assert {name: oct(mode) for name, mode in modes.items() if mode & 0o044 != 0o044} == {}


def test_every_baked_kernel_is_one_elf_code_object(baked):
    """The bake cross-compiled real AMD binaries: each kernel of each target has one hsaco, an ELF."""
    out, _, document = baked
    layout = CacheLayout.of(out)
    jobs = [job for manifest in layout.manifests_dir.glob("*.json") for job in json.loads(manifest.read_text())["jobs"]]
    assert len(jobs) == sum(c["kernels"] for c in document["configurations"]) > 0
    assert {job["target"] for job in jobs} == {"gfx942", "gfx950"} and {job["family"] for job in jobs} == {
        "fp8_bmm",
        "mla_decode",
    }
    for job in jobs:
        [hsaco] = [path for path in compiled_files(layout, job["key"]) if path.suffix == ".hsaco"]
        assert hsaco.read_bytes()[:4] == b"\x7fELF"


def test_an_archive_imports_into_a_cache_triton_serves_from(baked, tmp_path):
    _, archive, document = baked
    destination = CacheLayout.of(tmp_path / "imported")
    report = import_archive(archive, destination)
    kernels = sum(c["kernels"] for c in document["configurations"])
    assert report.entries_added == kernels and report.manifests_added == 2
    for target in ("gfx942", "gfx950"):
        status = run("verify", *SELECTION, "--target", target, "--cache-dir", str(destination.root))
        assert status == 0
    # Group files now name the files where they are: Triton's own cache manager finds them.
    group = next(destination.triton_dir.glob("*/__grp__*"))
    assert all(
        path.startswith(str(destination.triton_dir)) for path in json.loads(group.read_text())["child_paths"].values()
    )
    again = import_archive(archive, destination)
    assert (again.entries_added, again.entries_present, again.entries_replaced) == (0, kernels, 0)
    assert (again.manifests_added, again.manifests_present, again.manifests_replaced) == (0, 2, 0)


def test_export_then_import_one_configuration(baked, tmp_path):
    out, _, _ = baked
    archive = tmp_path / "gfx950.tgz"
    assert run("export", *SELECTION, "--target", "gfx950", "--cache-dir", str(out), "--archive", str(archive)) == 0
    report = import_archive(archive, CacheLayout.of(tmp_path / "other"))
    assert report.configurations == 1 and report.manifests_added == 1
    assert run("verify", *SELECTION, "--target", "gfx950", "--cache-dir", str(tmp_path / "other")) == 0
    assert run("verify", *SELECTION, "--target", "gfx942", "--cache-dir", str(tmp_path / "other")) == 1


def test_export_refuses_a_damaged_kernel_instead_of_giving_it_fresh_checksums(warm_copy, tmp_path, capsys):
    """A same-size alteration of a binary: export used to pack it with newly computed checksums,
    so the importing side took it for good. It is one line and exit 1; no archive is written."""
    job = baked_manifest(warm_copy, TARGETS["gfx942"]).manifest.jobs[0]
    [binary] = [path for path in compiled_files(warm_copy, job.key) if path.suffix == ".hsaco"]
    data = bytearray(binary.read_bytes())
    data[0] ^= 0xFF
    binary.write_bytes(bytes(data))
    archive = tmp_path / "damaged.tgz"
    status = run(
        "export", *SELECTION, "--target", "gfx942", "--cache-dir", str(warm_copy.root), "--archive", str(archive)
    )
    err = capsys.readouterr().err
    assert status == 1 and not archive.exists()
    assert err.startswith("kprecompile: 1 kernel(s) of deepseek-v2-lite on gfx942 do not match their manifest")
    assert "does not match its recorded sha256" in err and err.count("\n") == 1


def _rewrite(archive: Path, crafted: Path, edit) -> Path:
    """A copy of `archive` with `edit(name, data) -> [(TarInfo, data)]` applied to every member;
    an edited bundle.json is signed again by the session's key (which import trusts)."""
    index = None
    with tarfile.open(archive) as source, tarfile.open(crafted, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            for info, payload in edit(member, data):
                if info.name == BUNDLE_FILE:
                    index = payload
                elif info.name == SIGNATURE_FILE:
                    payload = signature(index)
                    info.size = len(payload)
                target.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return crafted


def _extra(info_name: str, kind: bytes = tarfile.REGTYPE, payload: bytes = b"x", linkname: str = ""):
    def edit(member, data):
        yield member, data
        if member.name == BUNDLE_FILE:
            info = tarfile.TarInfo(info_name)
            info.type = kind
            info.linkname = linkname
            info.size = len(payload) if kind == tarfile.REGTYPE else 0
            yield info, payload if kind == tarfile.REGTYPE else None

    return edit


def _altered_hsaco(member, data):
    if member.name.endswith(".hsaco") and not getattr(_altered_hsaco, "done", False):
        _altered_hsaco.done = True
        data = bytes([data[0] ^ 0xFF]) + data[1:]
    yield member, data


def _other_toolchain(member, data):
    if member.name == BUNDLE_FILE:
        index = json.loads(data)
        index["toolchains"]["gfx942"]["triton_key"] = "f" * 64
        index["toolchains"]["gfx942"]["triton_path"] = "/opt/builder/triton"
        data = json.dumps(index).encode()
        member.size = len(data)
    yield member, data


@pytest.mark.parametrize(
    "case, edit, member, reason",
    [
        (
            "traversal",
            _extra("triton-v1/../../escaped"),
            "triton-v1/../../escaped",
            "expected a path inside the destination",
        ),
        ("absolute", _extra("/tmp/kprecompile-absolute"), "/tmp/kprecompile-absolute", "expected a relative path"),
        (
            "symlink",
            _extra("triton-v1/link", tarfile.SYMTYPE, linkname="/etc/passwd"),
            "triton-v1/link",
            "expected a regular file, not a link to '/etc/passwd'",
        ),
        (
            "hardlink",
            _extra("triton-v1/hard", tarfile.LNKTYPE, linkname=BUNDLE_FILE),
            "triton-v1/hard",
            "expected a regular file, not a link to",
        ),
        (
            "device",
            _extra("triton-v1/device", tarfile.CHRTYPE),
            "triton-v1/device",
            "expected a regular file, not a device, FIFO or other special file",
        ),
        (
            "fifo",
            _extra("triton-v1/fifo", tarfile.FIFOTYPE),
            "triton-v1/fifo",
            "expected a regular file, not a device, FIFO or other special file",
        ),
        (
            "unlisted",
            _extra(f"triton-v1/{'A' * 52}/extra.bin"),
            f"triton-v1/{'A' * 52}/extra.bin",
            "expected a file listed in bundle.json",
        ),
        ("outside", _extra("elsewhere.txt"), "elsewhere.txt", "expected a path under manifests-v8, triton-v1"),
        ("checksum", _altered_hsaco, ".hsaco", "expected the sha256 bundle.json lists"),
        (
            "toolchain",
            _other_toolchain,
            BUNDLE_FILE,
            "expected a bundle this machine can serve; for gfx942: toolchain mismatch: baked with Triton key fff",
        ),
    ],
)
def test_a_crafted_archive_is_refused_and_the_destination_untouched(baked, tmp_path, case, edit, member, reason):
    _, archive, _ = baked
    crafted = _rewrite(archive, tmp_path / f"{case}.tgz", edit)
    destination = tmp_path / "cache"
    destination.mkdir()
    (destination / "keep.txt").write_text("untouched")
    before = tree(destination)
    with pytest.raises(BundleError) as refused:
        import_archive(crafted, CacheLayout.of(destination))
    assert member in refused.value.member and reason in str(refused.value), str(refused.value)
    assert tree(destination) == before
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/kprecompile-absolute").exists()
    # Through the CLI: exit 2, one line naming the member and the reason.
    status = run("import", str(crafted), "--cache-dir", str(destination))
    assert status == 2 and tree(destination) == before


def test_import_of_something_that_is_not_an_archive(tmp_path, capsys):
    bogus = tmp_path / "bogus.tgz"
    bogus.write_bytes(b"not a tar")
    assert run("import", str(bogus), "--cache-dir", str(tmp_path / "cache")) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"kprecompile: archive: got '{bogus}', expected a readable .tar.gz bundle")
        and err.count("\n") == 1
    )
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["bake", "--model", "deepseek-v2-lite", "--model", "no-such-model", "--target", "gfx942"],
            "kprecompile: --model: got 'no-such-model', expected a preset name",
        ),
        (
            ["bake", "--model", "deepseek-v2-lite", "--target", "gfx942", "--archive", "{tmp}/missing/dir/b.tgz"],
            "kprecompile: --archive: got '{tmp}/missing/dir/b.tgz', expected a file in an existing directory",
        ),
        (
            ["bake", "--model", "deepseek-v2-lite", "--target", "gfx942", "--archive", "{tmp}"],
            "kprecompile: Invalid value for '--archive': File '{tmp}' is a directory.",
        ),
        (
            ["export", "--model", "deepseek-v2-lite", "--target", "gfx942", "--archive", "{tmp}/x.tgz"],
            "kprecompile: configuration: got 'deepseek-v2-lite on gfx942', expected one warmed in {tmp}/empty: run "
            "`kprecompile warm` with the same options first",
        ),
    ],
)
def test_bad_bake_and_export_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "bundle"
    argv = [part.format(tmp=tmp_path) for part in argv]
    extra = ["--out", str(out)] if argv[0] == "bake" else ["--cache-dir", str(tmp_path / "empty")]
    assert run(*argv, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "x.tgz").exists()


BAKE = ["bake", *SELECTION, "--target", "gfx942", "--jobs", "1", "--no-recorded"]


def test_bake_refuses_an_out_directory_holding_files_it_did_not_bake(tmp_path, capsys):
    """The issue's planted aiter-jit-v1/evil.so in a directory that is no bundle. Guard: the
    no-bundle.json refusal in `check_bake_directory`."""
    out = tmp_path / "out"
    (out / "aiter-jit-v1").mkdir(parents=True)
    (out / "aiter-jit-v1" / "evil.so").write_bytes(b"\x7fELF planted")
    before = tree(out)
    assert run(*BAKE, "--out", str(out)) == 2
    assert capsys.readouterr().err == (
        f"kprecompile: --out: got '{out}', expected an empty directory or a bundle kprecompile baked "
        "(it holds aiter-jit-v1, no bundle.json)\n"
    )
    assert tree(out) == before


def test_bake_into_its_earlier_bundle_lists_only_what_it_baked(baked, tmp_path, capsys):
    """An earlier bundle with a planted JIT module is refused (guard: the JIT check in
    `check_bake_directory`); a planted Triton entry is left out of bundle.json and the archive
    (guard: `baked_files`). Control: the earlier bundle as it was bakes again, exit 0."""
    source, _, _ = baked
    out = tmp_path / "out"
    shutil.copytree(source, out)
    (out / "aiter-jit-v1").mkdir(exist_ok=True)
    (out / "aiter-jit-v1" / "evil.so").write_bytes(b"\x7fELF planted")
    assert run(*BAKE, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kprecompile: --out: got '{out}', expected an empty directory or a bundle kprecompile baked "
        "(aiter-jit-v1/evil.so is not a file its bundle.json lists: remove it, or bake into an empty directory)\n"
    )
    (out / "aiter-jit-v1" / "evil.so").unlink()
    planted = out / "triton-v1" / ("B" * 52)
    planted.mkdir()
    (planted / "evil.hsaco").write_bytes(b"\x7fELF planted")
    archive = tmp_path / "again.tgz"
    assert run(*BAKE, "--out", str(out), "--archive", str(archive), "--json") == 0
    document = json.loads(capsys.readouterr().out)
    index = json.loads((out / BUNDLE_FILE).read_text())
    manifest = baked_manifest(CacheLayout.of(out), TARGETS["gfx942"]).manifest
    entries = {name.split("/")[1] for name in index["files"] if name.startswith("triton-v1/")}
    assert entries == {compiled_files(CacheLayout.of(out), job.key)[0].parent.name for job in manifest.jobs}
    assert not any("evil" in name for name in index["files"])
    with tarfile.open(archive) as tar:
        assert not any("evil" in name for name in tar.getnames())
    assert [c["target"] for c in document["configurations"]] == ["gfx942"]
