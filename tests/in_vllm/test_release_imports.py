"""vLLM's modules as tracing imports them: under the stand-in platform of the target being traced."""

from __future__ import annotations

import sys

import pytest

from kprecompile.inputs.targets import TARGETS
from kprecompile.platforms import vllm_platform
from kprecompile.platforms.triton_driver import active_target
from kprecompile.tracing.libraries import import_library_module

MODULE = "vllm.v1.attention.backends.utils"


@pytest.mark.vllm
@pytest.mark.vllm_process("capture-rocm")
def test_a_module_asked_for_again_under_its_platform_is_returned_as_imported(release, monkeypatch):
    """A trace asks for vLLM modules it has imported, every step: where the target's platform is
    vLLM's current one, the module comes back as imported, without `target_imports`. Control:
    under another target the call enters it, and that target's platform is then vLLM's."""
    import vllm.platforms

    entered: list[str] = []
    target_imports = vllm_platform.target_imports
    monkeypatch.setattr(
        vllm_platform, "target_imports", lambda target: entered.append(target.name) or target_imports(target)
    )

    def platform() -> str | None:
        return getattr(vllm.platforms._current_platform, "_kprecompile_target", None)

    with active_target(TARGETS["gfx942"]):
        import_library_module(MODULE)
    assert platform() == "gfx942"
    entered.clear()
    with active_target(TARGETS["gfx950"]):
        first = import_library_module(MODULE)
        assert entered == ["gfx950"] and platform() == "gfx950"
        again = import_library_module(MODULE)
    assert again is first is sys.modules[MODULE] and entered == ["gfx950"]
    with active_target(TARGETS["gfx942"]):
        import_library_module(MODULE)
    assert entered == ["gfx950", "gfx942"] and platform() == "gfx942"
