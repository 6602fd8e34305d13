"""Which vLLM release is installed, and which releases kprecompile is tested against."""

from __future__ import annotations

from importlib import metadata

# Tested against these releases (tests/test_vllm.py, scripts/install_vllm.py): 0.11.2 and 0.12.0
# pair with the installed amd-aiter; 0.33.0 is the newest on the registry.
SUPPORTED_RELEASES = ("0.11.2", "0.12.0", "0.33.0")


def installed_release() -> str | None:
    """The installed vLLM's version, or None where vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None
