#!/usr/bin/env python3
"""Build what `gpu_e2e.py` needs on a GPU host that has no vLLM, no AITER and no network.

    python scripts/vllm_carry.py [--release 0.12.0] [--out .e2e]

Writes into OUT (ignore it in .git/info/exclude; carry it with the device tool's `carry`):

- `vllm-<release>.tgz`: the release's Python files (from `scripts/install_vllm.py`'s directory)
  without its compiled extensions, and its dist-info (METADATA, RECORD, entry points): vLLM's
  Triton kernels need no extension, and RECORD names the extensions that are absent.
- `aiter-<version>.tgz`: the `aiter` package of the amd-aiter installed here and its dist-info,
  without `aiter_meta` (HIP sources and code objects, 176 MB): `--part aiter` runs AITER's Triton
  `pa_prefill` only.
- `wheels/`: CPython 3.12 manylinux wheels of the packages vLLM's modules import, at the versions
  installed beside the release (`DEPENDENCIES`, and every distribution beside the release that
  the release's own plans below import: `PYTHONPROFILEIMPORTTIME`), and kprecompile's pebble and
  platformdirs.
- `vllm-cache/modelinfos/`: vLLM's model-info cache for DeepSeek-V2, gpt-oss and Gemma-2 (the
  architectures `vllm_e2e.py` builds), written by the release itself here. vLLM inspects a
  model's class in a child process that imports vLLM's platform; on a GPU host with vLLM's
  Python files only, its CUDA platform cannot load the compiled extension there, while on this
  builder (no GPU) the child runs.
- `setup.sh`: sourced on the host from the repository root, it unpacks vLLM, installs the
  wheels the host lacks (transformers, tokenizers and huggingface_hub always where the release
  takes transformers 4, as up to 0.18), and sets PYTHONPATH and VLLM_CACHE_ROOT.

A device call carries at most 64 MiB. Where OUT is larger (0.25.1: its Python, xgrammar and
llguidance), the largest wheels go to OUT-part2, OUT-part3, ... (each under `--part-mib`). A
call does not keep what an earlier one carried in the checkout, but the machine keeps /tmp while
it is warm (30 s after a call): carry each part in a call of its own whose command is `cp -r
OUT-partN /tmp/`, then, at once, OUT with the command that sources `setup.sh`, which installs the
wheels of OUT and of every part under /tmp.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Distributions vLLM 0.12's config, attention and MLA modules import beyond what the H200 image
# has for sure (torch, triton, numpy, filelock, tqdm, pyyaml, packaging, ...).
DEPENDENCIES = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "regex",
    "cbor2",
    "blake3",
    "msgspec",
    "pyzmq",
    "cachetools",
    "pybase64",
    "py_cpuinfo",
    "openai_harmony",
    "prometheus_client",
    "gguf",
    "cloudpickle",
    "aiohttp",
    "multidict",
    "yarl",
    "frozenlist",
    "aiosignal",
    "propcache",
    "aiohappyeyeballs",
    "attrs",
    "requests",
    "urllib3",
    "certifi",
    "charset_normalizer",
    "idna",
    "transformers",
    "tokenizers",
    "huggingface_hub",
)
# Installed over the host's own: kprecompile's, and transformers' where the release takes 4.x.
FORCED = ("pebble", "platformdirs")
TRANSFORMERS_4 = ("transformers", "tokenizers", "huggingface_hub")
# The host's own toolchain, never packed; and what is imported only where it is installed, which
# the plans here import because the release's install has it: vLLM's `try: import ray`, and
# mistral_common's `cv2` (imported only where `is_opencv_installed()`; mistral_common comes in
# through gguf's vocabulary, vLLM's config). Each of those wheels alone is over what a call carries.
HOST_OWN = {"vllm", "torch", "triton"}
OPTIONAL = {
    "ray",
    *(f"opencv_{kind}" for kind in ("python", "python_headless", "contrib_python", "contrib_python_headless")),
}

SETUP = """\
# Source on the GPU host from the repository root (written by scripts/vllm_carry.py). Its paths
# are its own directory's, wherever that was carried or copied to.
carry=$(cd "$(dirname "${{BASH_SOURCE[0]:-$0}}")" && pwd)
mkdir -p /tmp/vllm /tmp/site /tmp/deps
tar xzf "$carry"/vllm-{release}.tgz -C /tmp/vllm
tar xzf "$carry"/aiter-*.tgz -C /tmp/vllm
forced="{forced}"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \\
    $(for n in $forced; do ls "$carry"/wheels/$n-*.whl /tmp/{name}-part*/wheels/$n-*.whl 2>/dev/null; done)
