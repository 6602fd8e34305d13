"""Keys as the hash of a named dict (pip's recipe): adding a part is one line, and the
stored parts say what each key means."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def hash_named_dict(parts: Mapping[str, Any]) -> str:
    """sha256 (hex) of `parts` as JSON with sorted keys: equal dicts, equal keys, any order."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
