"""`kprecompile import` as an adversary would try it: crafted and damaged archives are refused
with one line, exit 2 and the cache untouched; what the cache already holds is kept when intact
and replaced (and reported) when damaged; concurrent imports and warms end warm; what a killed
import left is removed by the next run.

Archives are the session's real bake (`conftest.baked`), unpacked, edited and packed again
with `tarfile`, or written by GNU tar; nothing under test is replaced by a stand-in.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import pytest
from helpers import pack, record, unpack

from kprecompile.cache.archive_check import ImportLimits
from kprecompile.cache.bundle import BUNDLE_FILE
from kprecompile.cache.layout import CacheLayout, triton_entry_name
from kprecompile.cache.manifest import document_checksum
from kprecompile.cache.staging import remove_stale_staging
from kprecompile.cli import main
from kprecompile.warmup.bundling import import_archive

SELECTION = ["--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "3"]
MANIFESTS = "manifests-v8"
JIT = "aiter-jit-v1"


def run(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        main([str(part) for part in argv])
    return exited.value.code


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int, str]]:
    """Every path under root with its size, content hash and a file's modification time: any write
    shows (a directory's own time changes when an entry is renamed out and back in)."""
    state = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] in skip:
            continue
        status = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        state[relative] = (status.st_size if digest else 0, 0 if path.is_dir() else status.st_mtime_ns, digest)
    return state