missing=$(for w in "$carry"/wheels/*.whl /tmp/{name}-part*/wheels/*.whl; do [ -e "$w" ] || continue
    n=$(basename $w | cut -d- -f1); case " $forced " in *" $n "*) continue;; esac
    python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" $n 2>/dev/null || echo $w; done)
echo "installing where missing: $(for w in $missing; do basename $w | cut -d- -f1; done | tr '\\n' ' ')"
[ -n "$missing" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/deps $missing
export PYTHONPATH=$PWD:/tmp/vllm:/tmp/site:/tmp/deps
export VLLM_CACHE_ROOT="$carry"/vllm-cache
"""


def _installer():
    spec = importlib.util.spec_from_file_location("install_vllm", ROOT / "scripts" / "install_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version(release_dir: Path, name: str) -> str | None:
    """The version installed beside the release, else here, else None (the release does not use it)."""
    normalized = name.lower().replace("-", "_")
    for info in release_dir.glob("*.dist-info"):
        distribution, _, version = info.name[: -len(".dist-info")].partition("-")
        if distribution.lower().replace("-", "_") == normalized:
            return version
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _owners(release_dir: Path) -> dict[str, str]:
    """Top-level module name -> the distribution beside the release that installs it."""
    owners: dict[str, str] = {}
    for info in release_dir.glob("*.dist-info"):
        distribution = info.name[: -len(".dist-info")].partition("-")[0]
        record = info / "RECORD"
        if not record.is_file():
            continue
        for line in record.read_text().splitlines():
            first = line.split(",")[0].split("/")[0]
            if first and not first.endswith((".dist-info", ".data")) and first != "..":
                owners.setdefault(first.removesuffix(".py").split(".")[0], distribution)
    return owners


def _imported_distributions(release_dir: Path, import_log: str) -> set[str]:
    """The distributions beside the release whose modules a `PYTHONPROFILEIMPORTTIME` log names."""
    owners = _owners(release_dir)
    tops = set()
    for line in import_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            tops.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return {owners[top].lower() for top in tops if top in owners} - HOST_OWN - OPTIONAL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", default="0.12.0")
    parser.add_argument("--out", default=".e2e")
    parser.add_argument("--part-mib", type=int, default=60, help="the most one carried part may hold (MiB)")
    parser.add_argument(
        "--host-has",
        nargs="*",
        default=[],
        metavar="NAME",
        help="distributions the GPU host already has (its `pip list`): no wheel packed for them",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    release_dir = _installer().install(args.release)
    (out / "wheels").mkdir(parents=True, exist_ok=True)

    info = release_dir / f"vllm-{args.release}.dist-info"
    with tarfile.open(out / f"vllm-{args.release}.tgz", "w:gz") as archive:
        for path in sorted((release_dir / "vllm").rglob("*")):
            if path.is_file() and path.suffix != ".so" and "__pycache__" not in path.parts:
                archive.add(path, str(path.relative_to(release_dir)))
        for name in ("METADATA", "RECORD", "entry_points.txt"):
            if (info / name).is_file():
                archive.add(info / name, f"{info.name}/{name}")

    aiter = metadata.distribution("amd-aiter")
    with tarfile.open(out / f"aiter-{aiter.version}.tgz", "w:gz") as archive:
        for file in aiter.files or ():
            if file.parts[0] == "aiter" or file.parts[0].endswith(".dist-info"):
                path = Path(aiter.locate_file(file))
                if path.is_file() and path.suffix != ".so" and "__pycache__" not in file.parts:
                    archive.add(path, str(file))

    # vLLM's own model-info cache, written while it builds each model's engine configuration:
    # DeepSeek-V2-Lite, and the small gpt-oss and Gemma-2 configs of `vllm_e2e.py`'s layers part.
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(release_dir)]),
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_CACHE_ROOT": str(out / "vllm-cache"),
        # Which modules the release imports for these plans: what the host may lack.
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    imported: set[str] = set()
    sys.path.insert(0, str(ROOT / "scripts"))
    from vllm_e2e import layer_model_configs

    with tempfile.TemporaryDirectory() as cache:
        models = [("deepseek-v2-lite", "TRITON_MLA")]
        models += [(str(path), "TRITON_ATTN") for path in layer_model_configs(Path(cache) / "models").values()]
        for model, backend in models:
            planned = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kprecompile",
                    "plan",
                    "--model",
                    model,
                    "--engine",
                    "vllm",
                    "--attention-backend",
                    backend,
                    "--target",
                    "sm90",
                    "--max-model-len",
                    "4096",
                    "--max-num-seqs",
                    "64",
                    "--cache-dir",
                    cache,
                ],
                env=environment,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            imported |= _imported_distributions(release_dir, planned.stderr)
    # The plans build each model from vLLM's own class without asking its registry to inspect it,
    # while `vllm_e2e.py`'s engine configurations do: the registry answers here, and caches.
    architectures = ("DeepseekV2ForCausalLM", "GptOssForCausalLM", "Gemma2ForCausalLM")
    inspect = "import sys\nfrom vllm.model_executor.models.registry import ModelRegistry\n"
    inspect += "for name in sys.argv[1:]:\n    assert ModelRegistry._try_inspect_model_cls(name), name\n"
    inspected = subprocess.run(
        [sys.executable, "-c", inspect, *architectures],
        env=environment,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    imported |= _imported_distributions(release_dir, inspected.stderr)
    for architecture in architectures:
        if not list((out / "vllm-cache" / "modelinfos").glob(f"*{architecture}.json")):
            sys.exit(f"vLLM wrote no model-info cache for {architecture}")

    host_has = {name.lower().replace("-", "_") for name in args.host_has}
    names = sorted({name for name in set(DEPENDENCIES) | imported if name.lower() not in host_has})
    print(f"packing {len(names)} distributions: {' '.join(names)}", flush=True)
    versions = {name: _version(release_dir, name) for name in names}
    pins = [f"{name}=={version}" for name, version in versions.items() if version is not None]
    pins += [f"{name}=={metadata.version(name)}" for name in ("pebble", "platformdirs")]
    # pip matches a manylinux tag exactly: every glibc minor, newest first (0.25.1's llguidance
    # has only a manylinux_2_31 wheel, which five named tags missed).
    tags = (
        *(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)),
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    )
    platforms = [arg for tag in tags for arg in ("--platform", tag)]
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    download += ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out / "wheels")]
    if subprocess.run([*download, *pins], capture_output=True).returncode:
        # One pip resolves them all; where it fails, name the wheels the index does not have.
        unavailable = [pin for pin in pins if subprocess.run([*download, pin], capture_output=True).returncode]
        sys.exit(f"no CPython 3.12 manylinux wheel on the package index for: {' '.join(unavailable) or '?'}")

    forced = FORCED + (TRANSFORMERS_4 if (_version(release_dir, "transformers") or "").startswith("4.") else ())
    (out / "setup.sh").write_text(SETUP.format(name=out.name, release=args.release, forced=" ".join(forced)))
    for part in out.parent.glob(f"{out.name}-part*"):
        shutil.rmtree(part)
    parts = _split(out, args.part_mib * 2**20)
    for part in [out, *parts]:
        size = sum(path.stat().st_size for path in part.rglob("*") if path.is_file())
        print(f"{part}: {size / 2**20:.1f} MiB to carry")
    if parts:
        print("carry each part in a call of its own first (command: cp -r PART /tmp/), then the first with setup.sh")


def _split(out: Path, limit: int) -> list[Path]:
    """Move the largest wheels out of `out` into OUT-part2, ... until each holds at most `limit`
    bytes; the parts made."""
    wheels = sorted((out / "wheels").glob("*.whl"), key=lambda path: path.stat().st_size, reverse=True)
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    parts: list[tuple[Path, int]] = []
    for wheel in wheels:
        if size <= limit:
            break
        weight = wheel.stat().st_size
        if weight > limit:
            sys.exit(f"{wheel.name} alone is over {limit / 2**20:.0f} MiB: it cannot be carried")
        part = next((part for part, used in parts if used + weight <= limit), None)
        if part is None:
            part = out.parent / f"{out.name}-part{len(parts) + 2}"
            (part / "wheels").mkdir(parents=True)
            parts.append((part, 0))
        wheel.rename(part / "wheels" / wheel.name)
        parts = [(path, used + weight if path == part else used) for path, used in parts]
        size -= weight
    if size > limit:
        sys.exit(f"{out} holds {size / 2**20:.0f} MiB besides its wheels: over {limit / 2**20:.0f} MiB")
    return [part for part, _ in parts]


if __name__ == "__main__":
    from kprecompile.errors import KprecompileError

    try:
        main()
    except KprecompileError as error:
        sys.exit(f"vllm_carry.py: {error}")
