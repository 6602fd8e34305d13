"""Install real vLLM releases beside this project, for the tests that run against them.

    python scripts/install_vllm.py [--dest .vllm] [--list] [--aiter-source CLONE] [--jobs N] [VERSION ...]
                                                              (default: every tested release)

Each release, with the Triton its torch pins, goes into `<dest>/<version>/` as `kprecompile engine
install` puts it (`kprecompile/vllm/install.py`); a process uses one by putting it first on
PYTHONPATH. Without VERSION, each of `TEST_TRITONS` is also installed alone into
`.tritons/<version>/`, for the suite's runs under each supported Triton (tests/test_tritons.py).
`--list` prints each release's light dependencies and installs nothing. `--aiter-source` puts
beside each release the AITER its ROCm image builds, from a git clone of AITER
(`kprecompile/vllm/aiter_source.py`); a pin the clone lacks is said and skipped (the index's
AITER serves that release).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kprecompile.errors import InputError, KprecompileError
from kprecompile.vllm import aiter_source
from kprecompile.vllm import install as engine_install
from kprecompile.vllm.releases import TESTED_RELEASES, release_line

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / ".vllm"
DEFAULT_TRITON_DEST = ROOT / ".tritons"
# The supported Tritons the suite also runs under, beside the test extra's 3.6.0: the oldest a
# supported vLLM release pins, each later series, the newest.
TEST_TRITONS = ("3.5.0", "3.7.1", "3.8.0", "3.9.0")
PARALLEL_INSTALLS = 4


def install(version: str, dest: Path = DEFAULT_DEST) -> Path:
    """One release into `<dest>/<version>` (the tests' `.vllm/` by default), with the Triton its
    torch pins: its tests run on the toolchain its users have."""
    return engine_install.install(version, dest, with_triton=True)


def triton_dir(version: str, dest: Path = DEFAULT_TRITON_DEST) -> Path:
    return dest / version


def install_triton(version: str, dest: Path = DEFAULT_TRITON_DEST) -> Path:
    """Install Triton `version` alone into `<dest>/<version>` (nothing to do when it is there), for
    the suite's run under each supported Triton (tests/test_tritons.py)."""
    final = triton_dir(version, dest)
    if (final / "triton" / "__init__.py").is_file():
        return final
    with engine_install.staged(final) as staging:
        engine_install.pip_install("--target", str(staging), "--no-deps", f"triton=={version}")
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(TESTED_RELEASES), metavar="VERSION")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--list", action="store_true", help="print each release's light dependencies, install nothing")
    parser.add_argument("--aiter-source", type=Path, help="a git clone of AITER: each release's own AITER beside it")
    parser.add_argument(
        "--jobs", type=int, default=PARALLEL_INSTALLS, help=f"installs at once (default {PARALLEL_INSTALLS})"
    )
    args = parser.parse_args()
    for version in args.versions:
        try:
            release_line(version, "VERSION")
        except InputError as error:
            sys.exit(f"install_vllm.py: {error}")
    if args.list:
        for version in args.versions:
            dependencies = engine_install.light_dependencies(version)
            print(f"vLLM {version} with dependencies: {' '.join(dependencies.with_deps)}")
            print(f"vLLM {version} without dependencies: {' '.join(dependencies.without_deps)}", flush=True)
        return
    tritons = TEST_TRITONS if args.versions == list(TESTED_RELEASES) else ()

    def release(version: str) -> list[str]:
        directory = install(version, args.dest)
        lines = [f"vLLM {version}: {directory}"]
        if args.aiter_source is not None:
            lines.append(f"vLLM {version}: {_with_own_aiter(version, directory, args.aiter_source)}")
        return lines

    # Each install is mostly pip waiting on downloads and unpacking (one directory each, staged):
    # four at once took `.ci/run`'s install (four releases, four Tritons) from 19 to 10 minutes on 2 cores.
    jobs = [(lambda version=version: [f"Triton {version}: {install_triton(version)}"]) for version in tritons]
    jobs += [(lambda version=version: release(version)) for version in args.versions]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        for future in futures:  # in order, each as it is done; the first error ends the script
            print("\n".join(future.result()), flush=True)


def _with_own_aiter(version: str, directory: Path, clone: Path) -> str:
    pin = aiter_source.aiter_pin(version)
    if pin is None:
        return "its AITER pin is not known; the installed AITER serves it"
    try:
        identity = aiter_source.install_aiter(clone, pin, directory)
    except InputError as error:
        return f"its AITER {pin} is not in {clone} ({error}); the installed AITER serves it"
    return f"AITER {pin} (commit {identity.commit}) beside it"


if __name__ == "__main__":
    try:
        main()
    except KprecompileError as error:
        sys.exit(f"install_vllm.py: {error}")
