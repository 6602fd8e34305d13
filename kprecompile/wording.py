"""How counts and sizes are spelled in what kprecompile says: `1 kernel`, `1,158 kernels`,
`940 B`, `243.4 kB`, `159.0 MB`."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


def human_size(size: int) -> str:
    """Bytes in SI units (as `du -h --si` and uv print them), never `0 MB` for a small file."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
