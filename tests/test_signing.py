"""Signed archives: `export` and `bake --archive` sign `bundle.json` (which lists every member's
size and sha256) with the user's ed25519 key; `import` takes only archives a trusted key signed,
and refuses any other with one line naming `--allow-unsigned`, exit 2, nothing written.

Archives are the session's real bake (`conftest.baked`, signed by the session's key, which the
suite trusts through KPRECOMPILE_TRUSTED_KEYS), unpacked, edited and packed again; keys are real
ed25519 keys (`kprecompile key generate`, and ssh-keygen's where it is installed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import pack, unpack

from kprecompile.cache.layout import CacheLayout, triton_entry_name
from kprecompile.cache.manifest import document_checksum
from kprecompile.cache.signing import generate_key
from kprecompile.cli import main

SELECTION = ["--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "3"]
MANIFESTS = "manifests-v8"
REFUSAL = (
    "kprecompile: archive: got '{archive}', expected an archive signed by a trusted key: {problem} (trust its "
    "signer's public key with --trusted-key or KPRECOMPILE_TRUSTED_KEYS, or import it anyway with --allow-unsigned)\n"
)


def run(*argv) -> int:
    with pytest.raises(SystemExit) as exited:
        main([str(part) for part in argv])
    return exited.value.code


def tree(root: Path) -> dict[str, tuple[int, str]]:
    return {
        path.relative_to(root).as_posix(): (path.lstat().st_size, path.read_bytes().hex() if path.is_file() else "")
        for path in sorted(root.rglob("*"))
    }


def forge_a_binary(archive: Path, out: Path, **pack_options) -> Path:
    """The issue's forgery: flip a byte of a binary, write its sha256 into the manifest and the
    manifest's checksum anew, and list it so in bundle.json: every check but the signature passes."""
    index, files = unpack(archive)
    name = next(name for name in sorted(files) if name.startswith(MANIFESTS))
    manifest = json.loads(files[name])
    job = manifest["jobs"][0]
    [binary] = [file_name for file_name in job["artifacts"] if file_name.endswith(".hsaco")]
    # The binary of that job's own entry (another job may have a file of the same name).
    member = next(member for member in files if member.endswith(f"/{triton_entry_name(job['key'])}/{binary}"))
    forged = bytearray(files[member])
    forged[-1] ^= 0xFF
    files[member] = bytes(forged)
    job["artifacts"][binary] = {"sha256": hashlib.sha256(forged).hexdigest(), "size": len(forged)}
    manifest["checksum"] = document_checksum(manifest)
    files[name] = json.dumps(manifest).encode()
    return pack(out, index, files, **pack_options)


@pytest.fixture
def attacker_key(tmp_path) -> str:
    (tmp_path / "attacker").mkdir()
    return generate_key(tmp_path / "attacker" / "key").private_key_path


