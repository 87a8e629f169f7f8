"""bubblewrap for the deployed-mode sandbox tests: Debian's package, at a known version,
unpacked once into ``${WMRL_CACHE:-~/.cache/wmrl}/bubblewrap/<version>/`` (no root, no install).

The sandbox image installs the same package (``sandbox-image/Dockerfile``); the tests give the
server this copy explicitly (``--bwrap``), never whatever ``bwrap`` the machine's PATH has, so
they behave the same whether or not bubblewrap is installed system-wide. Fails loudly when the
package cannot be had: the deployed mode is never silently left untested.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

VERSION = "0.8.0-2+deb12u1"  # Debian 12's; the image is built on the same release


def cache_dir() -> Path:
    return Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl") / "bubblewrap" / VERSION


@contextlib.contextmanager
def _apt_lock():
    """The lock the background builds take around apt-get (`make test` runs them beside the tests), so
    that a download never reads package lists an `apt-get update` is rewriting; none if it cannot be opened."""
    try:
        lock = open(os.environ.get("WMRL_APT_LOCK", "/var/lock/wmrl-apt.lock"), "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure() -> str:
    """Path of the cached bwrap (unpacked on first use)."""
    target = cache_dir() / "usr" / "bin" / "bwrap"
    if target.is_file():
        return str(target)
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise RuntimeError(f"the deployed-mode sandbox tests need Debian's bubblewrap {VERSION}: apt-get and "
                           f"dpkg-deb unpack it into {cache_dir()}")
    with tempfile.TemporaryDirectory() as tmp:
        # apt drops to its own user for downloads; a world-writable directory lets it write there.
        os.chmod(tmp, 0o777)
        with _apt_lock():
            run = subprocess.run(["apt-get", "download", f"bubblewrap={VERSION}"], cwd=tmp, capture_output=True,
                                 text=True)
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
