"""Installing next to a serving image keeps the image's torch, Triton and AITER."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What a ROCm serving image may hold: other releases than the ones the tests pin.
IMAGE = {"torch": "2.9.0+rocm6.4", "triton": "3.5.1", "amd-aiter": "0.1.5"}


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(text).name: Requirement(text) for text in project["dependencies"]}


def test_the_runtime_requirements_accept_an_images_own_toolchain():
    requirements = _requirements()
    for name, version in IMAGE.items():
        assert requirements[name].specifier.contains(version, prereleases=True), (name, version)
    # The exact versions live in the test extra only, and the ranges admit them as pip reads a
    # range (development releases only where the range names one).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = [Requirement(text) for text in project["optional-dependencies"]["test"] if "==" in text]
    assert {requirement.name for requirement in pinned} == {"triton", "amd-aiter"}
    from pip._vendor.packaging.requirements import Requirement as PipRequirement  # the rule pip applies

    for pin in pinned:
        [version] = [spec.version for spec in pin.specifier]
        assert PipRequirement(str(requirements[pin.name])).specifier.contains(version), (pin.name, version)


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


@pytest.mark.slow
def test_pip_install_beside_an_image_installs_kprecompile_not_the_images_toolchain(tmp_path):
    """`pip install --dry-run` in an environment holding the image's releases (their metadata, as
    pip sees installed packages): kprecompile and its light dependencies, nothing of the image."""
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = tmp_path / "site"
    for name, version in IMAGE.items():
        _fake_installed(site, name, version)
    installed = _would_install(python, site, "-e", str(ROOT))
    assert "kprecompile" in installed and not installed & {"torch", "triton", "amd-aiter"}
    # The same environment against the old pins would have replaced Triton and AITER.
    assert {"triton", "amd-aiter"} <= _would_install(python, site, "triton>=3.6,<3.7", "amd-aiter>=0.1.7.post2.dev18")
