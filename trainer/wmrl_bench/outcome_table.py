"""The outcome table: each distinct (task, script) executed once for real, then looked up.

The demo policy's scripts are deterministic programs (every estimator has a fixed
``random_state``), so a script's real outcome on a task never changes. The speedup
benchmark trains many arms over many seeds on the same few hundred scripts per task:
executing each of them once through the sandbox servers, and charging the measured
execution time to every arm that runs it again, makes 20 seeds affordable on 2 cores
without changing a single reward.

What is stored per (task, sha256 of the script): the graded :class:`~wmrl.outcome.Outcome`
and the sandbox's own ``run_result.execution_time`` (seconds inside the sandbox, no queue
or HTTP). The table lives under ``<cache root>/outcomes/<key>.jsonl``, one JSON line per
entry, appended as executions finish (a line cut off by a crash is ignored on load, so a
crash loses at most the executions in flight). The key covers the suite's version and
task data, the sources that execute and grade a script, whether executions start warm
(forked from a fork server with the libraries imported) or cold (a new interpreter each), and
the versions of Python, numpy and scikit-learn: anything that could change an outcome or a
duration starts a new table.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import hashlib
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from wmrl.cache import cache_root
from wmrl.outcome import Outcome
from wmrl.tasks import Task

log = logging.getLogger("wmrl.bench.outcomes")


@dataclass(frozen=True)
class Entry:
    outcome: Outcome
    seconds: float


def code_key(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


EXECUTING_SOURCES = ("executor.py", "fetch.py", "isolation.py", "linux.py", "preexec.py", "processes.py", "uids.py",
                     "warm.py", "warm_slots.py", "server.py", "seccomp.py", "namespaces.py")
"""The sandbox modules that run a script and time it (the dispatcher, the benchmark and the self-test do not)."""


def sandbox_fingerprint(warm: bool) -> str:
    """Hash of what executes and grades a script: the executing sandbox sources and the grading, warm or
    cold starts, the interpreter and libraries."""
    import numpy
    import sklearn
    import wmrl.grading
    import wmrl_sandbox

    digest = hashlib.sha256()
    package = Path(wmrl_sandbox.__file__).parent
    for path in [package / name for name in EXECUTING_SOURCES] + [Path(wmrl.grading.__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(f"{sys.version}|{numpy.__version__}|{sklearn.__version__}|warm={warm}".encode())
    return digest.hexdigest()[:16]


def table_key(tasks: Iterable[Task], suite_version: str, warm: bool, timeout: float) -> str:
    """The table's name: the suite (version, every task's files), the sandbox fingerprint and the
    execution timeout (the same script can time out under 10 s and succeed under 60 s)."""
    digest = hashlib.sha256(f"{suite_version}|{sandbox_fingerprint(warm)}|{float(timeout)!r}".encode())
    for task in sorted(tasks, key=lambda t: t.name):
        for name, content in sorted(task.to_files().items()):
            digest.update(f"{task.name}/{name}\0".encode() + hashlib.sha256(content).digest())
    return digest.hexdigest()[:16]


class OutcomeTable:
    """(task name, script) -> :class:`Entry`, persisted as JSON lines; thread-safe."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._entries: dict[tuple[str, str], Entry] = {}
        self._lock = threading.Lock()
        self._load()

    @classmethod
    def for_suite(cls, tasks: Sequence[Task], suite_version: str, warm: bool, timeout: float,
                  root: Optional[Path] = None) -> "OutcomeTable":
        """The table for ``tasks`` executed under ``timeout`` seconds by sandboxes that start warm or cold."""
        root = Path(root) if root is not None else cache_root() / "outcomes"
        return cls(root / f"{table_key(tasks, suite_version, warm, timeout)}.jsonl")

    def _load(self) -> None:
        if not self.path.is_file():
            return
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
                entry = Entry(Outcome.model_validate(row["outcome"]), float(row["seconds"]))
            except (ValueError, KeyError, TypeError):
                log.warning("%s line %d unreadable (cut off by a crash?): ignored", self.path, number)
                continue
            self._entries.setdefault((row["task"], row["code"]), entry)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, task: Task, code: str) -> Optional[Entry]:
        return self._entries.get((task.name, code_key(code)))

    def put(self, task: Task, code: str, entry: Entry) -> None:
        key = (task.name, code_key(code))
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = entry
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"task": key[0], "code": key[1], "seconds": entry.seconds,
                               "outcome": entry.outcome.model_dump(mode="json")})
            with open(self.path, "a") as out:  # one write per line: a crash cuts at most this line
                out.write(line + "\n")
                out.flush()
                os.fsync(out.fileno())