def member(name: str, size: int = 1, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info


def first(files: dict[str, bytes], suffix: str) -> str:
    return next(name for name in sorted(files) if name.endswith(suffix))


def a_manifest(files: dict[str, bytes]) -> tuple[str, dict]:
    name = next(name for name in sorted(files) if name.startswith(MANIFESTS))
    return name, json.loads(files[name])


def edit_manifest(change):
    def edit(index, files):
        name, document = a_manifest(files)
        change(document)
        files[name] = json.dumps(document).encode()

    return edit


def edit_group(payload: bytes):
    def edit(index, files):
        files[_group(files)] = payload

    return edit


def _group(files: dict[str, bytes]) -> str:
    return next(name for name in sorted(files) if name.rpartition("/")[2].startswith("__grp__"))


def edit_index(change):
    def edit(index, files):
        change(index)

    return edit


def set_key(path: tuple, value):
    def change(document):
        target = document
        for part in path[:-1]:
            target = target[part]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return change


DELETE = object()
ENTRY = "triton-v1/" + "A" * 52  # a well-formed entry name (32 zero bytes) no bundle holds


def drop_an_entry(index, files):
    """Every file of the first manifest's first kernel."""
    entry = "triton-v1/" + triton_entry_name(a_manifest(files)[1]["jobs"][0]["key"])
    for name in [name for name in files if name.startswith(entry + "/")]:
        del files[name]


def other_recorded_checksum(index, files):
    name, document = a_manifest(files)
    job = document["jobs"][0]
    file_name = sorted(job["artifacts"])[0]
    job["artifacts"][file_name]["sha256"] = "0" * 64
    # Consistent with itself (its checksum recomputed), inconsistent with the bundle.
    document["checksum"] = document_checksum(document)
    files[name] = json.dumps(document).encode()


MODULE = sysconfig.get_config_var("EXT_SUFFIX")


def recorded_module(data: bytes):
    """A manifest, consistent with itself, recording a driver module the bundle lacks."""

    def edit(index, files):
        name, document = a_manifest(files)
        record = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        document["launchers"] = {"0" * 64: {f"__triton_launcher{MODULE}": record}}
        document["checksum"] = document_checksum(document)
        files[name] = json.dumps(document).encode()

    return edit


def swap_job_keys(index, files):
    """Two jobs' keys swapped: every field well-formed, the document no longer its checksum's."""
    name, document = a_manifest(files)
    first, second = document["jobs"][:2]
    first["key"], second["key"] = second["key"], first["key"]
    files[name] = json.dumps(document).encode()


def extra(*members):
    def edit(index, files):
        return list(members)

    return edit


def duplicate_with_dot(index, files):
    """`E/x.hsaco` and `E/./x.hsaco`: tar extracts the second over the first."""
    name = first(files, ".hsaco")
    entry, _, file_name = name.rpartition("/")
    other = b"\x7fELF" + b"\0" * 100
    return [(member(f"{entry}/./{file_name}", len(other)), other)]


def duplicate_exactly(index, files):
    name = first(files, ".hsaco")
    return [(member(name, len(files[name])), files[name])]


def jit_file(index, files):
    files[f"{JIT}/module_test.so"] = b"bundle's module"


# (case, edit(index, files) -> extra members or None, pack options, the expected message after
# "kprecompile: ", {member} standing for the edited member's name)
REFUSED = [
    # bundle.json shapes (issue 13, items 7 and 15)
    (
        "index-files-a-list",
        edit_index(set_key(("files",), [])),
        {"reindex": False},
        "archive member: got 'bundle.json', expected a valid bundle index (files is a JSON array, expected an object)",
    ),
    (
        "index-entry-a-string",
        None,
        {"index_files": "not a record"},
        "archive member: got 'bundle.json', expected a valid bundle index (files['manifests-v8/",
    ),
    (
        "index-toolchains-a-list",
        edit_index(set_key(("toolchains",), [])),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (toolchains is a JSON array, expected an "
        "object)",
    ),
    (
        "index-toolchain-a-string",
        edit_index(set_key(("toolchains", "gfx942"), "x")),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (toolchains['gfx942'] is a JSON string, "
        "expected an object)",
    ),
    (
        "index-toolchain-field-a-number",
        edit_index(set_key(("toolchains", "gfx942", "triton_key"), 7)),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (toolchains['gfx942'].triton_key is 7",
    ),
    (
        "index-without-configurations",
        edit_index(set_key(("configurations",), DELETE)),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (configurations is a JSON null, expected an "
        "array)",
    ),
    (
        "index-configuration-a-string",
        edit_index(set_key(("configurations",), ["x"])),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (configurations[0] is a JSON string",
    ),
    (
        "index-configuration-names-no-manifest",
        edit_index(set_key(("configurations", 0, "manifest"), "0" * 64)),
        {},
        "archive member: got 'bundle.json', expected configurations naming manifests in the bundle (configurations[0] "
        "names 000",
    ),
    (
        "index-schema",
        edit_index(set_key(("schema",), True)),
        {},
        "archive member: got 'bundle.json', expected a valid bundle index (schema is True, expected 1)",
    ),
    (
        "index-an-array",
        None,
        {"index_bytes": b"[]"},
        "archive member: got 'bundle.json', expected a valid bundle index (a JSON array, not an object)",
    ),
    (
        "index-not-json",
        None,
        {"index_bytes": b"{nope"},
        "archive member: got 'bundle.json', expected a valid bundle index (Expecting property name",
    ),
    (
        "index-deep-nesting",
        None,
        {"index_bytes": b"[" * 100000 + b"]" * 100000},
        "archive member: got 'bundle.json', expected a valid bundle index (nested too deeply)",
    ),
    (
        "index-long-integer",
        None,
        {"index_bytes": b'{"schema": ' + b"9" * 5000 + b"}"},
        "archive member: got 'bundle.json', expected a valid bundle index (Exceeds the limit",
    ),
    # Manifests, checked as `read_manifest` checks them, before any is installed (item 6)
    (
        "manifest-garbage",
        lambda index, files: files.update({a_manifest(files)[0]: b"garbage"}),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (Expecting value",
    ),
    (
        "manifest-non-hex-job-key",
        edit_manifest(lambda d: d["jobs"][0].update(key="../" + "z" * 61)),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (job 0's key is not a Triton cache "
        "key",
    ),
    (
        "manifest-jobs-an-object",
        edit_manifest(set_key(("jobs",), {})),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (jobs is not a list)",
    ),
    (
        "manifest-artifacts-a-list",
        edit_manifest(lambda d: d["jobs"][0].update(artifacts=[])),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (job 0's artifacts is not an object)",
    ),
    (
        "manifest-parts-changed",
        edit_manifest(lambda d: d["parts"].update(target="gfx90a")),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (its parts do not hash to its key)",
    ),
    (
        "manifest-a-string",
        lambda index, files: files.update({a_manifest(files)[0]: b'"x"'}),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (a JSON str, not an object)",
    ),
    (
        "manifest-records-other-content",
        other_recorded_checksum,
        {},
        "archive member: got 'manifests-v8/{manifest}', expected files in the bundle as it records them",
    ),
    # Triton's driver modules: only those a manifest records, as it records them
    (
        "planted-driver-module",
        lambda index, files: files.update({f"{ENTRY}/__triton_launcher{MODULE}": b"\x7fELF planted"}),
        {},
        f"archive member: got '{ENTRY}/', expected a kernel entry with its group file, or a driver module a "
        "manifest of the bundle records",
    ),
    (
        "driver-module-beside-a-kernel",
        lambda index, files: files.update({f"{first(files, '.hsaco').rpartition('/')[0]}/hip_utils{MODULE}": b"x"}),
        {},
        "archive member: got '{group}', expected a Triton group file: an object whose child_paths names every other "
        "file of its entry",
    ),
    (
        "manifest-driver-module-named-by-a-path",
        edit_manifest(lambda d: d.update(launchers={"0" * 64: {"../x.so": {"sha256": "0" * 64, "size": 1}}})),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (launchers is not Triton keys with "
        "the plain names, sizes and sha256 of their files)",
    ),
    (
        "manifest-records-a-driver-module-not-in-the-bundle",
        recorded_module(b"\x7fELF recorded"),
        {},
        "archive member: got 'manifests-v8/{manifest}', expected Triton's driver modules in the bundle as it "
        "records them",
    ),
    (
        "manifest-job-keys-swapped",
        swap_job_keys,
        {},
        "archive member: got 'manifests-v8/{manifest}', expected a valid manifest (its content does not match its "
        "checksum)",
    ),
    (
        "manifest-without-its-entries",
        drop_an_entry,
        {},
        "archive member: got 'manifests-v8/{manifest}', expected kernel entries in the bundle for its jobs",
    ),
    # Triton group files (item 7)
    (
        "group-not-json",
        edit_group(b"{not json"),
        {},
        "archive member: got '{group}', expected a Triton group file: an object whose child_paths names every other "
        "file of its entry",
    ),
    (
        "group-child-paths-a-list",
        edit_group(b'{"child_paths": ["a", "b"]}'),
        {},
        "archive member: got '{group}', expected a Triton group file",
    ),
    (
        "group-names-a-missing-file",
        edit_group(b'{"child_paths": {"ghost.hsaco": "/x/ghost.hsaco"}}'),
        {},
        "archive member: got '{group}', expected a Triton group file",
    ),
    (
        "group-names-a-path-elsewhere",
        edit_group(b'{"child_paths": {"x.hsaco": "/etc/passwd"}}'),
        {},
        "archive member: got '{group}', expected a Triton group file",
    ),
    # Member paths and shapes (items 11 and 12)
    (
        "dot-duplicate",
        duplicate_with_dot,
        {},
        "archive member: got '{entry}/./{hsaco}', expected one member per path: "
        "{entry}/{hsaco} is in the archive twice",
    ),
    ("exact-duplicate", duplicate_exactly, {}, "archive member: got '{entry}/{hsaco}', expected one member per path"),
    (
        "stray-file-in-triton",
        extra((member("triton-v1/stray"), b"x")),
        {},
        "archive member: got 'triton-v1/stray', expected a path shaped like a bundle's files",
    ),
    (
        "file-at-an-entry-path",
        extra((member(ENTRY), b"x")),
        {},
        f"archive member: got '{ENTRY}', expected a path shaped like a bundle's files",
    ),
    (
        "entry-not-a-key",
        extra((member("triton-v1/ABC/x.hsaco"), b"x")),
        {},
        "archive member: got 'triton-v1/ABC/x.hsaco', expected a path shaped like a bundle's files",
    ),
    (
        "directory-inside-an-entry",
        extra((member(f"{ENTRY}/sub/x.hsaco"), b"x")),
        {},
        f"archive member: got '{ENTRY}/sub/x.hsaco', expected a path shaped like a bundle's files",
    ),
    (
        "manifest-name-not-a-key",
        extra((member(f"{MANIFESTS}/x.json"), b"x")),
        {},
        "archive member: got 'manifests-v8/x.json', expected a path shaped like a bundle's files",
    ),
    (
        "unlisted-member",
        extra((member(f"{ENTRY}/x.hsaco"), b"x")),
        {},
        f"archive member: got '{ENTRY}/x.hsaco', expected a file listed in bundle.json",
    ),
    (
        "hidden-traversal",
        extra((member(f"{JIT}/a/../../../escaped"), b"x")),
        {},
        f"archive member: got '{JIT}/a/../../../escaped', expected a path inside the destination",
    ),
    # Archive bombs and size bounds (item 10): refused from the header, before a byte is read
    (
        "sparse-member",
        extra((member(f"{JIT}/bomb.so", 0, tarfile.GNUTYPE_SPARSE), None)),
        {},
        f"archive member: got '{JIT}/bomb.so', expected a regular file, not a sparse one",
    ),
    (
        "huge-member",
        extra((member(f"{JIT}/huge.so", 2 << 30), None)),
        {},
        f"archive member: got '{JIT}/huge.so', expected a file of at most 1,073,741,824 bytes, not 2,147,483,648",
    ),
    (
        "huge-index",
        None,
        {"index_member": member(BUNDLE_FILE, 1 << 30)},
        "archive member: got 'bundle.json', expected a file of at most 67,108,864 bytes, not 1,073,741,824",
    ),
    # Damaged archives (item 12)
    (
        "truncated-gzip",
        None,
        {"cut": 0.6},
        "archive: got '{archive}', expected a complete archive: it ends early (a truncated download or copy?)",
    ),
    (
        "truncated-tar-in-a-member",
        None,
        {"mode": "w", "cut": "member"},
        "archive: got '{archive}', expected a complete archive: it ends early",
    ),
    (
        "truncated-tar-at-a-header",
        None,
        {"mode": "w", "cut": "header"},
        "archive: got '{archive}', expected a complete archive: it ends early",
    ),
    # Flipped bytes inside the deflate stream decode to other bytes as often as to an error: the
    # member they land in fails its sha256 before gzip's CRC at the end is reached (both refuse).
    (
        "damaged-gzip",
        None,
        {"flip": 0.5},
        ("archive: got '{archive}', expected an intact archive (", "archive member: got 'triton-v1/"),
    ),
    (
        "damaged-tar-header",
        None,
        {"mode": "w", "flip": "header"},
        "archive: got '{archive}', expected an intact archive (an unreadable member header at byte",
    ),
    # AITER's JIT directory: never overwritten silently (item 5)
    (
        "jit-file-with-other-content",
        jit_file,
        {"cache_jit": b"the cache's own module"},
        f"archive member: got '{JIT}/module_test.so', expected a file the cache does not hold with other content",
    ),
    (
        "jit-file-where-a-directory-is",
        lambda index, files: files.update({f"{JIT}/module_test.so/x.so": b"m"}),
        {"cache_jit": b"the cache's own module"},
        f"archive member: got '{JIT}/module_test.so/x.so', expected a file the cache does not hold with other content",
    ),
]


def craft(archive: Path, out: Path, edit, options: dict) -> Path:
    index, files = unpack(archive)
    index = copy.deepcopy(index)
    extras = (edit(index, files) if edit else None) or []
    if "index_files" in options:
        index = {**index, "files": {name: record(data) for name, data in files.items()}}
        index["files"][sorted(index["files"])[0]] = options["index_files"]
    pack_options = {key: options[key] for key in ("reindex", "index_bytes") if key in options}
    if "index_files" in options:
        pack_options["reindex"] = False
    mode = options.get("mode", "w:gz")
    if "index_member" in options:
        with tarfile.open(out, mode, format=tarfile.GNU_FORMAT) as tar:
            tar.addfile(options["index_member"], None)
        return out
    pack(out, index, files, extras, mode=mode, **pack_options)
    if "cut" in options or "flip" in options:
        data = bytearray(out.read_bytes())
        if options.get("cut") == "header" or options.get("flip") == "header":
            # At the header of the last member (uncompressed archives only).
            with tarfile.open(out) as tar:
                offset = tar.getmembers()[-1].offset
            if "cut" in options:
                data = data[: offset + 100]
            else:
                data[offset : offset + 100] = b"\xff" * 100
        elif options.get("cut") == "member":
            # Inside the data of the largest member (a fixed fraction of an uncompressed archive
            # can land in a header's zero padding, which tar reads as an empty header instead).
            with tarfile.open(out) as tar:
                largest = max(tar.getmembers(), key=lambda member: member.size)
            data = data[: largest.offset_data + largest.size // 2]
        elif "cut" in options:
            data = data[: int(len(data) * options["cut"])]
        else:
            middle = int(len(data) * options["flip"])
            data[middle : middle + 64] = bytes(byte ^ 0x5A for byte in data[middle : middle + 64])
        out.write_bytes(bytes(data))
    return out


def names(archive: Path) -> dict[str, str]:
    _, files = unpack(archive)
    hsaco = first(files, ".hsaco")
    return {
        "manifest": a_manifest(files)[0].rpartition("/")[2],
        "group": _group(files),
        "entry": hsaco.rpartition("/")[0],
        "hsaco": hsaco.rpartition("/")[2],
    }


@pytest.mark.parametrize("case, edit, options, message", REFUSED, ids=[case[0] for case in REFUSED])
def test_a_crafted_or_damaged_archive_is_refused_with_one_line_and_the_cache_untouched(
    baked, tmp_path, capsys, case, edit, options, message
):
    _, archive, _ = baked
    crafted = craft(archive, tmp_path / f"{case}.tgz", edit, options)
    destination = tmp_path / "cache"
    destination.mkdir()
    (destination / "keep.txt").write_text("untouched")
    if "cache_jit" in options:
        (destination / JIT).mkdir()
        (destination / JIT / "module_test.so").write_bytes(options["cache_jit"])
    before = tree(destination)
    status = run("import", crafted, "--cache-dir", destination)
    captured = capsys.readouterr()
    messages = message if isinstance(message, tuple) else (message,)
    expected = tuple("kprecompile: " + text.format(archive=crafted, **names(archive)) for text in messages)
    assert status == 2, captured.err
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(expected), captured.err
    assert tree(destination) == before
    assert not (tmp_path / "escaped").exists()


def test_a_real_sparse_archive_from_gnu_tar_is_refused_before_it_is_unpacked(baked, tmp_path, capsys):
    """The bomb of the issue: GNU tar packs a large hole in a few bytes, listed in bundle.json
    with its true size and sha256."""
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    _, archive, _ = baked
    index, files = unpack(archive)
    source = tmp_path / "source"
    (source / JIT).mkdir(parents=True)
    size = 64 << 20
    with open(source / JIT / "bomb.so", "wb") as bomb:
        bomb.truncate(size)
    zeros = hashlib.sha256()
    for _ in range(size >> 20):
        zeros.update(bytes(1 << 20))
    index["files"] = {f"{JIT}/bomb.so": {"sha256": zeros.hexdigest(), "size": size}}
    (source / BUNDLE_FILE).write_text(json.dumps(index))
    for form in ("pax", "gnu"):
        bombed = tmp_path / f"sparse-{form}.tgz"
        subprocess.run(
            ["tar", "--sparse", f"--format={form}", "-czf", bombed, "-C", source, BUNDLE_FILE, f"{JIT}/bomb.so"],
            check=True,
        )
        assert bombed.stat().st_size < 10_000
        destination = tmp_path / f"cache-{form}"
        assert run("import", bombed, "--cache-dir", destination) == 2
        err = capsys.readouterr().err
        assert err == (
            f"kprecompile: archive member: got '{JIT}/bomb.so', expected a regular file, not a sparse one "
            "(kprecompile never writes those)\n"
        )
        assert not destination.exists()


@pytest.mark.parametrize(
    "limits, message",
    [
        (ImportLimits(total_bytes=100_000), "expected an archive of at most 100,000 bytes unpacked"),
        (ImportLimits(members=20), "expected an archive of at most 20 members"),
        (ImportLimits(member_bytes=10_000), "expected a file of at most 10,000 bytes, not"),
        (ImportLimits(index_bytes=1_000), "expected a file of at most 1,000 bytes, not"),
    ],
)
def test_an_archive_beyond_the_bounds_is_refused_before_anything_is_written(baked, tmp_path, limits, message):
    _, archive, _ = baked
    destination = tmp_path / "cache"
    with pytest.raises(ValueError, match="^archive member: got '.*', " + message.replace("(", r"\(")):
        import_archive(archive, CacheLayout.of(destination), limits)
    assert not destination.exists()


# --- What the cache already holds ----------------------------------------------------------


def imported(archive: Path, root: Path) -> CacheLayout:
    layout = CacheLayout.of(root)
    import_archive(archive, layout)
    return layout


def verify_status(root: Path, target: str, *extra) -> int:
    return run("verify", *SELECTION, "--target", target, "--cache-dir", root, "--deep", *extra)


def truncate_a_binary(entry: Path) -> None:
    hsaco = next(entry.glob("*.hsaco"))
    hsaco.write_bytes(hsaco.read_bytes()[:100])


def alter_a_binary_same_size(entry: Path) -> None:
    hsaco = next(entry.glob("*.hsaco"))
    data = bytearray(hsaco.read_bytes())
    data[-1] ^= 0xFF
    hsaco.write_bytes(bytes(data))


def remove_a_file(entry: Path) -> None:
    next(entry.glob("*.ttir")).unlink()


def remove_the_group_file(entry: Path) -> None:
    next(entry.glob("__grp__*")).unlink()


def a_file_instead(entry: Path) -> None:
    shutil.rmtree(entry)
    entry.write_bytes(b"planted")


def link_a_binary_elsewhere(entry: Path) -> None:
    hsaco = next(entry.glob("*.hsaco"))
    copy_elsewhere = entry.parent.parent / "elsewhere.hsaco"
    shutil.copy(hsaco, copy_elsewhere)
    hsaco.unlink()
    hsaco.symlink_to(copy_elsewhere)


DAMAGE = [
    truncate_a_binary,
    alter_a_binary_same_size,
    remove_a_file,
    remove_the_group_file,
    a_file_instead,
    link_a_binary_elsewhere,
]


def test_damaged_entries_are_replaced_and_reported_intact_ones_kept(baked, tmp_path, capsys, caplog):
    """Partial or altered entries used to count as "already present" (exit 0, cache not warm)."""
    _, archive, document = baked
    kernels = sum(c["kernels"] for c in document["configurations"])
    layout = imported(archive, tmp_path / "cache")
    entries = sorted(path for path in layout.triton_dir.iterdir())
    for damage, entry in zip(DAMAGE, entries, strict=False):
        damage(entry)
    kept = {entry.name: tree(entry) for entry in entries[len(DAMAGE) :]}
    assert run("import", archive, "--cache-dir", layout.root, "--json") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["entries_added"], report["entries_present"], report["entries_replaced"]) == (
        0,
        kernels - len(DAMAGE),
        len(DAMAGE),
    )
    assert caplog.text.count("replacing damaged kernel entry") == len(DAMAGE), caplog.text
    assert {entry.name: tree(entry) for entry in entries[len(DAMAGE) :]} == kept  # intact ones untouched
    assert verify_status(layout.root, "gfx942") == 0 and verify_status(layout.root, "gfx950") == 0


def garbage(path: Path) -> None:
    path.write_bytes(b"garbage")


def non_hex_job_key(path: Path) -> None:
    document = json.loads(path.read_text())
    document["jobs"][0]["key"] = "not-hex"
    path.write_text(json.dumps(document))


def a_directory_instead(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("damage", [garbage, non_hex_job_key, a_directory_instead])
def test_a_damaged_manifest_is_replaced_and_reported(baked, tmp_path, capsys, caplog, damage):
    _, archive, _ = baked
    layout = imported(archive, tmp_path / "cache")
    manifest = sorted(layout.manifests_dir.iterdir())[0]
    damage(manifest)
    assert run("import", archive, "--cache-dir", layout.root, "--json") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["manifests_added"], report["manifests_present"], report["manifests_replaced"]) == (0, 1, 1)
    assert f"replacing damaged manifest {manifest}" in caplog.text
    assert verify_status(layout.root, "gfx942") == 0 and verify_status(layout.root, "gfx950") == 0


def test_a_valid_manifest_already_there_is_never_overwritten(baked, tmp_path):
    """Same name, same parts: it says the same; the cache's own copy (here with other family rows,
    as another kprecompile version might write) stays byte for byte."""
    _, archive, _ = baked
    layout = imported(archive, tmp_path / "cache")
    manifest = sorted(layout.manifests_dir.iterdir())[0]
    document = json.loads(manifest.read_text())
    document["families"] = []
    document["checksum"] = document_checksum(document)
    manifest.write_text(json.dumps(document))
    before = manifest.read_bytes()
    report = import_archive(archive, layout)
    assert (report.manifests_added, report.manifests_present, report.manifests_replaced) == (0, 2, 0)
    assert manifest.read_bytes() == before


def test_jit_files_are_added_and_kept_when_the_same(baked, tmp_path):
    _, archive, _ = baked
    index, files = unpack(archive)
    files[f"{JIT}/build/module_test.so"] = b"module"
    with_jit = pack(tmp_path / "jit.tgz", index, files)
    layout = CacheLayout.of(tmp_path / "cache")
    report = import_archive(with_jit, layout)
    assert (report.jit_files_added, report.jit_files_present) == (1, 0)
    assert (layout.aiter_jit_dir / "build" / "module_test.so").read_bytes() == b"module"
    again = import_archive(with_jit, layout)
    assert (again.jit_files_added, again.jit_files_present) == (0, 1)


def test_a_failure_while_installing_undoes_every_step(baked, tmp_path):
    """All or nothing also after writing began: here the manifests' bucket is a file, so the last
    step fails after every entry and JIT file was installed; all of them are taken back."""
    _, archive, _ = baked
    index, files = unpack(archive)
    files[f"{JIT}/build/module_test.so"] = b"module"
    with_jit = pack(tmp_path / "jit.tgz", index, files)
    root = tmp_path / "cache"
    root.mkdir()
    (root / MANIFESTS).write_text("in the way")
    # One damaged entry, which the import moves aside, and must put back.
    (root / "triton-v1").mkdir()
    damaged = root / "triton-v1" / _group(files).split("/")[1]
    damaged.mkdir()
    (damaged / "partial.hsaco").write_bytes(b"partial")
    before = tree(root)
    with pytest.raises(FileExistsError):
        import_archive(with_jit, CacheLayout.of(root))
    # Lock files stay, as every warm leaves them: they hold no data.
    assert tree(root, skip=("locks-v1",)) == before
    assert not list(root.glob(".import-*"))


# --- Other processes ---------------------------------------------------------------------

# A real CLI process that, its imports done, says so and waits to be released with the others,
# so that the imports overlap.
AT_ONCE = """
import sys
import sysconfig
from kprecompile.cli import main
import kprecompile.warmup.bundling, kprecompile.cache.archive_install
import kprecompile.inputs.toolchain, kprecompile.inputs.targets
print("ready", flush=True)
sys.stdin.readline()
main(sys.argv[1:])
"""


def start_together(commands: list[list[str]]) -> list[subprocess.Popen]:
    """The commands in processes of their own, released together once every one is ready."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", AT_ONCE, *map(str, command)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for process in processes:
        # Nothing else is written before the release: the first line is the readiness alone.
        ready = process.stdout.readline()
        assert ready == "ready\n", ready + process.stderr.read()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    return processes


@pytest.mark.slow
def test_four_concurrent_imports_of_one_archive_all_succeed_and_add_each_entry_once(baked, tmp_path):
    """Renaming entries into place raced (ENOTEMPTY). 400 more entries (each with its group file,
    which import rewrites and syncs before the rename) keep the four processes installing long
    enough to overlap."""
    _, archive, document = baked
    index, files = unpack(archive)
    extra_entries = 400
    for number in range(extra_entries):
        name = triton_entry_name(hashlib.sha256(str(number).encode()).hexdigest())
        files[f"triton-v1/{name}/kernel.hsaco"] = b"kernel %d" % number
        files[f"triton-v1/{name}/__grp__kernel.json"] = json.dumps(
            {"child_paths": {"kernel.hsaco": "/b/kernel.hsaco"}}
        ).encode()
    many = pack(tmp_path / "many.tgz", index, files)
    entries = sum(c["kernels"] for c in document["configurations"]) + extra_entries
    root = tmp_path / "cache"
    processes = start_together([["import", many, "--cache-dir", root, "--json"]] * 4)
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert "Traceback" not in err
        reports.append(json.loads(out))
    assert sum(report["entries_added"] for report in reports) == entries
    assert sum(report["entries_present"] for report in reports) == 3 * entries
    assert sum(report["entries_replaced"] for report in reports) == 0
    assert sum(report["manifests_added"] for report in reports) == 2
    assert not list(root.glob(".import-*"))
    assert verify_status(root, "gfx942") == 0 and verify_status(root, "gfx950") == 0


@pytest.mark.slow
def test_an_import_beside_a_warm_of_the_same_configuration_both_end_warm(baked, tmp_path):
    _, archive, _ = baked
    root = tmp_path / "cache"
    warm_command = ["warm", *SELECTION, "--target", "gfx942", "--cache-dir", root, "--jobs", "1"]
    processes = start_together([warm_command, ["import", archive, "--cache-dir", root]])
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert "Traceback" not in err
    assert verify_status(root, "gfx942") == 0 and verify_status(root, "gfx950") == 0


def test_staging_left_by_a_killed_import_is_removed_by_the_next_run(baked, tmp_path):
    """kill -9 in the middle of unpacking (a large member keeps it busy): its staging directory
    stays behind; the next import removes it, and still imports."""
    _, archive, _ = baked
    index, files = unpack(archive)
    files[f"{JIT}/large.so"] = bytes(192 << 20)
    # Uncompressed: zeros packed by gzip are an archive bomb (1,000 times smaller), refused unread.
    large = pack(tmp_path / "large.tar", index, files, mode="w")
    root = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "-m", "kprecompile", "import", str(large), "--cache-dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not list(root.glob(".import-*/*")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = list(root.glob(".import-*"))
    assert left, "the import finished before it could be killed"
    assert run("import", archive, "--cache-dir", root) == 0
    assert not any(path.exists() for path in left)
    assert not list(root.glob(".import-*")) and not list(root.glob("locks-v1/import-*"))


HOLD_LOCK = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(descriptor, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


def test_a_running_imports_staging_is_left_alone_and_warm_cleans_a_dead_ones(warm_copy, tmp_path):
    """Staging is removed only when its owner is gone: its lock (an OS lock, released when the
    process dies) tells. A warm, too, removes what a dead import left."""
    root = warm_copy.root
    live, dead, old = root / ".import-live", root / ".import-dead", root / ".import-old"
    for staging in (live, dead, old):
        (staging / "triton-v1").mkdir(parents=True)
        (staging / "triton-v1" / "partial.hsaco").write_bytes(b"x" * 1000)
    (root / "locks-v1").mkdir(exist_ok=True)
    (root / "locks-v1" / "import-dead.lock").write_text("")  # its owner died: nobody holds it
    # (.import-old has no lock file at all: an import from before owner locks existed.)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(root / "locks-v1" / "import-live.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert run("warm", *SELECTION, "--target", "gfx942", "--cache-dir", root) == 0
        assert live.exists() and not dead.exists() and not old.exists()
        assert not (root / "locks-v1" / "import-dead.lock").exists()
    finally:
        holder.kill()
        holder.wait()
    # Its owner gone, the next run removes it.
    assert remove_stale_staging(warm_copy) == 1 and not live.exists()


def test_a_truncated_archive_is_not_reported_as_aborted(baked, tmp_path, capsys):
    """A gzip stream cut short raised EOFError, which click turned into `kprecompile: aborted`."""
    _, archive, _ = baked
    cut = tmp_path / "cut.tgz"
    data = archive.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert run("import", cut, "--cache-dir", tmp_path / "cache") == 2
    err = capsys.readouterr().err
    assert (
        err == f"kprecompile: archive: got '{cut}', expected a complete archive: it ends early (a truncated "
        "download or copy?)\n"
    )
    assert not (tmp_path / "cache").exists()


# --- Bounds on what an archive can make (issue 25, deliverable 4) ---------------------------


def _blank_journal(size: int) -> bytes:
    """`size` bytes of blank lines (64 KiB each): no record, all of it read."""
    line = b" " * ((64 << 10) - 1) + b"\n"
    return line * (size // len(line))


def _baked_journal_key(files: dict[str, bytes]) -> str:
    from kprecompile.warmup.manifest_key import journal_key

    return journal_key(a_manifest(files)[1]["parts"])


def test_an_archive_that_unpacks_to_more_than_the_ratio_is_refused_unread(baked, tmp_path, capsys):
    """The issue's bomb: zeros in aiter-jit-v1/ (1,000 times smaller gzipped). Guard: the
    `total > expansion` check in `read_archive`. Control: the same archive under a ratio it keeps
    imports, as does the real bake (about 6 times)."""
    _, archive, _ = baked
    index, files = unpack(archive)
    files[f"{JIT}/bomb.so"] = bytes(64 << 20)
    bomb = pack(tmp_path / "bomb.tgz", index, files)
    assert bomb.stat().st_size < 700_000
    destination = tmp_path / "cache"
    assert run("import", bomb, "--cache-dir", destination) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"kprecompile: archive member: got '{JIT}/bomb.so', expected an archive that unpacks to at most 100 times "
        f"its size ({100 * bomb.stat().st_size:,} bytes), not"
    ), err
    assert err.endswith("(an archive bomb?)\n") and err.count("\n") == 1
    assert not destination.exists()
    report = import_archive(bomb, CacheLayout.of(destination), ImportLimits(ratio=1000))
    assert report.jit_files_added == 1 and (destination / JIT / "bomb.so").stat().st_size == 64 << 20


def test_journals_beyond_their_bytes_in_all_are_refused(baked, tmp_path, capsys):
    """The issue's 60 blank 8 MiB journals. Guard: the `journal_bytes` check. Control: one such
    journal of the bundle's configuration is within the bound and imports."""
    _, archive, _ = baked
    index, files = unpack(archive)
    key = _baked_journal_key(files)
    blank = _blank_journal(8 << 20)
    many = dict(files)
    for number in range(9):
        many[f"journals-v1/{number:064x}.jsonl"] = blank
    bombed = pack(tmp_path / "journals.tar", index, many, mode="w")
    assert run("import", bombed, "--cache-dir", tmp_path / "cache") == 2
    err = capsys.readouterr().err
    assert err.startswith("kprecompile: archive member: got 'journals-v1/") and err.endswith(
        "expected journals of at most 67,108,864 bytes in all\n"
    ), err
    assert not (tmp_path / "cache").exists()
    one = pack(tmp_path / "one.tar", index, {**files, f"journals-v1/{key}.jsonl": blank}, mode="w")
    assert run("import", one, "--cache-dir", tmp_path / "cache") == 0


def test_journals_beyond_their_records_in_all_are_refused(baked, tmp_path):
    """Guard: the `journal_records` check. Control: the same journal under a bound it keeps."""
    from kprecompile.cache.journal import Record

    _, archive, _ = baked
    index, files = unpack(archive)
    key = _baked_journal_key(files)
    lines = b"".join(
        Record(
            f"{number:064x}", "m:k", "gfx942", "0" * 64, None, None, None, "m", 1.0, 1.0, 0.1, {"h": 1}, "local"
        ).to_line()
        for number in range(10)
    )
    journaled = pack(tmp_path / "records.tgz", index, {**files, f"journals-v1/{key}.jsonl": lines})
    with pytest.raises(ValueError, match=r"expected journals of at most 9 records in all$"):
        import_archive(journaled, CacheLayout.of(tmp_path / "cache"), ImportLimits(journal_records=9))
    assert not (tmp_path / "cache").exists()
    assert import_archive(journaled, CacheLayout.of(tmp_path / "cache")).journal_records == 10


def test_a_journal_of_a_configuration_the_bundle_does_not_list_is_refused(baked, tmp_path, capsys):
    """The issue's journals under keys no configuration has. Guard: the `listed` check in
    `_read_journals`. Control: the same journal under the bundle's configuration's key imports."""
    _, archive, _ = baked
    index, files = unpack(archive)
    key = _baked_journal_key(files)
    blank = _blank_journal(1 << 20)
    foreign = pack(tmp_path / "foreign.tgz", index, {**files, f"journals-v1/{'ab' * 32}.jsonl": blank})
    assert run("import", foreign, "--cache-dir", tmp_path / "cache") == 2
    assert capsys.readouterr().err == (
        f"kprecompile: archive member: got 'journals-v1/{'ab' * 32}.jsonl', expected the journal of a "
        "configuration bundle.json lists\n"
    )
    assert not (tmp_path / "cache").exists()
    own = pack(tmp_path / "own.tgz", index, {**files, f"journals-v1/{key}.jsonl": blank})
    assert run("import", own, "--cache-dir", tmp_path / "cache") == 0


def test_import_memory_does_not_grow_with_the_number_of_journals(baked, tmp_path):
    """The issue's 572 MB for 60 blank journals, growing with their number: journals are parsed
    while they are hashed, never held whole. Guard: `keep = None` for journals in `read_archive`
    (with their bytes kept, eight journals take 64 MiB more than one)."""
    import tracemalloc

    _, archive, _ = baked
    index, files = unpack(archive)
    blank = _blank_journal(8 << 20)
    peaks = []
    for count in (1, 8):
        journals = {f"journals-v1/{number:064x}.jsonl": blank for number in range(count)}
        path = pack(tmp_path / f"{count}.tar", index, {**files, **journals}, mode="w")
        tracemalloc.start()
        with pytest.raises(ValueError, match="expected the journal of a configuration bundle.json lists"):
            import_archive(path, CacheLayout.of(tmp_path / "cache"), ImportLimits(journal_bytes=1 << 30))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] + (8 << 20), peaks