@pytest.mark.parametrize(
    "case, pack_options, problem",
    [
        ("unsigned", {"signed": False}, "it is unsigned"),
        ("signed-by-another-key", {"key_path": "attacker"}, "it is signed by {attacker}, which is not a trusted key"),
    ],
)
def test_a_forged_binary_with_a_consistent_manifest_and_index_is_refused(
    baked, tmp_path, capsys, caplog, attacker_key, case, pack_options, problem
):
    """Guard: `_check_signature` in cache/archive_check.py (without it this archive imports, exit
    0, and verify --deep says warm on the forged binary)."""
    _, archive, _ = baked
    if pack_options.get("key_path") == "attacker":
        pack_options = {"key_path": attacker_key}
    forged = forge_a_binary(archive, tmp_path / f"{case}.tgz", **pack_options)
    destination = tmp_path / "cache"
    assert run("import", forged, "--cache-dir", destination) == 2
    captured = capsys.readouterr()
    attacker = json.loads(_index_bytes(forged)).get("signing_key")
    assert captured.out == ""
    assert captured.err == REFUSAL.format(archive=forged, problem=problem.format(attacker=attacker))
    assert not destination.exists()
    # The control: the flag it names accepts the same archive (with a warning), so what refused it
    # was the signature alone.
    assert run("import", forged, "--cache-dir", destination, "--allow-unsigned", "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["signing_key"] is None
    assert "without a trusted signature (--allow-unsigned)" in caplog.text


def _index_bytes(archive: Path) -> bytes:
    import tarfile

    with tarfile.open(archive) as tar:
        return tar.extractfile("bundle.json").read()


def test_a_signature_that_does_not_match_the_index_is_refused(baked, tmp_path, capsys):
    """The real signature kept, bundle.json changed after it (a forged binary listed)."""
    _, archive, _ = baked
    import tarfile

    with tarfile.open(archive) as tar:
        real_signature = tar.extractfile("bundle.sig").read()
    index, files = unpack(archive)
    forged = forge_a_binary(archive, tmp_path / "resigned.tgz")
    # Replace the fresh (valid) signature by the one the baked index had.
    repacked = tmp_path / "stale-signature.tgz"
    with tarfile.open(forged) as source, tarfile.open(repacked, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == "bundle.sig":
                data = real_signature
                member.size = len(data)
            import io

            target.addfile(member, io.BytesIO(data))
    assert run("import", repacked, "--cache-dir", tmp_path / "cache") == 2
    fingerprint = index["signing_key"]
    problem = f"its signature by {fingerprint} does not match bundle.json (changed after it was signed)"
    assert capsys.readouterr().err == REFUSAL.format(archive=repacked, problem=problem)
    assert not (tmp_path / "cache").exists()


def test_with_no_trusted_key_every_archive_is_refused_and_trust_comes_from_the_flag_or_the_setting(
    baked, tmp_path, capsys, monkeypatch
):
    """The default: no key is trusted. Negative controls: the signer's public key, as a file or as
    the key line, through --trusted-key or KPRECOMPILE_TRUSTED_KEYS, accepts the same archive."""
    _, archive, document = baked
    public_key_file = os.environ["KPRECOMPILE_TRUSTED_KEYS"]
    monkeypatch.delenv("KPRECOMPILE_TRUSTED_KEYS")
    fingerprint = document["signing_key"]
    assert fingerprint.startswith("SHA256:")
    assert run("import", archive, "--cache-dir", tmp_path / "refused") == 2
    problem = f"it is signed by {fingerprint}, which is not a trusted key"
    assert capsys.readouterr().err == REFUSAL.format(archive=archive, problem=problem)
    assert not (tmp_path / "refused").exists()
    key_line = Path(public_key_file).read_text().strip()
    for number, trust in enumerate([["--trusted-key", public_key_file], ["--trusted-key", key_line]]):
        assert run("import", archive, "--cache-dir", tmp_path / f"flag{number}", *trust, "--json") == 0
        assert json.loads(capsys.readouterr().out)["signing_key"] == fingerprint
    monkeypatch.setenv("KPRECOMPILE_TRUSTED_KEYS", key_line)
    assert run("import", archive, "--cache-dir", tmp_path / "setting") == 0
    assert capsys.readouterr().out.rstrip().endswith(f"signed by {fingerprint}")


@pytest.mark.parametrize(
    "trusted, message",
    [
        ("{tmp}/missing.pub", "--trusted-key: got '{tmp}/missing.pub', expected an ed25519 public key"),
        ("ssh-rsa AAAAB3NzaC1yc2E", "--trusted-key: got 'ssh-rsa AAAAB3NzaC1yc2E', expected an ed25519 public key"),
        ("{tmp}/garbage.pub", "--trusted-key: got '{tmp}/garbage.pub', expected a file of ed25519 public keys"),
    ],
)
def test_a_bad_trusted_key_is_one_line_and_exit_2(baked, tmp_path, capsys, trusted, message):
    _, archive, _ = baked
    (tmp_path / "garbage.pub").write_text("not a key\n")
    trusted = trusted.format(tmp=tmp_path)
    assert run("import", archive, "--cache-dir", tmp_path / "cache", "--trusted-key", trusted) == 2
    err = capsys.readouterr().err
    assert err.startswith("kprecompile: " + message.format(tmp=tmp_path)) and err.count("\n") == 1, err
    assert not (tmp_path / "cache").exists()


def test_key_generate_writes_a_private_key_only_its_owner_reads_and_prints_the_fingerprint(tmp_path, capsys):
    path = tmp_path / "signing"
    assert run("key", "generate", path, "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert document["public_key"] == (tmp_path / "signing.pub").read_text().strip()
    assert document["public_key"].startswith("ssh-ed25519 ") and document["fingerprint"].startswith("SHA256:")
    if shutil.which("ssh-keygen"):
        listed = subprocess.run(["ssh-keygen", "-lf", str(path) + ".pub"], capture_output=True, text=True, check=True)
        assert listed.stdout.split()[1] == document["fingerprint"]
    # Never over an existing key.
    before = path.read_bytes()
    assert run("key", "generate", path) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kprecompile: PATH: got '{path}', expected a path where no file is yet (a key is never overwritten)\n"
    )
    assert path.read_bytes() == before


def test_export_signs_with_the_key_given_and_refuses_without_one(warm_copy, tmp_path, capsys, monkeypatch):
    """Export without a key is one line naming --signing-key, exit 2, no archive; an unprotected
    private key is refused as ssh refuses it; a key given signs, and import trusts it by its
    public key (and refuses it when only another key is trusted)."""
    monkeypatch.delenv("KPRECOMPILE_SIGNING_KEY")
    archive = tmp_path / "out.tgz"
    export = ["export", *SELECTION, "--target", "gfx942", "--cache-dir", warm_copy.root, "--archive", archive]
    assert run(*export) == 2
    err = capsys.readouterr().err
    expected = "kprecompile: --signing-key: got 'not given', expected a private key to sign the archive with"
    assert err.startswith(expected)
    assert err.count("\n") == 1 and not archive.exists()
    (tmp_path / "keys").mkdir()
    key = generate_key(tmp_path / "keys" / "mine")
    os.chmod(key.private_key_path, 0o644)
    assert run(*export, "--signing-key", key.private_key_path) == 2
    assert capsys.readouterr().err == (
        f"kprecompile: --signing-key: got '{key.private_key_path}', expected a private key only you can read, "
        "not mode 0o644 (chmod 600)\n"
    )
    os.chmod(key.private_key_path, 0o600)
    assert run(*export, "--signing-key", key.private_key_path, "--json") == 0
    assert json.loads(capsys.readouterr().out)["signing_key"] == key.fingerprint
    assert run("import", archive, "--cache-dir", tmp_path / "untrusted") == 2
    capsys.readouterr()
    assert run("import", archive, "--cache-dir", tmp_path / "cache", "--trusted-key", key.public_key_path) == 0


def test_an_ssh_keygen_key_signs_and_is_trusted_by_its_pub_file(warm_copy, tmp_path, capsys):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    archive = tmp_path / "out.tgz"
    export = ["export", *SELECTION, "--target", "gfx942", "--cache-dir", warm_copy.root, "--archive", archive]
    assert run(*export, "--signing-key", key) == 0
    capsys.readouterr()
    trusted = ["--trusted-key", f"{key}.pub"]
    assert run("import", archive, "--cache-dir", tmp_path / "cache", *trusted) == 0
    assert run("verify", *SELECTION, "--target", "gfx942", "--cache-dir", tmp_path / "cache", "--deep") == 0


def test_bake_signs_the_bundle_and_its_archive(baked):
    out, archive, document = baked
    index = json.loads((out / "bundle.json").read_text())
    assert document["signing_key"] == index["signing_key"] is not None
    assert (out / "bundle.sig").read_bytes() and _index_bytes(archive) == (out / "bundle.json").read_bytes()
    assert CacheLayout.of(out).root == out
