"""`make test`'s slow dependencies, built in the background while the tests that need none run.

On a cold machine the control plane's Go builds take about 21 minutes and the tests that need no
build about as long again; one after the other they took the cold `make test` past an hour.
``start`` launches each build (:data:`BUILDS`) as a background process at nice 10 (the tests keep
their CPU) that holds an exclusive lock on ``<dir>/<name>.lock`` until it exits, and returns at once;
the tests run meanwhile, ordered so that those needing a build come last (:func:`run_rank`, applied
by tests/conftest.py), and before the first test that needs one, tests/conftest.py waits on its
lock (:func:`wait`) outside the test's timeout. ``finish`` waits for every build and prints its
exit status and time; a failed build fails `make test` and every test that needed it.

Standard library only: it runs with a bare ``python3`` before the venv exists::

    python3 tests/build_deps.py start DIR [NAME ...]   # default: every build
    python3 tests/build_deps.py finish DIR

The tests find DIR in ``WMRL_TEST_BUILDS`` (the Makefile sets it); without it nothing waits and a
test's fixture builds what it needs itself, as when pytest runs by hand.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]

# name -> the build's command (run from the repository root with this interpreter)
BUILDS = {
    "vllm": ("tests/vllm_cpu/harness.py", "build"),
    "images": ("tests/images/images.py", "build"),
    "cluster": ("tests/cluster/cluster.py", "build"),
}
# The order gated tests run in, soonest-ready first (cold: vLLM ~9 min, images ~14, Go ~21).
GATE_ORDER = ("vllm", "images", "cluster")
# What a test needs, read from the fixtures it uses (directly or not) and from its markers.
GATE_FIXTURES = {
    "k8s_cluster": "cluster",
    "real_node": "cluster",
    "vllm_build": "vllm",
    "e2e_images": "images",
    "trainer_image": "images",
}
GATE_MARKERS = {"cluster": ("cluster",), "e2e": ("cluster", "images"), "vllm": ("vllm",), "images": ("images",)}
NICE = 10
ENV_DIR = "WMRL_TEST_BUILDS"


def gates(fixturenames: Iterable[str], markers: Iterable[str]) -> frozenset:
    """The background builds a test needs."""
    needed = {GATE_FIXTURES[f] for f in fixturenames if f in GATE_FIXTURES}
    for marker in markers:
        needed.update(GATE_MARKERS.get(marker, ()))
    return frozenset(needed)


def run_rank(needed: Iterable[str]) -> int:
    """0 for a test that needs no build, else 1 + the position of the last-ready build it needs."""
    return max((GATE_ORDER.index(name) + 1 for name in needed), default=0)


@dataclass(frozen=True)
class Result:
    name: str
    returncode: Optional[int]  # None: the build ended without writing its result (killed)
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        if self.returncode is None:
            return f"{self.name}: ended without a result (killed?), log {self.log}"
        return f"{self.name}: exit {self.returncode} after {self.seconds:.0f} s, log {self.log}"


def _paths(directory: Path, name: str) -> tuple[Path, Path, Path]:
    return directory / f"{name}.lock", directory / f"{name}.log", directory / f"{name}.json"


def start(directory: Path, names: Sequence[str] = tuple(BUILDS), nice: int = NICE,
          commands: Optional[dict] = None) -> list[int]:
    """Launch the builds in the background, each holding its lock from before this returns; their pids.

    ``commands`` replaces :data:`BUILDS` (the tests of this module use it)."""
    commands = commands or {name: (sys.executable, *BUILDS[name]) for name in BUILDS}
    unknown = [n for n in names if n not in commands]
    if unknown:
        raise ValueError(f"unknown build(s) {unknown}; known: {sorted(commands)}")
    directory.mkdir(parents=True, exist_ok=True)
    pids = []
    for name in names:
        lock_path, log_path, result_path = _paths(directory, name)
        lock = open(lock_path, "a+")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"the {name} build of an earlier `make test` is still running ({lock_path} "
                                   f"is locked): wait for it or stop it") from None
            result_path.unlink(missing_ok=True)
            with open(log_path, "w") as log:
                # The child inherits the locked file description: the lock lasts as long as it does.
                proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "run", str(directory), name,
                                         json.dumps(list(commands[name]))],
                                        cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        pass_fds=(lock.fileno(),), preexec_fn=lambda: os.nice(nice))
        finally:
            lock.close()
        pids.append(proc.pid)
        print(f"test-deps: {name} building in the background (nice {nice}), log {log_path}", flush=True)
    return pids


def _run(directory: Path, name: str, command: Sequence[str]) -> int:
    """The background process: runs the build, records its result, releases the lock by exiting. The build
    does not inherit the lock (subprocess closes every other descriptor), so a daemon it leaves cannot hold it."""
    _, _, result_path = _paths(directory, name)
    t0 = time.monotonic()
    try:
        returncode = subprocess.run(list(command), cwd=REPO).returncode
    except OSError as exc:
        print(f"test-deps: cannot run {command}: {exc}", flush=True)
        returncode = 127
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": name, "returncode": returncode, "seconds": time.monotonic() - t0}))
    tmp.rename(result_path)
    return returncode


def started(directory: Path) -> list[str]:
    """The builds launched into ``directory`` (in :data:`GATE_ORDER` where known)."""
    return sorted((p.stem for p in directory.glob("*.lock")),
                  key=lambda n: (GATE_ORDER.index(n) if n in GATE_ORDER else len(GATE_ORDER), n))


def wait(directory: Path, name: str) -> Optional[Result]:
    """Block until the build ``name`` launched into ``directory`` ends; its result (None if none was launched)."""
    lock_path, log_path, result_path = _paths(directory, name)
    if not lock_path.exists():
        return None
    with open(lock_path) as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        data = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return Result(name, None, 0.0, log_path)
    return Result(name, data["returncode"], float(data["seconds"]), log_path)


def is_running(directory: Path, name: str) -> bool:
    lock_path, _, _ = _paths(directory, name)
    if not lock_path.exists():
        return False
    with open(lock_path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def finish(directory: Path, out=None) -> int:
    """Wait for every launched build; print each one's result (a failed one's log tail). 1 if any failed."""
    out = out or sys.stdout
    failed = False
    for name in started(directory):
        result = wait(directory, name)
        print(f"test-deps: {result.describe()}", file=out, flush=True)
        if not result.ok:
            failed = True
            print(_tail(result.log, 60), file=out, flush=True)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: {Path(__file__).name} start DIR [NAME ...] | finish DIR"
    if argv[:1] == ["-h"] or argv[:1] == ["--help"]:
        print(__doc__ + "\n" + usage)
        return 0
    if len(argv) >= 2 and argv[0] == "start":
        try:
            start(Path(argv[1]), argv[2:] or tuple(BUILDS))
        except (RuntimeError, ValueError) as exc:
            print(f"test-deps: {exc}", file=sys.stderr)
            return 2
        return 0
    if len(argv) == 2 and argv[0] == "finish":
        return finish(Path(argv[1]))
    if len(argv) == 4 and argv[0] == "run":
        return _run(Path(argv[1]), argv[2], json.loads(argv[3]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
