"""Where wmrl keeps what it builds once (warm-started policies, task suites).

``$WMRL_CACHE``, else ``~/.cache/wmrl``: the same root ``tests/cluster`` uses for its binaries
(it reads the variable itself, to stay runnable with a bare ``python3``).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("WMRL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "wmrl"
