"""The examples at the end of each command's `--help`, as hf's and uv's commands show them.

Each is a real invocation: tests/test_cli.py parses every one with its command's own options.
"""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "plan": (
        "kprecompile plan --model deepseek-r1 --tp 8 --target gfx942",
        "kprecompile plan --model meta-llama/Llama-3.1-8B-Instruct --engine vllm --max-model-len 8192 --json",
    ),
    "warm": (
        "kprecompile warm --model deepseek-r1 --tp 8 --target gfx942",
        "kprecompile warm --model deepseek-r1 --tp 8 --target gfx942 --target gfx950 --jobs 16",
    ),
    "verify": (
        "kprecompile verify --model deepseek-r1 --tp 8 --target gfx942",
        "kprecompile verify --model deepseek-r1 --tp 8 --target gfx942 --deep --json",
    ),
    "bake": ("kprecompile bake --model deepseek-r1 --tp 8 --target gfx942 --out /opt/kprecompile",),
    "export": (
        "kprecompile export --model deepseek-r1 --tp 8 --target gfx942 --archive r1.tar --signing-key signing.pem",
    ),
    "import": ("kprecompile import r1.tar --trusted-key signing.pem.pub",),
    "key generate": ("kprecompile key generate signing.pem",),
    "env": ("kprecompile env", "kprecompile env --engine vllm --json"),
    "cache dir": ("kprecompile cache dir",),
    "cache ls": ("kprecompile cache ls", "kprecompile cache ls --json"),
    "cache rm": ("kprecompile cache rm --model deepseek-r1 --dry-run", "kprecompile cache rm 3f2a9c"),
    "cache prune": ("kprecompile cache prune --dry-run", "kprecompile cache prune --max-size 50G"),
    "misses": ("kprecompile misses", "kprecompile misses --model deepseek-r1 --json"),
    "doctor": ("kprecompile doctor",),
    "engine install": ("kprecompile engine install vllm==0.12.0",),
    "engine ls": ("kprecompile engine ls --json",),
}


def epilog(command: str) -> str:
    """`Examples:` and the command's examples, kept as written (click's `\\b`)."""
    return "\b\nExamples:\n" + "\n".join(f"  {example}" for example in EXAMPLES[command])
