"""How counts, sizes and names are spelled in what kprecompile says: `1 kernel`, `1,158 kernels`,
`940 B`, `243.4 kB`, `159.0 MB`, `model\\nname`."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


def human_size(size: int) -> str:
    """Bytes in SI units (as `du -h --si` and uv print them), never `0 MB` for a small file."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def printable(text: str) -> str:
    """`text` with each character a terminal acts on instead of showing (newline, carriage
    return, escape sequences, other control and format characters) written as its Python escape
    (`\\n`, `\\x1b`, `\\u202e`): a name a user or an archive chose prints as itself, on its own
    line, and cannot pose as another line of output."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
