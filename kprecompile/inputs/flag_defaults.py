"""What each vLLM release reads for a selection flag left unset.

A flag's default is the release's, not kprecompile's: vLLM 0.33 turned AITER's FP8 and FP4 BMM for
MLA off by default, so `VLLM_ROCM_USE_AITER=1` with nothing else runs `torch.bmm` in 0.33 and
AITER's Triton BMM in 0.32. An unset flag therefore means what the planned release's own
`vllm/envs.py` gives it, both in the selection and in the environment fingerprint of the key.

`flag_defaults.json` holds every release's defaults, read from its own `envs.py`
(`scripts/flag_defaults.py`) without importing vLLM (that imports torch; the key is computed on
hot paths). A release missing from the table is read from its own `envs.py` where it is the
installed vLLM, else it takes the newest release's before it. The tests inside each release check
the table against the release's `vllm.envs` as vLLM itself imports it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from importlib import metadata, resources
from pathlib import Path

from packaging.version import Version

DEFAULTS_TABLE = "flag_defaults.json"
# The kinds of flags whose default a release decides (a string flag's default is "unset").
_DECIDED_KINDS = ("bool", "int_bool")


def flag_names() -> tuple[str, ...]:
    """The registered vLLM flags whose default a release decides."""
    from .environment import VARIABLES

    return tuple(v.name for v in VARIABLES if v.owner == "vllm" and v.kind in _DECIDED_KINDS)


@functools.cache
def defaults_table() -> dict[str, dict[str, str]]:
    """Release -> {flag: "1" or "0"} for the flags that release reads."""
    document = json.loads((resources.files(__package__) / DEFAULTS_TABLE).read_text())
    return {release: dict(flags) for release, flags in document["releases"].items()}


def release_defaults(release: str) -> dict[str, str]:
    """The defaults `release` gives the registered flags it reads ("1"/"0"); a flag it does not
    read is absent (kprecompile's default stands: the flag changes nothing there)."""
    table = defaults_table()
    if release in table:
        return table[release]
    envs_file = _installed_envs_file() if installed_vllm_release() == release else None
    if envs_file is not None:
        return read_envs_defaults(envs_file)
    older = [known for known in table if Version(known) <= Version(release)]
    return table[max(older, key=Version)] if older else {}


def installed_vllm_release() -> str | None:
    """The installed vLLM's version, or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _installed_envs_file() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    envs_file = Path(next(iter(spec.submodule_search_locations))) / "envs.py"
    return envs_file if envs_file.is_file() else None


@functools.cache
def read_envs_defaults(envs_file: Path) -> dict[str, str]:
    """The defaults a release's `vllm/envs.py` gives the registered flags, read by running that
    file alone (it needs only the standard library) and calling each flag's reader unset."""
    spec = importlib.util.spec_from_file_location("_kprecompile_release_envs", envs_file)
    assert spec is not None and spec.loader is not None, envs_file
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readers = module.environment_variables
    defaults = {}
    for name in flag_names():
        if name not in readers:
            continue
        saved = os.environ.pop(name, None)
        try:
            defaults[name] = "1" if readers[name]() else "0"
        finally:
            if saved is not None:
                os.environ[name] = saved
    return defaults
