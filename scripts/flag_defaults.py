"""Write kprecompile/inputs/flag_defaults.json: the default each vLLM release gives the selection flags.

    python scripts/flag_defaults.py [--dest .vllm] [VERSION ...]   (default: every release on the index
                                                                   from the oldest supported one)
    python scripts/flag_defaults.py --add VERSION ...   (into the table as it is: the release matrix)

Each release's own `vllm/envs.py` answers (`kprecompile/inputs/flag_defaults.py` runs that file alone
and calls each registered flag's reader with the flag unset): from `<dest>/<version>` where the
release is installed there, else read out of its wheel (`pip download --no-deps`; only that one
file is read from the archive, nothing of it is installed).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.version import Version

from kprecompile.inputs.flag_defaults import DEFAULTS_TABLE, read_envs_defaults
from kprecompile.vllm.releases import RELEASE_LINES

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "kprecompile" / "inputs" / DEFAULTS_TABLE
ENVS = "vllm/envs.py"
# vllm/envs.py is about 100 KB; more is not that file.
MAX_ENVS_BYTES = 4 << 20


def index_releases() -> list[str]:
    """Every vLLM release on the index pip uses, from the oldest line kprecompile knows."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm"], capture_output=True, text=True, check=True
    )
    listed = re.search(r"Available versions: (.*)", result.stdout)
    oldest = Version(".".join(map(str, RELEASE_LINES[0].since)))
    versions = listed[1].split(", ") if listed else []
    return sorted((v for v in versions if Version(v) >= oldest and not Version(v).is_prerelease), key=Version)


def release_envs(version: str, dest: Path, scratch: Path) -> Path:
    installed = dest / version / ENVS
    if installed.is_file():
        return installed
    wheels = scratch / version
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"vllm=={version}", "-d", str(wheels)],
        check=True,
    )
    (wheel,) = wheels.glob("vllm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        if archive.getinfo(ENVS).file_size > MAX_ENVS_BYTES:
            raise SystemExit(f"{wheel.name}: {ENVS} is larger than {MAX_ENVS_BYTES} bytes")
        target = scratch / f"envs-{version}.py"
        target.write_bytes(archive.read(ENVS))
    wheel.unlink()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".vllm")
    parser.add_argument("--add", action="store_true", help="add the releases to the table as it is")
    parser.add_argument("versions", nargs="*")
    arguments = parser.parse_args()
    versions = arguments.versions or index_releases()
    table = json.loads(TABLE.read_text())["releases"] if arguments.add and TABLE.exists() else {}
    with tempfile.TemporaryDirectory(prefix="kprecompile-flag-defaults-") as scratch:
        for version in versions:
            table[version] = read_envs_defaults(release_envs(version, arguments.dest, Path(scratch)))
            print(f"vLLM {version}: {json.dumps(table[version], sort_keys=True)}", flush=True)
    ordered = {version: dict(sorted(table[version].items())) for version in sorted(table, key=Version)}
    TABLE.write_text(json.dumps({"releases": ordered}, indent=1) + "\n")


if __name__ == "__main__":
    main()
