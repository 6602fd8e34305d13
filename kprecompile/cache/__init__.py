"""The on-disk cache: layout (paths only), Triton entries, locks, toolchain, manifests."""

from .layout import CACHE_DIR_VARIABLE, CacheLayout, default_cache_root

__all__ = ["CACHE_DIR_VARIABLE", "CacheLayout", "default_cache_root"]
