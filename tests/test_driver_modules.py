"""Triton's driver modules (utilities, launchers) baked on a CPU builder and served from a layer.

A ROCm server's Triton names its HIP runtime's path in the modules' C source, a CUDA server's
links them against `libcuda.so.1`. With neither here, `TRITON_LIBHIP_PATH` names a file standing
in for the HIP runtime and `TRITON_LIBCUDA_PATH` a directory with an empty `libcuda.so.1` (what a
build reads of them: a path, a library to link; the modules open the real ones only when loaded,
on a GPU), on the builder and on the "server" alike. The server side runs Triton's own classes
against kprecompile's cache manager and stops where Triton would load a module: which file it
would load, and whether it had to build one, is the whole question.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import kprecompile_cli

SELECTION = ["--model", "deepseek-v2-lite", "--tp", "1", "--max-num-seqs", "3", "--target", "gfx942"]
# A CUDA target's plan without vLLM: AITER's pa_prefill, as scripts/gpu_e2e.py runs it.
CUDA_SELECTION = ["--model", "llama-3.1-8b-instruct", "--engine", "aiter", "--max-num-seqs", "3", "--target", "sm90"]

# In a fresh process, as a server: every driver module Triton asks for, through kprecompile's
# cache manager over the layer, and whether Triton had to build it (gcc) instead.
SERVER = r"""
import json, sys
import triton.runtime.build as build
from triton import knobs
from kprecompile.serve.runtime import activate
from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms.triton_driver import active_target
from kprecompile.tracing.libraries import resolve_kernel
from kprecompile.cache.manifest import read_manifest
from kprecompile.warmup.preload import load_order
import importlib

layout = activate(sys.argv[1])  # layers from KPRECOMPILE_CACHE_LAYERS, as in an image
loaded, built = [], []

class Loaded(Exception):
    pass

def load(name, path):
    loaded.append(path)
    raise Loaded(path)  # the HIP runtime's code runs from here on: not on this machine

def refuse(name, src, *args, **kwargs):
    built.append(name)
    raise Loaded("built")

build._load_module_from_path = load
knobs.build.impl = refuse
manifest = read_manifest(layout, sys.argv[2])
target = TARGETS[sys.argv[3]]
# Triton's names, as the test knows them (kprecompile's own table is what is under test).
package, utils, launcher = {"hip": ("amd", "HIPUtils", "HIPLauncher"), "cuda": ("nvidia", "CudaUtils", "CudaLauncher")}[
    target.backend
]
driver = importlib.import_module(f"triton.backends.{package}.driver")

def kernel(job):
    with active_target(target):
        compiled = resolve_kernel(job.kernel).preload(job.specialization)
    return compiled.src, compiled.metadata

attempts = [lambda: getattr(driver, utils)()]
attempts += [
    (lambda job: lambda: getattr(driver, launcher)(*kernel(job)))(job) for job in load_order(manifest.jobs)
]
for attempt in attempts:
    try:
        attempt()
    except Loaded:
        pass
    except RuntimeError:
        pass  # Triton 3.7 on: a launcher asks the active driver (a GPU's) for its launch function
