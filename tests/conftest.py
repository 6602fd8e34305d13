import pytest

from kprecompile.cache.layout import CACHE_DIR_VARIABLE, CacheLayout
from kprecompile.targets import TARGETS


@pytest.fixture
def cache_layout(tmp_path, monkeypatch) -> CacheLayout:
    """A private cache; the environment points at it too, so nothing touches the user's."""
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(root))
    return CacheLayout.at(root)


@pytest.fixture
def gfx942():
    return TARGETS["gfx942"]


@pytest.fixture
def gfx950():
    return TARGETS["gfx950"]


@pytest.fixture
def sm90():
    return TARGETS["sm90"]
