"""`kprecompile key generate`: an ed25519 key pair to sign archives with (`export`, `bake
--archive`) and to trust them by (`import --trusted-key`, KPRECOMPILE_TRUSTED_KEYS)."""

from __future__ import annotations

from dataclasses import asdict

import click

from ..cache.signing import generate_key
from . import options
from .examples import epilog
from .output import Output


@click.group(name="key")
def command() -> None:
    """Make the key archives are signed with (generate)."""


@command.command(name="generate", epilog=epilog("key generate"))
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--comment", default="kprecompile", show_default=True, help="The public key's comment.")
@options.json_option
def generate(path, comment, json_output) -> None:
    """Write a new ed25519 private key to PATH (mode 0600) and its public key to PATH.pub, as
    ssh-keygen does; print the public key and its fingerprint."""
    output = Output(json_output)
    key = generate_key(path, comment)
    output.document(asdict(key))
    output.data(f"{key.private_key_path}: private key, for export and bake --archive --signing-key")
    output.data(f"{key.public_key_path}: public key, for import --trusted-key or KPRECOMPILE_TRUSTED_KEYS")
    output.data(key.public_key)
    output.data(f"fingerprint {key.fingerprint}")