print(json.dumps({"loaded": loaded, "built": built}))
"""


# Triton builds its driver modules with the host's C compiler (CC, else gcc, else clang): a
# builder without one bakes none, and says so (the warm's own Triton error).
C_COMPILER = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(C_COMPILER is None, reason="no C compiler: Triton cannot build driver modules here")


@pytest.fixture(autouse=True)
def hip_runtime_looked_up_afresh():
    """Triton remembers where it found the HIP runtime for the rest of its process: each test
    (each in-process bake) names its own."""
    from triton.backends.amd.driver import _get_path_to_hip_runtime_dylib

    _get_path_to_hip_runtime_dylib.cache_clear()
    yield
    _get_path_to_hip_runtime_dylib.cache_clear()


@pytest.fixture
def stand_in_hip(tmp_path) -> dict[str, str]:
    path = tmp_path / "rocm" / "lib" / "libamdhip64.so"
    path.parent.mkdir(parents=True)
    path.touch()
    return {"TRITON_LIBHIP_PATH": str(path)}


@pytest.fixture
def stand_in_cuda(tmp_path) -> dict[str, str]:
    directory = tmp_path / "driver"
    directory.mkdir()
    source = directory / "empty.c"
    source.write_text("")
    subprocess.run(
        [C_COMPILER, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", directory / "libcuda.so.1", source],
        check=True,
    )
    (directory / "libcuda.so").symlink_to("libcuda.so.1")  # as a driver installs it (Triton 3.5 links -lcuda)
    return {"TRITON_LIBCUDA_PATH": str(directory)}


def _bake(out: Path, env: dict[str, str], selection: list[str] = SELECTION) -> dict:
    done = kprecompile_cli("bake", *selection, "--out", out, "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _serve(user: Path, layer: Path, manifest: str, env: dict[str, str], target: str = "gfx942") -> dict:
    served = subprocess.run(
        [sys.executable, "-c", SERVER, str(user), manifest, target],
        env={**os.environ, **env, "KPRECOMPILE_CACHE_LAYERS": str(layer)},
        capture_output=True,
        text=True,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    return json.loads(served.stdout.strip().splitlines()[-1])


@pytest.mark.compiles
@pytest.mark.parametrize("backend", ["hip", "cuda"])
def test_a_cpu_bake_carries_the_driver_modules_a_server_then_loads_from_the_layer(tmp_path, request, backend):
    """The bake builds Triton's utilities and each signature's launcher with Triton's own code
    and records them; a server's Triton finds every one of them in the layer, under its own
    key, and builds none. Control: a module altered in the layer is not served (Triton builds it)."""
    env = request.getfixturevalue(f"stand_in_{backend}")
    selection, target, utils = (SELECTION, "gfx942", "hip_utils")
    if backend == "cuda":
        selection, target, utils = (CUDA_SELECTION, "sm90", "cuda_utils")
    out = tmp_path / "bundle"
    report = _bake(out, env, selection)
    assert report["driver_modules_not_built"] == [], report
    manifest = json.loads(next(out.glob("manifests-v*/*.json")).read_text())
    modules = {name for files in manifest["launchers"].values() for name in files}
    assert report["driver_modules"] == sum(map(len, manifest["launchers"].values())) >= 1
    assert any(name.startswith(utils) for name in modules), modules
    index = json.loads((out / "bundle.json").read_text())
    carried = [name for name in index["files"] if name.rpartition("/")[2] in modules]
    assert len(carried) == report["driver_modules"]

    served = _serve(tmp_path / "user", out, manifest["key"], env, target)
    assert served["built"] == [], served
    assert len(set(served["loaded"])) == report["driver_modules"]
    assert all(Path(path).is_relative_to(out / "triton-v1") for path in served["loaded"])

    # Control: the utilities' and a launcher's bytes changed in the layer (Triton 3.5 and 3.6
    # build launchers): not served, so Triton builds them.
    altered = [next(out.glob(f"triton-v1/*/{utils}*")), *list(out.glob("triton-v1/*/__triton_launcher*"))[:1]]
    for path in altered:
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.chmod(0o644)
        path.write_bytes(bytes(data))
    served = _serve(tmp_path / "user2", out, manifest["key"], env, target)
    assert served["built"][0] == utils and set(served["built"]) == {path.name.split(".")[0] for path in altered}
    assert not set(map(str, altered)) & set(served["loaded"]), served


@pytest.mark.compiles
def test_another_hip_runtime_path_on_the_server_builds_its_own(tmp_path, stand_in_hip):
    """The runtime's path is in the modules' source, so in Triton's key: a server whose HIP
    runtime lies elsewhere than the builder's finds none of the bake's (and builds them)."""
    out = tmp_path / "bundle"
    assert _bake(out, stand_in_hip)["driver_modules"] >= 1
    manifest = json.loads(next(out.glob("manifests-v*/*.json")).read_text())
    elsewhere = tmp_path / "opt" / "rocm" / "lib" / "libamdhip64.so"
    elsewhere.parent.mkdir(parents=True)
    shutil.copy(stand_in_hip["TRITON_LIBHIP_PATH"], elsewhere)
    served = _serve(tmp_path / "user", out, manifest["key"], {"TRITON_LIBHIP_PATH": str(elsewhere)})
    assert served["loaded"] == [] and "hip_utils" in served["built"], served


def _hip_runtime_found() -> bool:
    from triton.backends.amd.driver import _get_path_to_hip_runtime_dylib

    try:
        return bool(_get_path_to_hip_runtime_dylib())
    except Exception:  # noqa: BLE001 - Triton's "not found" is a RuntimeError today
        return False


@pytest.mark.compiles
def test_a_builder_without_the_hip_runtime_bakes_none_and_says_why(tmp_path):
    """No libamdhip64.so on this builder: the kernels are baked, the modules are not, the
    bake still succeeds (a server builds them on its first start) and says so in one line."""
    if _hip_runtime_found():
        pytest.skip("this machine has a HIP runtime library")
    out = tmp_path / "bundle"
    done = kprecompile_cli("bake", *SELECTION, "--out", out, env={"TRITON_LIBHIP_PATH": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Triton's driver modules not built for gfx942: RuntimeError: cannot locate libamdhip64.so" in done.stdout
    manifest = json.loads(next(out.glob("manifests-v*/*.json")).read_text())
    assert manifest["launchers"] == {}


@pytest.mark.compiles
def test_export_carries_the_driver_modules_and_refuses_a_damaged_one(tmp_path, stand_in_hip):
    """An exported configuration imports with the driver modules its manifest records (verify
    says warm there); an altered module makes export one line and exit 1, no archive."""
    cache = tmp_path / "cache"
    warmed = kprecompile_cli("warm", *SELECTION, "--cache-dir", cache, env=stand_in_hip)
    assert warmed.returncode == 0, warmed.stdout + warmed.stderr
    archive = tmp_path / "gfx942.tgz"
    exported = kprecompile_cli("export", *SELECTION, "--cache-dir", cache, "--archive", archive)
    assert exported.returncode == 0, exported.stderr
    other = tmp_path / "other"
    assert kprecompile_cli("import", archive, "--cache-dir", other).returncode == 0
    manifest = json.loads(next(other.glob("manifests-v*/*.json")).read_text())
    assert manifest["launchers"]
    for files in manifest["launchers"].values():
        for name in files:
            assert len(list(other.glob(f"triton-v1/*/{name}"))) >= 1
    assert kprecompile_cli("verify", *SELECTION, "--cache-dir", other).returncode == 0

    module = next(cache.glob("triton-v1/*/hip_utils*"))
    data = bytearray(module.read_bytes())
    data[-1] ^= 0xFF
    module.write_bytes(bytes(data))
    refused = tmp_path / "refused.tgz"
    done = kprecompile_cli("export", *SELECTION, "--cache-dir", cache, "--archive", refused)
    assert done.returncode == 1 and not refused.exists()
    assert "Triton's driver module hip_utils" in done.stderr and "does not match its record" in done.stderr
    # verify says so; warm builds it again (no manifest records these bytes); then both are content.
    damaged = kprecompile_cli("verify", *SELECTION, "--cache-dir", cache)
    assert damaged.returncode == 1 and "not warm: 1 of Triton's driver modules missing or damaged" in damaged.stdout
    assert f"Triton's driver module [{module.name}]" in damaged.stdout and "does not match its record" in damaged.stdout
    assert kprecompile_cli("warm", *SELECTION, "--cache-dir", cache, env=stand_in_hip).returncode == 0
    assert module.read_bytes() != bytes(data)  # built again, not the damaged bytes recorded
    assert kprecompile_cli("verify", *SELECTION, "--cache-dir", cache).returncode == 0
    assert kprecompile_cli("export", *SELECTION, "--cache-dir", cache, "--archive", refused).returncode == 0


@pytest.mark.compiles
def test_an_unsigned_archive_brings_no_driver_modules(tmp_path, stand_in_hip):
    """Driver modules are host code a server loads: an archive without a trusted signature that
    carries them is refused even with --allow-unsigned (kernels alone would be imported).
    Control: the same archive signed imports."""
    out, archive = tmp_path / "bundle", tmp_path / "signed.tgz"
    done = kprecompile_cli("bake", *SELECTION, "--out", out, "--archive", archive, env=stand_in_hip)
    assert done.returncode == 0, done.stderr
    unsigned = tmp_path / "unsigned.tgz"
    with tarfile.open(archive) as source, tarfile.open(unsigned, "w:gz") as target:
        for member in source.getmembers():
            if member.name != "bundle.sig":
                target.addfile(member, source.extractfile(member))
    cache = tmp_path / "cache"
    refused = kprecompile_cli("import", unsigned, "--allow-unsigned", "--cache-dir", cache)
    # The --allow-unsigned warning, then the one line that refuses it.
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and refused.stderr.count("\n") == 2, refused.stderr
    assert "Triton's driver modules (host code a server loads) only in an archive signed by a trusted key" in last
    assert not list(cache.glob("manifests-v*/*.json"))
    # The cache's server built its own hip_utils meanwhile (its own bytes): the signed bundle's,
    # which its manifest records, takes its place, and that is no damaged kernel.
    baked = next(out.glob("triton-v1/*/hip_utils*"))
    own = cache / baked.relative_to(out)
    own.parent.mkdir(parents=True)
    own.write_bytes(b"\x7fELF this host's own build")
    imported = kprecompile_cli("import", archive, "--cache-dir", cache)
    assert imported.returncode == 0 and "damaged" not in imported.stderr, imported.stderr
    assert own.read_bytes() == baked.read_bytes()


@pytest.mark.compiles
def test_cache_ls_counts_the_driver_modules_and_cache_rm_leaves_them(tmp_path, stand_in_hip):
    """Two configurations record the same utilities module: `cache ls` counts its bytes in each;
    removing either keeps it (every configuration of this Triton loads it, recorded or not, as
    `prune` keeps a server's own) and the other configuration stays warm."""
    cache = tmp_path / "cache"
    for sequences in ("3", "4"):
        selection = [*SELECTION[:-3], sequences, *SELECTION[-2:]]
        assert kprecompile_cli("warm", *selection, "--cache-dir", cache, env=stand_in_hip).returncode == 0
    utils = next(cache.glob("triton-v1/*/hip_utils*"))
    # Triton's builds are not reproducible (gcc writes the temporary source's path into them): the
    # second warm records the first's modules as they are instead of building them again, so both
    # configurations stay warm.
    for sequences in ("3", "4"):
        selection = [*SELECTION[:-3], sequences, *SELECTION[-2:]]
        assert kprecompile_cli("verify", *selection, "--cache-dir", cache).returncode == 0
    listing = json.loads(kprecompile_cli("cache", "ls", "--cache-dir", cache, "--json").stdout)
    first, second = sorted(listing["configurations"], key=lambda c: c["serving"]["max_num_seqs"])
    manifest = json.loads(next(cache.glob(f"manifests-v*/{first['manifest']}.json")).read_text())
    kernels = sum(file["size"] for job in manifest["jobs"] for file in job["artifacts"].values())
    modules = sum(file["size"] for files in manifest["launchers"].values() for file in files.values())
    assert modules > 0 and first["bytes"] == kernels + modules
    for configuration in (first, second):
        removed = kprecompile_cli("cache", "rm", configuration["manifest"][:12], "--cache-dir", cache, "--json")
        assert removed.returncode == 0 and utils.is_file()
        assert not [r for r in json.loads(removed.stdout)["removals"] if Path(r["path"]).name == utils.parent.name]
        if configuration is first:
            verify = kprecompile_cli("verify", *SELECTION[:-3], "4", *SELECTION[-2:], "--cache-dir", cache)
            assert verify.returncode == 0


@pytest.mark.compiles
def test_a_damaged_module_is_never_recorded_by_the_next_configuration(tmp_path, stand_in_hip):
    """One configuration records hip_utils; its file is damaged; a second configuration's warm
    builds it anew instead of recording the damaged bytes (a manifest records other ones), and the
    first, warmed again, records the rebuilt one (which a manifest now records): both warm."""
    cache = tmp_path / "cache"
    first, second = ([*SELECTION[:-3], sequences, *SELECTION[-2:]] for sequences in ("3", "4"))
    assert kprecompile_cli("warm", *first, "--cache-dir", cache, env=stand_in_hip).returncode == 0
    utils = next(cache.glob("triton-v1/*/hip_utils*"))
    damaged = bytearray(utils.read_bytes())
    damaged[-1] ^= 0xFF
    utils.write_bytes(bytes(damaged))
    assert kprecompile_cli("warm", *second, "--cache-dir", cache, env=stand_in_hip).returncode == 0
    assert utils.read_bytes() != bytes(damaged)
    assert kprecompile_cli("verify", *second, "--cache-dir", cache).returncode == 0
    # (The first configuration's record now differs where the rebuild's bytes do: Triton 3.6's
    # hip_utils, not 3.5's.)
    assert kprecompile_cli("warm", *first, "--cache-dir", cache, env=stand_in_hip).returncode == 0
    rebuilt = utils.read_bytes()
    assert kprecompile_cli("verify", *first, "--cache-dir", cache).returncode == 0
    assert kprecompile_cli("verify", *second, "--cache-dir", cache).returncode == 0 and utils.read_bytes() == rebuilt
