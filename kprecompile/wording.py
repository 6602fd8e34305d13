"""How counts are spelled in what kprecompile says: `1 kernel`, `2 kernels`, `1,158 kernels`."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"