def _execute(dispatcher: Any, task: Task, code: str, timeout: float) -> cf.Future:
    """Run ``code`` for ``task`` on the sandbox servers; the future's result is an :class:`Entry`."""
    from wmrl.grading import grade

    files = {f"data/{name}": content for name, content in task.data.items()}
    raw = dispatcher.run(code, files, [task.submission], timeout)
    result: cf.Future = cf.Future()

    def done(future: cf.Future) -> None:
        try:
            response = future.result()
            encoded = (response.get("files") or {}).get(task.submission)
            submission = base64.b64decode(encoded) if encoded is not None else None
            outcome = grade(task, response, submission)
            seconds = float((response.get("run_result") or {}).get("execution_time") or 0.0)
            result.set_result(Entry(outcome, seconds))
        except Exception as exc:  # a sandbox failure is not an outcome: nothing is stored
            result.set_exception(exc)

    raw.add_done_callback(done)
    return result


class TableDispatcher:
    """The trainer's dispatcher interface (``run_task``, ``demand``, ``close``) over an outcome table.

    A hit completes at once; a miss is executed for real through ``sandboxes`` (a
    :class:`wmrl_sandbox.dispatcher.SandboxDispatcher`) and stored. :meth:`take_durations` gives
    the measured execution times of a step's executions, which the benchmark's clock charges.
    """

    def __init__(self, table: OutcomeTable, sandboxes: Any = None, timeout: float = 60.0, live: bool = False):
        if live and sandboxes is None:
            raise ValueError("a live dispatcher needs sandboxes")
        self.table, self.sandboxes, self.timeout, self.live = table, sandboxes, timeout, live
        self.hits = self.misses = 0
        self._inflight: dict[tuple[str, str], cf.Future] = {}
        self._charged: list[cf.Future] = []
        self._lock = threading.Lock()

    @property
    def demand(self) -> int:
        return 0

    def _entry(self, task: Task, code: str) -> cf.Future:
        """A future of the (task, code) Entry: from the table, or one execution shared by every caller.

        Live (``--live``): every call executes for real (the table only records the first outcome).
        """
        if self.live:
            with self._lock:
                self.misses += 1
            running = _execute(self.sandboxes, task, code, self.timeout)
            running.add_done_callback(lambda f: f.exception() is None and self.table.put(task, code, f.result()))
            return running
        entry = self.table.get(task, code)
        if entry is not None:
            with self._lock:
                self.hits += 1
            done: cf.Future = cf.Future()
            done.set_result(entry)
            return done
        key = (task.name, code_key(code))
        with self._lock:
            self.misses += 1
            running = self._inflight.get(key)
            if running is not None:
                return running
            if self.sandboxes is None:
                raise KeyError(f"outcome table {self.table.path} has no entry for {task.name} and no sandboxes to run it")
            running = _execute(self.sandboxes, task, code, self.timeout)
            self._inflight[key] = running

        def store(future: cf.Future) -> None:
            if future.exception() is None:
                self.table.put(task, code, future.result())
            with self._lock:
                self._inflight.pop(key, None)

        running.add_done_callback(store)
        return running

    def take_durations(self) -> list[float]:
        """Measured seconds of every execution the trainer asked for since the last call, in order.

        Call it once the trainer has its results; an execution that failed (or is still
        running) has no measured time and costs nothing here (0 s: the list keeps one entry
        per request, so it splits into a multi-turn step's turns by their counts).
        """
        with self._lock:
            charged, self._charged = self._charged, []
        return [f.result().seconds if f.done() and not f.cancelled() and f.exception() is None else 0.0
                for f in charged]

    def run_task(self, task: Task, code: str, run_timeout: Optional[float] = None) -> cf.Future:
        result: cf.Future = cf.Future()
        try:
            source = self._entry(task, code)
        except Exception as exc:  # still one entry per request (0 s): a multi-turn step splits them by turn
            source = cf.Future()
            source.set_exception(exc)
        with self._lock:
            self._charged.append(source)

        def done(future: cf.Future) -> None:
            if future.exception() is not None:
                result.set_exception(future.exception())
            else:
                result.set_result(future.result().outcome)

        source.add_done_callback(done)
        return result

    def entries(self, items: Iterable[tuple[Task, str]]) -> list[Entry]:
        """The entry of every (task, code), in order, executing each missing one once.

        The entries come from the executions' own futures: a future is done before its
        callbacks (which store the entry in the table) have run.
        """
        items = list(items)
        found: dict[tuple[str, str], Any] = {}
        for task, code in items:
            key = (task.name, code_key(code))
            if key not in found:
                found[key] = self.table.get(task, code) or self._entry(task, code)
        futures = [f for f in found.values() if isinstance(f, cf.Future)]
        cf.wait(futures)
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(futures)} executions failed; first: {failed[0]}")
        resolved = {k: (v.result() if isinstance(v, cf.Future) else v) for k, v in found.items()}
        return [resolved[(task.name, code_key(code))] for task, code in items]

    def fill(self, items: Iterable[tuple[Task, str]]) -> int:
        """Make sure every (task, code) has an entry (executing the missing ones); returns how many ran."""
        todo = {(t.name, code_key(c)): (t, c) for t, c in items if self.table.get(t, c) is None}
        self.entries(todo.values())
        return len(todo)

    def close(self) -> None:
        if self.sandboxes is not None:
            self.sandboxes.close()
