"""Grade fidelity cases with a world model, case by case: what it predicted, and how long each took.

Each case is one ``grade`` call of its own (``(task, code, history)``), so its latency is that
call's wall time; ``concurrency`` calls run at once from a thread pool (a backend that serialises
its calls, like the transformers one, queues them: the latency then includes the wait). A
backend with a probe (llm) is probed first, outside any case's time. The compile gate decides
some cases without a model call: they are marked ``gated``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from wmrl.outcome import Outcome
from wmrl_trainer.fidelity.cases import Case, real_json
from wmrl_trainer.fidelity.judge import judged, prediction_json, ranked
from wmrl_trainer.fidelity.metrics import Judged
from wmrl_trainer.world_model.base import compile_gate


@dataclass
class Measured:
    """A backend's answers on a set of cases: the metrics' input, one JSON row per case, the backend's counters."""

    judged: list[Judged]
    rows: list[dict[str, Any]]
    stats: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _grade_one(world_model: Any, case: Case) -> tuple[Optional[Outcome], float]:
    started = time.perf_counter()
    [outcome] = world_model.grade([case.item])
    return outcome, time.perf_counter() - started


def measure(world_model: Any, cases: Sequence[Case], concurrency: int = 1) -> Measured:
    """Grade every case with ``world_model`` (see the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    probe = getattr(world_model, "probe", None)
    if callable(probe):
        probe()  # the guided mode is chosen once, before the first case's clock starts
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fidelity") as pool:
        answers = list(pool.map(lambda case: _grade_one(world_model, case), cases))
    seconds = time.perf_counter() - started
    out = Measured([], [], dict(getattr(world_model, "stats", {}) or {}), seconds)
    for case, (outcome, latency) in zip(cases, answers):
        gated = compile_gate(case.code) is not None
        out.judged.append(judged(case.real, outcome, gated=gated, latency=latency))
        out.rows.append({"where": case.where, "task": case.task.name, "source": case.source,
                         "real": {k: v for k, v in real_json(case.real).items() if k != "feedback"},
                         "predictions": [prediction_json(o) for o in ranked(outcome)],
                         "gated": gated, "latency_s": round(latency, 6)})
    return out
