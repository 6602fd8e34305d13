"""The AITER a vLLM release's ROCm image builds, put beside that release for planning.

vLLM's ROCm images build AITER from source at the commit their `docker/Dockerfile.rocm_base` pins
(`AITER_BRANCH`); the package index has one old amd-aiter. A release newer than that AITER calls
what it lacks (0.31's ROCM_AITER_FA imports AITER's Gluon paged decode; 0.33 passes
`shuffled_kv_cache` to its unified attention), and AITER's Triton kernels change between commits,
so planning a release's AITER families with another AITER plans other kernels.

`install_aiter` takes the pinned commit's Python package (`aiter/`, its Triton kernels and
configs; no HIP module is built) out of a git clone of AITER the user has, into the release's
directory, with a dist-info whose `direct_url.json` names the commit (PEP 610): the release's
directory comes first on the path (`install.use_engine`), so that AITER is the one imported and
reported. The kernels' cache keys hash their own source, so a kernel of another commit is another
key; `aiter_identity` says in the plan which AITER it was made with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from ..errors import InputError, KprecompileError

AITER_REPOSITORY = "https://github.com/ROCm/aiter"
AITER_DISTRIBUTION = "amd-aiter"
# What each vLLM release's ROCm image builds: `AITER_BRANCH` of `docker/Dockerfile.rocm_base` in
# the release's own sdist, read by scripts/aiter_pins.py (0.15.0 and 0.15.1 have no sdist on the
# index: not known).
AITER_PINS = {
    "0.11.2": "59bd8ff2",
    "0.12.0": "59bd8ff2",
    "0.13.0": "59bd8ff2",
    "0.14.0": "6af8b687",
    "0.14.1": "6af8b687",
    "0.16.0": "6af8b687",
    "0.17.0": "v0.1.10.post2",
    "0.17.1": "v0.1.10.post2",
    "0.18.0": "v0.1.10.post2",
    "0.18.1": "v0.1.10.post2",
    "0.19.0": "v0.1.10.post2",
    "0.19.1": "v0.1.10.post2",
    "0.20.0": "v0.1.10.post3",
    "0.20.1": "v0.1.10.post3",
    "0.20.2": "v0.1.10.post3",
    "0.21.0": "v0.1.13",
    "0.22.0": "v0.1.13",
    "0.22.1": "v0.1.13",
    "0.23.0": "v0.1.13.post1",
    "0.24.0": "v0.1.13.post1",
    "0.25.0": "v0.1.16.post2",
    "0.25.1": "v0.1.16.post2",
    "0.26.0": "v0.1.16.post3",
    "0.27.0": "v0.1.19",
    "0.27.1": "v0.1.19",
    "0.28.0": "v0.1.19",
    "0.29.0": "v0.1.19",
    "0.30.0": "v0.1.21.post2",
    "0.31.0": "v0.1.23",
    "0.32.0": "v0.1.24.post1",
    "0.33.0": "v0.1.26",
    "0.34.0": "v0.1.28.post1",
}
# The most an AITER package may unpack to (its `aiter/` was about 20 MB at v0.1.16): a clone is
# the user's, but its size is not ours to trust.
MAX_PACKAGE_BYTES = 512 * 2**20
_SOURCE_FIELD = "--aiter-source"
_REF_FIELD = "--aiter-ref"


@dataclass(frozen=True)
class AiterIdentity:
    """Which AITER a plan imports: its version, and where installed from a clone its commit."""

    version: str | None
    commit: str | None = None
    requested: str | None = None
    # The AITER the planned release's ROCm image builds (`AITER_PINS`), None where not known.
    release_pin: str | None = None

    @property
    def matches_pin(self) -> bool | None:
        """Whether this is the release's own AITER; None where that cannot be told (no pin known,
        or an AITER from the index, whose commit is not recorded)."""
        if self.release_pin is None or self.commit is None:
            return None
        pin = self.release_pin
        return self.commit.startswith(pin) or pin in (self.requested, f"v{self.version}")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "matches_pin": self.matches_pin}

    def describe(self, release: str | None) -> str:
        installed = f"amd-aiter {self.version}" if self.version else "no AITER"
        if self.commit:
            installed += f" (git {self.requested or self.commit[:12]}, commit {self.commit[:12]})"
        if release is None or self.release_pin is None:
            return installed
        if self.matches_pin:
            return f"{installed}: vLLM {release}'s own (its ROCm image builds {self.release_pin})"
        own = "not vLLM's own" if self.matches_pin is False else "its commit not recorded"
        return (
            f"{installed}, {own}: vLLM {release}'s ROCm image builds AITER {self.release_pin} "
            f"(kprecompile engine install vllm=={release} --aiter-source <a clone of {AITER_REPOSITORY}>)"
        )


def aiter_pin(release: str | None) -> str | None:
    return AITER_PINS.get(release) if release else None


def aiter_identity(release: str | None = None, directory: Path | None = None) -> AiterIdentity:
    """The AITER this process imports (the first on its path), against `release`'s pin; with
    `directory` (a release's), the one installed there where there is one."""
    infos = sorted(directory.glob("amd_aiter-*.dist-info")) if directory is not None else []
    try:
        if infos and (directory / "aiter" / "__init__.py").is_file():
            distribution: metadata.Distribution = metadata.Distribution.at(infos[0])
        else:
            distribution = metadata.distribution(AITER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return AiterIdentity(None, release_pin=aiter_pin(release))
    commit = requested = None
    text = distribution.read_text("direct_url.json")
    if text:
        vcs = json.loads(text).get("vcs_info", {})
        commit, requested = vcs.get("commit_id"), vcs.get("requested_revision")
    return AiterIdentity(distribution.version, commit, requested, aiter_pin(release))


def _git(source: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(source), *args], capture_output=True, text=True, check=False, env=_git_environment()
    )
    if result.returncode:
        raise subprocess.CalledProcessError(result.returncode, args, result.stdout, result.stderr)
    return result.stdout.strip()


def _git_environment() -> dict[str, str]:
    """git asked about one repository: no system or user configuration (hooks, aliases, filters
    that could run code), no prompt."""
    return {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def resolve_commit(source: Path, ref: str) -> str:
    """The commit `ref` names in the clone at `source`; one line naming the field otherwise."""
    if not source.is_dir():
        raise InputError(_SOURCE_FIELD, str(source), f"a directory holding a git clone of {AITER_REPOSITORY}")
    try:
        _git(source, "rev-parse", "--git-dir")
    except subprocess.CalledProcessError:
        raise InputError(_SOURCE_FIELD, str(source), f"a git clone of {AITER_REPOSITORY}") from None
    try:
        return _git(source, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        expected = f"a tag or commit of the clone at {source} (git -C {source} fetch --tags, then again)"
        raise InputError(_REF_FIELD, ref, expected) from None


def _version_of(source: Path, commit: str) -> str:
    """A tag at the commit as AITER spells its releases (v0.1.16.post2 -> 0.1.16.post2), else a
    local version naming the commit."""
    try:
        tag = _git(source, "describe", "--tags", "--exact-match", commit)
    except subprocess.CalledProcessError:
        tag = ""
    version = tag.removeprefix("v")
    if version and all(part.isalnum() for part in version.split(".")):
        return version
    return f"0+g{commit[:12]}"


def install_aiter(source: Path, ref: str, directory: Path) -> AiterIdentity:
    """AITER's Python package at `ref` of the clone at `source`, into `directory` (a release's),
    replacing any there; all or nothing."""
    commit = resolve_commit(source, ref)
    version = _version_of(source, commit)
    staging = Path(tempfile.mkdtemp(prefix=".aiter.", dir=directory))
    try:
        with tempfile.TemporaryFile(dir=staging) as archive:
            result = subprocess.run(
                ["git", "-C", str(source), "archive", "--format=tar", commit, "aiter"],
                stdout=archive,
                stderr=subprocess.PIPE,
                check=False,
                env=_git_environment(),
            )
            if result.returncode:
                expected = f"a commit of AITER that holds its Python package `aiter/` ({commit[:12]} does not)"
                raise InputError(_REF_FIELD, ref, expected)
            archive.seek(0)
            _unpack(archive, staging, ref)
        info = staging / f"amd_aiter-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {AITER_DISTRIBUTION}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("kprecompile\n")
        direct_url = {
            "url": AITER_REPOSITORY,
            "vcs_info": {"vcs": "git", "commit_id": commit, "requested_revision": ref},
        }
        (info / "direct_url.json").write_text(json.dumps(direct_url))
        # The previous AITER moves aside (into the staging directory, removed below), the new one in.
        previous = staging / "previous"
        previous.mkdir()
        for old in [directory / "aiter", *directory.glob("amd_aiter-*.dist-info")]:
            if old.exists():
                os.replace(old, previous / old.name)
        os.replace(staging / "aiter", directory / "aiter")
        os.replace(info, directory / info.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return AiterIdentity(version, commit, ref)


def _unpack(archive, staging: Path, ref: str) -> None:
    """`git archive`'s tar of `aiter/`: regular files and directories under it only (no links, no
    absolute or parent paths, tarfile's data filter besides), at most MAX_PACKAGE_BYTES."""
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        members, total = [], 0
        for member in tar:
            name = Path(member.name)
            if name.is_absolute() or ".." in name.parts or name.parts[:1] != ("aiter",):
                continue
            if not (member.isfile() or member.isdir()):
                continue
            total += member.size
            if total > MAX_PACKAGE_BYTES:
                raise KprecompileError(
                    f"AITER's package at {ref} unpacks to more than {MAX_PACKAGE_BYTES // 2**20} MiB; refusing"
                )
            members.append(member)
        tar.extractall(staging, members=members, filter="data")
    if not (staging / "aiter" / "__init__.py").is_file():
        raise InputError(_REF_FIELD, ref, "a commit of AITER whose `aiter/` is a Python package")
