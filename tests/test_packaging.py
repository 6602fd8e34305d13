"""Installing next to a serving image keeps the image's torch, Triton and AITER; a CPU builder's
`builder` extra admits every Triton a supported vLLM release pins."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib
from helpers import parse_command_line
from packaging.requirements import Requirement

from kprecompile.errors import InputError

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


def test_the_wheel_installed_in_a_fresh_venv_runs_from_there(wheel, tmp_path):
    """The README's install where kprecompile is not on the package index: its wheel, built from
    the checkout, in a fresh venv (this environment's torch and light dependencies beside it, as
    a serving image has them). The console script, the presets (package data) and vLLM's plugin
    entry point come from the wheel."""
    import sysconfig

    from kprecompile import __version__

    assert wheel.name == f"kprecompile-{__version__}-py3-none-any.whl"
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    install = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    # The dependencies, as an image provides them: a path entry (its .pth files, the checkout's
    # editable install among them, are not read).
    [fresh_site] = (tmp_path / "venv" / "lib").glob("python3*/site-packages")
    (fresh_site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    def run(*argv: str) -> str:
        command = [str(bin_dir / "kprecompile"), *argv]
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        return result.stdout

    assert run("--version").split()[-1] == __version__
    checks = {check["name"]: check for check in json.loads(run("doctor", "--json"))["checks"]}
    assert checks["python"]["verdict"] == "ok" and checks["triton"]["verdict"] == "ok"
    plan = json.loads(run("plan", "--model", "deepseek-v2-lite", "--max-num-seqs", "4", "--target", "gfx942", "--json"))
    assert plan["kernels"] > 0
    probe = (
        "import importlib.metadata as m, kprecompile; print(kprecompile.__file__); "
        "print([e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'kprecompile'])"
    )
    where, plugin = subprocess.run(
        [str(bin_dir / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True, timeout=120
    ).stdout.splitlines()
    assert Path(where).is_relative_to(fresh_site)  # the wheel's copy, not the checkout's
    assert plugin == "['kprecompile.serve.vllm:register']"


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of scripts/Dockerfile.example, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", (ROOT / "scripts" / "Dockerfile.example").read_text())
    lines = [line.strip() for line in joined.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def _stages(instructions) -> dict[str, list[tuple[str, str]]]:
    stages, name = {}, None
    for instruction, arguments in instructions:
        if instruction == "FROM":
            words = arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else "final"
            stages[name] = [(instruction, words[0])]
        elif name is not None:
            stages[name].append((instruction, arguments))
    return stages


def test_the_dockerfile_installs_one_pinned_wheel_and_runs_the_documented_commands(wheel):
    """No Docker here: the Dockerfile is read. One pinned install of the wheel the README builds,
    in one stage every other starts from; the base image named at build time, never a floating
    default; the model and serving flags in one place, read by the bake and by `vllm serve`; each
    kprecompile command it runs parses with that command's own options; a build context of the
    wheel alone. (tests/conftest.py runs its bake line for the session's baked cache.)"""
    import fnmatch

    from kprecompile.cli import cli

    instructions = _dockerfile()
    assert instructions[0] == ("ARG", "BASE")  # no default: named by version or digest at build
    stages = _stages(instructions)
    assert list(stages) == ["serving", "bake", "final"]
    assert stages["serving"][0] == ("FROM", "${BASE}")
    assert stages["bake"][0] == stages["final"][0] == ("FROM", "serving")
    arguments = dict(a.split("=", 1) if "=" in a else (a, None) for i, a in instructions if i == "ARG")
    assert arguments["KPRECOMPILE_WHEEL"] == f"dist/{wheel.name}"
    runs = [(stage, a) for stage, body in stages.items() for i, a in body if i == "RUN"]
    installs = [(stage, a) for stage, a in runs if "pip install" in a]
    install = "pip install --no-cache-dir /tmp/wheels/*.whl && rm -r /tmp/wheels && kprecompile doctor"
    assert installs == [("serving", install)]
    assert ("COPY", "${KPRECOMPILE_WHEEL} /tmp/wheels/") in stages["serving"]
    # The flags in one place: set in the shared stage, read by the bake and the server.
    environment = [a for i, a in stages["serving"] if i == "ENV"]
    assert {"MODEL=${MODEL}", "SERVE_ARGS=${SERVE_ARGS}", "VLLM_ROCM_USE_AITER=1"} <= set(environment)
    assert not [a for stage in ("bake", "final") for i, a in stages[stage] if i == "ENV" and a.startswith("VLLM_")]
    commands = [shlex.split(a) for stage, a in runs if stage == "bake"]
    assert commands[0] == ["hf", "download", "${MODEL}", "config.json"]
    bake = commands[1]
    assert bake[:4] == ["kprecompile", "bake", "--model", "${MODEL}"] and "${SERVE_ARGS}" in bake
    [entrypoint] = [json.loads(a) for i, a in stages["final"] if i == "ENTRYPOINT"]
    assert entrypoint[:2] == ["/bin/sh", "-c"] and entrypoint[2].startswith('exec vllm serve "$MODEL" $SERVE_ARGS ')
    # Each kprecompile command, its build arguments filled in, parses with the command's options.
    for _, text in runs:
        for part in text.split("&&"):
            words = shlex.split(part.replace("${TARGETS}", "--target gfx942").replace("${SERVE_ARGS}", "--tp 8"))
            if words[0] == "kprecompile":
                parse_command_line(cli.get_command(None, words[1]), words[1], words[2:])  # raises on an unknown option
    with pytest.raises(InputError, match="--max-bytes"):  # the control: an option bake (and vllm serve) does not take
        parse_command_line(cli.get_command(None, "bake"), "bake", ["--model", "m", "--out", "o", "--max-bytes", "1"])
    # The build context: everything left out but the wheel the Dockerfile copies.
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*" and all(p.startswith("!") for p in patterns[1:])
    admitted = [p[1:] for p in patterns[1:]]
    assert all(fnmatch.fnmatch(arguments["KPRECOMPILE_WHEEL"], p) for p in admitted)
    assert not any(fnmatch.fnmatch(path, p) for p in admitted for path in (".venv/x", ".vllm/0.12.0/x", "README.md"))


def test_the_readme_builds_the_wheel_the_dockerfile_copies_and_passes_only_arguments_it_declares():
    from kprecompile import __version__

    readme = (ROOT / "README.md").read_text()
    assert "pip wheel --no-deps --wheel-dir dist ." in readme
    assert set(re.findall(r"kprecompile-[^ ]+\.whl", readme)) == {f"kprecompile-{__version__}-py3-none-any.whl"}
    declared = {a.split("=", 1)[0] for i, a in _dockerfile() if i == "ARG"}
    documented = set(re.findall(r"--build-arg (\w+)=", readme + (ROOT / "scripts" / "Dockerfile.example").read_text()))
    assert documented and documented <= declared, documented - declared
