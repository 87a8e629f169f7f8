"""bubblewrap for the deployed-mode sandbox tests: the machine's ``bwrap``, or Debian's package
unpacked once into ``${WMRL_CACHE:-~/.cache/wmrl}/bubblewrap/<version>/`` (no root, no install).

The sandbox image installs the same package (``sandbox-image/Dockerfile``); the tests point the
server at this copy through ``WMRL_BWRAP``. Fails loudly when neither is possible: the
deployed mode is never silently left untested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

VERSION = "0.8.0-2+deb12u1"  # Debian 12's; the image is built on the same release


def cache_dir() -> Path:
    return Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl") / "bubblewrap" / VERSION


def ensure() -> str:
    """Path of bwrap: on PATH, else the cached copy (unpacked on first use)."""
    found = shutil.which("bwrap")
    if found:
        return found
    target = cache_dir() / "usr" / "bin" / "bwrap"
    if target.is_file():
        return str(target)
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise RuntimeError("the deployed-mode sandbox tests need bubblewrap: install the 'bubblewrap' package "
                           "(or put bwrap on PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        # apt drops to its own user for downloads; a world-writable directory lets it write there.
        os.chmod(tmp, 0o777)
        run = subprocess.run(["apt-get", "download", f"bubblewrap={VERSION}"], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob("bubblewrap_*.deb"))
        if not debs:
            raise RuntimeError(f"apt-get download bubblewrap={VERSION} failed:\n{run.stdout}{run.stderr}")
        staging = Path(tempfile.mkdtemp(prefix="bwrap-", dir=cache_dir().parent if cache_dir().parent.exists()
                                        else None))
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(staging)], check=True)
    cache_dir().parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, cache_dir())  # atomic: a half-unpacked copy is never used
    return str(target)


def copy_for(directory: Path) -> str:
    """A copy of bwrap in ``directory``, which an unprivileged server can reach (the cache may
    lie under a home directory only its owner can traverse)."""
    copy = directory / "bwrap"
    shutil.copy2(ensure(), copy)
    copy.chmod(0o755)
    return str(copy)
