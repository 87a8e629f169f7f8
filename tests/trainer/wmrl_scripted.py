"""A scripted world model and a scripted executor with KNOWN bias and noise (test helpers).

Every rollout's "true" quality is a deterministic function of its code text (a hash), so
the same code always gets the same real and world-model outcomes, in any process, in any
order: a resumed run sees exactly what an uninterrupted one saw.

* real reward: ``0.5 + 0.5 * q`` (a valid submission with rank score ``q``);
* world-model reward: ``0.5 + 0.5 * clip(q**2 + bias + noise * z)``: a monotone but
  non-affine bias (what isotonic debiasing can remove and GRPO's normalisation cannot)
  plus zero-mean noise ``z ~ N(0, 1)`` drawn from the code's hash.

The executor stands in for the sandbox pool where a test needs controlled failures or
latency (the real pool is exercised by the sandbox and local-run tests); the world model
stands in for an LLM, as issue 5 asks ("a scripted world model with known bias and noise").
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import threading
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task


def quality(code: str) -> float:
    digest = hashlib.blake2b(code.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _z(code: str) -> float:
    seed = int.from_bytes(hashlib.blake2b(b"noise\0" + code.encode(), digest_size=8).digest(), "little")
    return float(np.random.default_rng(seed).standard_normal())


def real_outcome(code: str) -> Outcome:
    return Outcome(status=Status.VALID, rank_score=quality(code))


class ScriptedWorldModel:
    """``grade`` -> biased, noisy valid outcomes; ``ungraded(code)`` -> None for chosen rows."""

    def __init__(self, noise: float = 0.05, bias: float = 0.0, ungraded: Callable[[str], bool] = lambda c: False):
        self.noise, self.bias, self.ungraded = noise, bias, ungraded
        self.observed: list[tuple[str, str, float]] = []
        self.histories: list[tuple] = []
        self.calls = 0

    def predicted_score(self, code: str) -> float:
        return float(np.clip(quality(code) ** 2 + self.bias + self.noise * _z(code), 0.0, 1.0))

    def grade(self, items: list[tuple]) -> list[Optional[Outcome]]:
        """Items are (task, code) or, for multi-turn trajectories, (task, code, history); histories are recorded."""
        self.calls += 1
        self.histories.extend(tuple(item[2]) if len(item) > 2 else () for item in items)
        return [None if self.ungraded(item[1]) else Outcome(status=Status.VALID, rank_score=self.predicted_score(item[1]),
                                                            feedback="scripted prediction")
                for item in items]

    def observe(self, task: Task, code: str, real: Outcome) -> None:
        self.observed.append((task.name, code, real.reward))

    def state_dict(self) -> dict:
        return {"observed": len(self.observed)}

    def load_state_dict(self, state: dict) -> None:
        self.observed = [("?", "?", float("nan"))] * int(state["observed"])


class ScriptedExecutor:
    """The dispatcher interface (``run_task``, ``demand``, ``close``) over a thread pool.

    ``fail(code)`` -> the execution raises (a sandbox that is down); executions submitted while
    ``release`` is an event stay busy until it is set (a slow sandbox that finishes when the
    test says so; assign a new event to hold later executions apart); ``slots`` concurrent
    executions.
    """

    def __init__(self, slots: int = 8, release: Optional[threading.Event] = None,
                 fail: Callable[[str], bool] = lambda c: False):
        self.pool = cf.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="scripted-sandbox")
        self.release, self.fail = release, fail
        self._lock = threading.Lock()
        self._demand = 0
        self.runs: list[str] = []

    def run_task(self, task: Task, code: str) -> cf.Future:
        release = self.release
        with self._lock:
            self._demand += 1
            self.runs.append(code)

        def run() -> Outcome:
            try:
                if release is not None:
                    release.wait()
                if self.fail(code):
                    raise ConnectionError("sandbox unreachable")
                return real_outcome(code)
            finally:
                with self._lock:
                    self._demand -= 1

        return self.pool.submit(run)

    @property
    def demand(self) -> int:
        return self._demand

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def save_turn_ending_policy(directory: Path) -> Path:
    """The tiny policy, with every token a stop token: every turn ends in one, so multi-turn
    trajectories reach later turns whatever the sampler draws (a turn cut off at maxNewTokens
    would end its trajectory)."""
    import json

    from wmrl_trainer.policy import save_tiny_model

    policy = save_tiny_model(directory)
    generation = json.loads((policy / "generation_config.json").read_text())
    vocabulary = json.loads((policy / "config.json").read_text())["vocab_size"]
    (policy / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": list(range(vocabulary))}))
    return policy


def make_tasks(n: int = 3) -> list[Task]:
    return [Task(name=f"task-{i}", description=f"scripted task {i}", kind="classification", metric="accuracy",
                 target="target", data={"train.csv": b"id,f0,target\n0,1,0\n"}, hidden_labels=b"id,target\n0,0\n")
            for i in range(n)]


class ClosingWorldModel(ScriptedWorldModel):
    """Leaves ``closed-<pid>`` in ``$WMRL_TEST_CLOSED_DIR`` when closed: the tests see that every process closed it."""

    def close(self) -> None:
        if os.environ.get("WMRL_TEST_CLOSED_DIR"):
            (Path(os.environ["WMRL_TEST_CLOSED_DIR"]) / f"closed-{os.getpid()}").touch()


def factory(spec, runtime) -> ScriptedWorldModel:
    """For ``wmrl train --world-model wmrl_scripted:factory`` (subprocess tests)."""
    return ClosingWorldModel(noise=0.1)


class FailingWorldModel(ScriptedWorldModel):
    """Grades the first batch, then raises: a world-model server gone mid-run."""

    def grade(self, items: list[tuple]) -> list[Optional[Outcome]]:
        if self.calls >= 1:
            raise RuntimeError("world model down")
        return super().grade(items)


def failing_factory(spec, runtime) -> FailingWorldModel:
    """For ``wmrl train --world-model wmrl_scripted:failing_factory``."""
    return FailingWorldModel(noise=0.1)
