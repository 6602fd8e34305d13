"""Signed bundles: who vouches for the executable code an archive brings.

An archive carries `bundle.sig` beside `bundle.json`: an ed25519 signature of `bundle.json`'s
exact bytes, which list every other member's size and sha256, so the signature binds every
byte `import` installs. `bundle.json` names the signing key by its fingerprint
(`signing_key`). Keys are OpenSSH's ed25519 keys: `kprecompile key generate` writes a pair, and
a key from `ssh-keygen -t ed25519 -N ''` works too; a fingerprint is what `ssh-keygen -l`
prints (`SHA256:` and 43 base64 characters).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

SIGNATURE_FILE = "bundle.sig"
# A signature is 64 bytes: its file, base64 and a newline, is far below this.
MAX_SIGNATURE_BYTES = 1024
FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
# Signed with this prefix, so that a signature made for a bundle means nothing elsewhere (an
# ssh key used here too signs nothing it would accept, as SSHSIG's namespaces do).
_CONTEXT = b"kprecompile bundle signature v1\0"
_PUBLIC_KEY_TYPE = "ssh-ed25519"
_KEY_ADVICE = "make one with `kprecompile key generate PATH`, or use an `ssh-keygen -t ed25519 -N ''` key"


@dataclass(frozen=True)
class SigningKey:
    path: str
    fingerprint: str
    # The public key as one OpenSSH line (what `--trusted-key` and KPRECOMPILE_TRUSTED_KEYS take).
    public_key: str
    private: Any


@dataclass(frozen=True)
class GeneratedKey:
    private_key_path: str
    public_key_path: str
    public_key: str
    fingerprint: str


def fingerprint_of(public_key: Any) -> str:
    """`SHA256:<base64>` of the key's OpenSSH wire form, as `ssh-keygen -l` prints it."""
    from cryptography.hazmat.primitives import serialization

    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _public_line(public_key: Any, comment: str = "") -> str:
    from cryptography.hazmat.primitives import serialization

    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".rstrip()


def generate_key(path: str | os.PathLike[str], comment: str = "kprecompile") -> GeneratedKey:
    """A new ed25519 key pair: the private key at `path` (mode 0600, never over an existing file)
    and the public key at `path.pub`, as ssh-keygen writes them."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path = Path(path)
    public_path = private_path.with_name(private_path.name + ".pub")
    for candidate in (private_path, public_path):
        if os.path.lexists(candidate):
            raise InputError("PATH", str(candidate), "a path where no file is yet (a key is never overwritten)")
    if not private_path.absolute().parent.is_dir():
        raise InputError("PATH", str(private_path), "a file in an existing directory")
    key = Ed25519PrivateKey.generate()
    private_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = _public_line(key.public_key(), comment)
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(private_bytes)
        descriptor = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(descriptor, "w") as file:
            file.write(public + "\n")
    except BaseException:
        private_path.unlink(missing_ok=True)
        raise
    return GeneratedKey(str(private_path), str(public_path), public, fingerprint_of(key.public_key()))


def load_signing_key(path: str | os.PathLike[str], field: str) -> SigningKey:
    """The ed25519 private key in the file at `path` (OpenSSH or PKCS#8 PEM, no passphrase);
    InputError naming `field` otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        mode = os.stat(path).st_mode
        data = Path(path).read_bytes()[: 64 << 10]
    except OSError as error:
        raise InputError(field, str(path), f"a readable private key file ({error.strerror})") from None
    if mode & 0o077:
        # As ssh refuses an unprotected private key: whoever reads it can sign archives.
        raise InputError(field, str(path), f"a private key only you can read, not mode {oct(mode & 0o777)} (chmod 600)")
    key = None
    for load in (serialization.load_ssh_private_key, serialization.load_pem_private_key):
        try:
            key = load(data, password=None)
            break
        except TypeError:
            raise InputError(field, str(path), "a private key without a passphrase") from None
        except (ValueError, binascii.Error, UnicodeError):
            continue
        except Exception:  # cryptography's UnsupportedAlgorithm and the like: not a key we take
            continue
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(field, str(path), f"an ed25519 private key ({_KEY_ADVICE})")
    return SigningKey(str(path), fingerprint_of(key.public_key()), _public_line(key.public_key()), key)


def sign(key: SigningKey, index: bytes) -> bytes:
    """The content of `bundle.sig` for `bundle.json`'s bytes."""
    return base64.b64encode(key.private.sign(_CONTEXT + index)) + b"\n"


def parse_public_key(line: str) -> Any | None:
    """The ed25519 public key of one OpenSSH line (`ssh-ed25519 <base64> [comment]`), or None."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    parts = line.split()
    if len(parts) < 2 or parts[0] != _PUBLIC_KEY_TYPE:
        return None
    try:
        key = serialization.load_ssh_public_key(f"{parts[0]} {parts[1]}".encode())
    except Exception:  # malformed base64 or key blob: not a key
        return None
    return key if isinstance(key, Ed25519PublicKey) else None


def load_trusted_keys(sources: Iterable[str | os.PathLike[str]], field: str) -> dict[str, Any]:
    """Fingerprint -> public key, for each source: an OpenSSH public key line, or a file of them
    (one a line, `#` comments, as authorized_keys); InputError naming `field` for one that is not."""
    keys: dict[str, Any] = {}
    for source in sources:
        text = str(source)
        key = parse_public_key(text)
        if key is not None:
            keys[fingerprint_of(key)] = key
            continue
        try:
            lines = Path(text).expanduser().read_text(errors="replace")[: 1 << 20].splitlines()
        except OSError as error:
            expected = f"an ed25519 public key (ssh-ed25519 AAAA...) or a readable file of them ({error.strerror})"
            raise InputError(field, text, expected) from None
        found = 0
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key = parse_public_key(line)
            if key is None:
                raise InputError(field, text, f"a file of ed25519 public keys, one a line: {line[:40]!r} is not one")
            keys[fingerprint_of(key)] = key
            found += 1
        if not found:
            raise InputError(field, text, "a file of ed25519 public keys, one a line: it holds none")
    return keys


def signature_problem(index: bytes, fingerprint: Any, signature: bytes | None, trusted: dict[str, Any]) -> str | None:
    """Why `bundle.json`'s bytes are not signed by a trusted key, or None when they are."""
    from cryptography.exceptions import InvalidSignature

    if fingerprint is None and signature is None:
        return "it is unsigned"
    if not isinstance(fingerprint, str) or not FINGERPRINT.fullmatch(fingerprint):
        return f"{SIGNATURE_FILE} is there but bundle.json names no signing key"
    if signature is None:
        return f"bundle.json names signing key {fingerprint} but there is no {SIGNATURE_FILE}"
    key = trusted.get(fingerprint)
    if key is None:
        return f"it is signed by {fingerprint}, which is not a trusted key"
    try:
        raw = base64.b64decode(signature.strip(), validate=True)
        key.verify(raw, _CONTEXT + index)
    except (InvalidSignature, binascii.Error, ValueError):
        return f"its signature by {fingerprint} does not match bundle.json (changed after it was signed)"
    return None
