"""Installing next to a serving image keeps the image's torch, Triton and AITER; a CPU builder's
`builder` extra admits every Triton a supported vLLM release pins."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What serving images hold (their metadata, as pip sees installed packages): each vLLM line's
# torch with the Triton it pins, packaged for CUDA or for ROCm, and AITER under either name.
IMAGES = {
    "vLLM 0.12 on CUDA": {"torch": "2.9.0", "triton": "3.5.0"},
    "vLLM 0.19 on CUDA": {"torch": "2.10.0", "triton": "3.6.0"},
    "vLLM 0.33 on CUDA": {"torch": "2.14.0", "triton": "3.8.0"},
    "vLLM 0.12 on ROCm, AITER as aiter": {"torch": "2.9.0+rocm6.4", "pytorch-triton-rocm": "3.5.0", "aiter": "0.1.5"},
    "vLLM 0.33 on ROCm": {"torch": "2.14.0+rocm7.1", "pytorch-triton-rocm": "3.8.0", "amd-aiter": "0.1.9"},
    "Triton 3.9": {"torch": "2.13.0", "triton": "3.9.0"},
}
KERNEL_LIBRARIES = {"torch", "triton", "pytorch-triton-rocm", "amd-aiter", "aiter"}
# Every Triton a supported vLLM release's torch pins, and the newest.
SUPPORTED_TRITON = ("3.5.0", "3.5.1", "3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(texts) -> dict[str, Requirement]:
    return {Requirement(text).name: Requirement(text) for text in texts}


def test_the_runtime_requirements_name_no_kernel_library_and_the_builder_extra_admits_every_supported_triton():
    runtime = _requirements(_project()["dependencies"])
    assert set(runtime) & KERNEL_LIBRARIES == {"torch"}
    for image in IMAGES.values():
        assert runtime["torch"].specifier.contains(image["torch"], prereleases=True), image
    from pip._vendor.packaging.requirements import Requirement as PipRequirement  # the rule pip applies

    builder = {
        name: PipRequirement(str(requirement))
        for name, requirement in _requirements(_project()["optional-dependencies"]["builder"]).items()
    }
    for version in SUPPORTED_TRITON:
        assert builder["triton"].specifier.contains(version), version
    assert not builder["triton"].specifier.contains("3.4.0")
    # The exact versions the tests run with are in the test extra only, inside the builder's ranges.
    pinned = [Requirement(text) for text in _project()["optional-dependencies"]["test"] if "==" in text]
    assert {requirement.name for requirement in pinned} == {"triton", "amd-aiter"}
    for pin in pinned:
        [version] = [spec.version for spec in pin.specifier]
        assert builder[pin.name].specifier.contains(version), (pin.name, version)


def _fake_installed(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")


def _would_install(python: Path, site: Path, *requirements: str) -> set[str]:
    result = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            "-",
            "--disable-pip-version-check",
            *requirements,
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    if result.returncode != 0:
        pytest.skip(f"no package index reachable for the dry run: {result.stderr.strip().splitlines()[-1:]}")
    return {item["metadata"]["name"].lower() for item in json.loads(result.stdout)["install"]}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """kprecompile's wheel, built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [built] = out.glob("kprecompile-*.whl")
    return built


@pytest.mark.slow
@pytest.mark.parametrize("image", IMAGES, ids=lambda name: name.replace(" ", "-"))
def test_pip_install_of_the_wheel_beside_an_image_installs_kprecompile_not_the_images_toolchain(image, wheel, tmp_path):
    """`pip install --dry-run` of the built wheel in an environment holding the image's releases:
    kprecompile and its light dependencies, nothing of the image's torch, Triton or AITER."""
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = tmp_path / "site"
    for name, version in IMAGES[image].items():
        _fake_installed(site, name, version)
    installed = _would_install(python, site, str(wheel))
    assert "kprecompile" in installed and not installed & KERNEL_LIBRARIES, installed
    # Negative control: the requirement kprecompile had (a Triton range) replaces a ROCm image's Triton.
    if "pytorch-triton-rocm" in IMAGES[image]:
        assert "triton" in _would_install(python, site, "triton>=3.5,<3.10")
