"""The libraries the sandbox image installs, read from its pinned requirements (``requirements.txt``
beside this module: the one source of truth the Dockerfile installs and the prompts list)."""

from __future__ import annotations

from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
# Distribution name -> the module a script imports, where they differ.
IMPORT_NAMES = {"scikit-learn": "sklearn", "xgboost-cpu": "xgboost"}
# Distribution name -> the name a prompt uses, where they differ.
PROMPT_NAMES = {"xgboost-cpu": "xgboost"}


def pinned(path: Path = REQUIREMENTS) -> list[tuple[str, str]]:
    """(distribution, version) of every requirement, in file order; ValueError for a line that is not
    an exact ``name==version`` pin."""
    out = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip() or any(c in line for c in "<>~!*;[ "):
            raise ValueError(f"{path}:{number}: {raw.strip()!r} is not an exact pin (name==X.Y.Z)")
        out.append((name.strip(), version.strip()))
    return out


def import_names(path: Path = REQUIREMENTS) -> list[str]:
    """The modules a script imports for them (``sklearn`` for scikit-learn)."""
    return [IMPORT_NAMES.get(name, name) for name, _ in pinned(path)]


def prompt_line(path: Path = REQUIREMENTS) -> str:
    """``numpy 2.3.5, pandas 3.1.1, ...``: the libraries as a prompt lists them."""
    return ", ".join(f"{PROMPT_NAMES.get(name, name)} {version}" for name, version in pinned(path))


__all__ = ["REQUIREMENTS", "import_names", "pinned", "prompt_line"]
