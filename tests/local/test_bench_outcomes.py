"""The speedup benchmark's clock and outcome table: pure cost arithmetic, and a table filled by a REAL sandbox server."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.outcome import Outcome, Status
from wmrl_bench.cost import makespan, step_cost
from wmrl_bench.outcome_table import Entry, OutcomeTable, TableDispatcher, table_key
from wmrl_demo import solutions
from wmrl_demo.suite import SUITE_VERSION, builtin_suite

durations = st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=40)


@given(durations, st.integers(min_value=1, max_value=50))
def test_makespan_bounds(ds, slots):
    span = makespan(ds, slots)
    assert span >= max(ds, default=0.0) - 1e-9
    assert span >= sum(ds) / slots - 1e-9
    assert span <= sum(ds) + 1e-9


@given(durations)
def test_makespan_one_slot_is_the_sum_and_enough_slots_the_longest(ds):
    assert makespan(ds, 1) == pytest.approx(sum(ds))
    assert makespan(ds, max(1, len(ds))) == pytest.approx(max(ds, default=0.0))


def test_makespan_hands_work_to_the_first_free_slot_in_order():
    # 3 and 1 start together; 1 finishes first and takes the 2: ends at 3; the last 2 starts at 3.
    assert makespan([3, 1, 2, 2], 2) == 5
    with pytest.raises(ValueError):
        makespan([1.0], 0)


def _record(mode: str, rows: int = 32, generation: float = 0.4, total: float = 5.0, execution: float = 4.0) -> dict:
    return {"mode": mode, "rows": rows, "generation": generation, "total": total, "execution": execution}


def test_step_cost_charges_the_judge_only_for_world_model_grading():
    real = step_cost(_record("real"), [1.0] * 32, slots=2, judge_cost=1.0)
    assert real.judge == 0 and real.compute == pytest.approx(1.0) and real.executions == pytest.approx(16.0)
    wmrl = step_cost(_record("wmrl"), [1.0] * 8, slots=2, judge_cost=2.0)
    assert wmrl.judge == pytest.approx(2.0 * 0.4)  # every rollout graded: 2 x the generation cost
    assert wmrl.executions == pytest.approx(4.0) and wmrl.total == pytest.approx(1.0 + 0.8 + 4.0)
    assert step_cost(_record("worldModel"), [], slots=2, judge_cost=0.0).total == pytest.approx(1.0)


def test_a_multi_turn_step_pays_its_turns_one_after_another():
    record = {**_record("real", rows=4), "turns": {"executions_per_turn": [4, 2, 1]}}
    cost = step_cost(record, [1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 2.0], slots=4, judge_cost=0.0)
    assert cost.executions == pytest.approx(1.0 + 3.0 + 2.0)
    single = step_cost(_record("real", rows=7), [1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 2.0], slots=4, judge_cost=0.0)
    assert single.executions == pytest.approx(4.0)  # all at once: the 3 s one starts at 1 s


@pytest.fixture(scope="module")
def tasks():
    return {t.name: t for t in builtin_suite("mini-ml")}


def _script(*names: str) -> str:
    return solutions.render([solutions.BY_NAME[n] for n in names])


def test_table_persists_and_ignores_a_cut_off_line(tmp_path, tasks):
    path = tmp_path / "t.jsonl"
    table = OutcomeTable(path)
    iris = tasks["iris"]
    entry = Entry(Outcome(status=Status.RUNTIME_ERR, error_type="ValueError"), 0.7)
    table.put(iris, "print(1)", entry)
    table.put(iris, "print(1)", Entry(Outcome(status=Status.SYNTAX_ERR), 9.0))  # first one wins
    with open(path, "a") as out:
        out.write('{"task": "iris", "code": "abc", "sec')  # a crash mid-line
    again = OutcomeTable(path)
    assert len(again) == 1 and again.get(iris, "print(1)") == entry
    assert again.get(tasks["wine"], "print(1)") is None


def test_table_key_changes_with_the_suite_and_the_start(tasks):
    base = table_key(tasks.values(), SUITE_VERSION, True, 60)
    assert table_key(tasks.values(), SUITE_VERSION, True, 60.0) == base
    assert table_key(tasks.values(), SUITE_VERSION + "x", True, 60) != base
    assert table_key([t for n, t in tasks.items() if n != "iris"], SUITE_VERSION, True, 60) != base
    assert table_key(tasks.values(), SUITE_VERSION, False, 60) != base  # cold starts take other times
    assert table_key(tasks.values(), SUITE_VERSION, True, 10) != base  # a script may time out under 10 s only


def test_misses_run_once_on_a_real_sandbox_then_hit(tmp_path, tasks):
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_trainer.services import LocalServices

    iris = tasks["iris"]
    good, bad = _script("load", "logreg"), _script("load_wrong_path", "logreg")
    table = OutcomeTable(tmp_path / "t.jsonl")
    with LocalServices(1, tmp_path / "logs") as services:
        dispatcher = TableDispatcher(table, SandboxDispatcher(StaticEndpoints(services.sandbox_urls), timeout=90))
        try:
            futures = [dispatcher.run_task(iris, good) for _ in range(3)] + [dispatcher.run_task(iris, bad)]
            outcomes = [f.result(timeout=120) for f in futures]
        finally:
            dispatcher.close()
    assert outcomes[0].status is Status.VALID and outcomes[0] == outcomes[1] == outcomes[2]
    assert outcomes[3].status is Status.RUNTIME_ERR
    assert len(table) == 2 and len(Path(table.path).read_text().splitlines()) == 2  # 3 asks, one execution
    durations = dispatcher.take_durations()
    assert len(durations) == 4 and all(d > 0 for d in durations) and durations[0] == durations[1]
    assert dispatcher.take_durations() == []
    # A new dispatcher without sandboxes answers from the table alone, and says what it lacks.
    offline = TableDispatcher(OutcomeTable(table.path))
    assert offline.run_task(iris, good).result(timeout=1) == outcomes[0] and offline.hits == 1
    missing = offline.run_task(iris, _script("load", "svc"))  # fails as a future, like a failed execution
    with pytest.raises(KeyError, match="no sandboxes"):
        missing.result(timeout=1)
    assert offline.take_durations() == [durations[0], 0.0]  # one entry per request, the failed one free


def test_entries_come_back_in_order_from_the_executions_themselves(tmp_path, tasks):
    """``entries`` answers a batch with repeats and misses in order; each distinct miss runs once, and its
    entry is there as soon as the execution is (a future is done before its storing callback has run)."""
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_trainer.services import LocalServices

    iris, wine = tasks["iris"], tasks["wine"]
    good, bad = _script("load", "logreg"), _script("load_syntax_error", "logreg")
    table = OutcomeTable(tmp_path / "t.jsonl")
    with LocalServices(1, tmp_path / "logs") as services:
        dispatcher = TableDispatcher(table, SandboxDispatcher(StaticEndpoints(services.sandbox_urls), timeout=90))
        try:
            batch = [(iris, good), (wine, good), (iris, good), (iris, bad), (wine, good)]
            entries = dispatcher.entries(batch)
            again = dispatcher.entries(batch)
        finally:
            dispatcher.close()
    statuses = [e.outcome.status for e in entries]
    assert statuses == [Status.VALID, Status.VALID, Status.VALID, Status.SYNTAX_ERR, Status.VALID]
    assert entries[0] == entries[2] and entries[1] == entries[4] and again == entries
    assert dispatcher.misses == 3 and len(Path(table.path).read_text().splitlines()) == 3


def test_concurrent_writers_keep_every_line_whole(tmp_path, tasks):
    table = OutcomeTable(tmp_path / "t.jsonl")
    iris = tasks["iris"]

    def write(start: int) -> None:
        for i in range(start, start + 50):
            table.put(iris, f"print({i})", Entry(Outcome(status=Status.RAN_NO_SUB), float(i)))

    threads = [threading.Thread(target=write, args=(k * 50,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = Path(table.path).read_text().splitlines()
    assert len(lines) == 200 and all(json.loads(line)["task"] == "iris" for line in lines)
    assert len(OutcomeTable(table.path)) == 200


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=6))
def test_curves_hold_after_their_last_evaluation(rewards):
    from wmrl_bench.analysis import at_cost

    run = {"curve": [{"cost_s": {"2": 10.0 * i, "8": 4.0 * i}, "reward": r, "executions": 8 * i}
                     for i, r in enumerate(rewards)]}
    for pool, per in (("2", 10.0), ("8", 4.0)):
        values = [at_cost(run, pool, x) for x in np.linspace(0, per * (len(rewards) + 3), 17)]
        assert values[-1] == pytest.approx(rewards[-1]) and values[0] == pytest.approx(rewards[0])
        assert min(rewards) - 1e-12 <= min(values) and max(values) <= max(rewards) + 1e-12
        assert at_cost(run, pool, per) == pytest.approx(rewards[1])  # each pool reads its own clock
