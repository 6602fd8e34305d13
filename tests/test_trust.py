"""The cache's trust boundary: a root, layer or bucket another user could write is refused
(one line, exit 2, nothing written), as ssh and sudo refuse such files; a private one is used."""

from __future__ import annotations

import os

import pytest
from helpers import kprecompile_cli

from kprecompile.cli import main

SELECTION = ["--model", "deepseek-v2-lite", "--target", "gfx942", "--family", "fp8_bmm", "--max-num-seqs", "4"]


def world_writable_root(root, other):
    root.chmod(0o777)


def group_writable_root(root, other):
    root.chmod(0o775)


def world_writable_bucket(root, other):
    (root / "manifests-v8").mkdir()
    (root / "manifests-v8").chmod(0o777)


def bucket_is_a_link(root, other):
    (root / "triton-v1").symlink_to(other)


def root_of_another_user(root, other):
    os.chown(root, 12345, 12345)


CASES = [
    (
        "world-writable-root",
        world_writable_root,
        "kprecompile: cache root: got '{root}', expected a directory only "
        "its owner can write, not mode 0o777 (chmod go-w {root})",
    ),
    (
        "group-writable-root",
        group_writable_root,
        "kprecompile: cache root: got '{root}', expected a directory only its owner can write, not mode 0o775",
    ),
    (
        "world-writable-bucket",
        world_writable_bucket,
        "kprecompile: cache root bucket: got '{root}/manifests-v8', "
        "expected a directory only its owner can write, not mode 0o777",
    ),
    (
        "bucket-is-a-link",
        bucket_is_a_link,
        "kprecompile: cache root bucket: got '{root}/triton-v1', expected a directory, not a symbolic link",
    ),
    pytest.param(
        "root-of-another-user",
        root_of_another_user,
        "kprecompile: cache root: got '{root}', expected a directory owned by you or root, not by uid 12345",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory away"),
    ),
]


@pytest.mark.parametrize("name, plant, message", CASES)
def test_a_cache_other_users_can_write_is_refused(tmp_path, capsys, name, plant, message):
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    other = tmp_path / "elsewhere"
    other.mkdir()
    plant(root, other)
    before = sorted(path.name for path in root.iterdir())
    with pytest.raises(SystemExit) as exited:
        main(["warm", *SELECTION, "--cache-dir", str(root)])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(message.format(root=root)), captured.err
    assert sorted(path.name for path in root.iterdir()) == before and list(other.iterdir()) == []


def test_a_layer_other_users_can_write_is_refused(tmp_path, capsys, monkeypatch):
    layer = tmp_path / "layer"
    layer.mkdir()
    layer.chmod(0o777)
    monkeypatch.setenv("KPRECOMPILE_CACHE_LAYERS", str(layer))
    with pytest.raises(SystemExit) as exited:
        main(["verify", *SELECTION, "--cache-dir", str(tmp_path / "cache")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"kprecompile: cache layer: got '{layer}', expected a directory only")


def test_a_private_cache_is_used(tmp_path, capsys):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    with pytest.raises(SystemExit) as exited:
        main(["verify", *SELECTION, "--cache-dir", str(root)])
    # Not warm (exit 1), but looked at: no refusal.
    assert exited.value.code == 1
    assert "not warm" in capsys.readouterr().out


@pytest.mark.compiles
def test_an_os_error_is_one_line_naming_the_path_and_the_fix(tmp_path, capsys):
    """A directory where the manifest belongs (or a full disk, a read-only file system): one line,
    exit 1, no temporary file left, never a traceback."""
    import json

    root = tmp_path / "cache"
    argv = ["warm", *SELECTION, "--cache-dir", str(root)]
    with pytest.raises(SystemExit):
        main([*argv, "--json"])
    [manifest] = json.loads(capsys.readouterr().out)["manifests"]
    os.unlink(manifest)
    os.mkdir(manifest)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    assert exited.value.code == 1
    assert captured.err.splitlines()[-1] == (
        f"kprecompile: Is a directory: {manifest}; a directory is where a file belongs: remove it"
    )
    assert "Traceback" not in captured.err
    # No temporary file; beside the manifest, only the memo of its first warm's check.
    assert sorted(path.name for path in (root / "manifests-v8").iterdir()) == [
        os.path.basename(manifest).replace(".json", ".checked"),
        os.path.basename(manifest),
    ]


def test_a_cache_inside_a_parent_everyone_can_write_without_the_sticky_bit_is_refused(tmp_path, capsys):
    """Anyone could rename the cache away and put their own in its place. Guard: `check_parents`.
    Control: the same parent with the sticky bit (as /tmp is) is accepted."""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    root = parent / "cache"
    with pytest.raises(SystemExit) as exited:
        main(["verify", *SELECTION, "--cache-dir", str(root)])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err == (
        f"kprecompile: cache root: got '{root}', expected a directory whose parents only their owners can write, "
        f"not {parent} (mode 0o777, no sticky bit: chmod go-w {parent}, or choose another directory)\n"
    )
    assert list(parent.iterdir()) == []
    parent.chmod(0o1777)
    with pytest.raises(SystemExit) as exited:
        main(["verify", *SELECTION, "--cache-dir", str(root)])
    assert exited.value.code == 1 and "not warm" in capsys.readouterr().out


@pytest.fixture
def group_umask():
    """umask 002, a user's own group: the default for users on Fedora and RHEL."""
    previous = os.umask(0o002)
    yield
    os.umask(previous)


@pytest.mark.compiles
def test_a_cache_made_under_umask_002_is_accepted_by_the_next_command(tmp_path, group_umask):
    """kprecompile made its root and buckets group-writable under umask 002 (and Triton its
    bucket), then refused them in the next command. Now each directory warm, bake and import (or
    the processes they point at the cache) make is writable by its owner alone, and verify takes
    each cache."""
    cache, out, imported = tmp_path / "cache", tmp_path / "new" / ".." / "bundle", tmp_path / "imported"
    selection = ["--model", "deepseek-v2-lite", "--max-num-seqs", "3", "--target", "gfx942"]
    assert kprecompile_cli("warm", *selection, "--cache-dir", cache).returncode == 0
    # bake and import too; a `..` in a path changes nothing that already exists (tmp_path itself).
    tmp_path.chmod(0o775)
    archive = tmp_path / "bundle.tgz"
    baked = kprecompile_cli("bake", *selection, "--out", out, "--archive", archive)
    assert baked.returncode == 0, baked.stderr
    assert kprecompile_cli("import", archive, "--cache-dir", imported).returncode == 0
    assert tmp_path.stat().st_mode & 0o777 == 0o775
    for root in (cache, tmp_path / "bundle", imported):
        directories = [root, *(path for path in root.iterdir() if path.is_dir())]
        assert {"triton-v1", "manifests-v8"} <= {path.name for path in directories}, root
        assert not [path for path in directories if path.stat().st_mode & 0o022], root
        done = kprecompile_cli("verify", *selection, "--cache-dir", root)
        assert done.returncode == 0, done.stderr
