"""Policy health: the figures and the plain-words warnings, up to the trainer's log (status and /metrics: test_progress.py)."""

from __future__ import annotations

import logging

import pytest

from wmrl_trainer.health import HealthMonitor, distinct_per_group, problems
from wmrl_trainer.records import StepRecord


def test_distinct_per_group_counts_each_groups_distinct_scripts():
    assert distinct_per_group([["a", "a", "a", "a"], ["a", "b", "b", "c"]]) == 2.0
    assert distinct_per_group([]) is None


def _record(step, distinct=6.0, truncated=0.0, entropy=1.2):
    return StepRecord(step=step, mode="wmrl", distinct_per_group=distinct, truncated_share=truncated,
                      mean_completion_tokens=3.0, entropy=entropy)


def test_problems_name_what_is_wrong_in_plain_words():
    assert problems(_record(0), group_size=8) == []
    [collapsed] = problems(_record(0, distinct=1.0, entropy=0.01), group_size=8)
    assert "stopped exploring" in collapsed and "1.00 distinct scripts per group of 8" in collapsed
    assert "0.010 nats" in collapsed
    [endless] = problems(_record(0, truncated=0.75), group_size=8)
    assert "75% of completions ran into the token limit" in endless and "maxNewTokens" in endless
    assert problems(_record(0, distinct=1.0), group_size=1) == []  # a group of one has nothing to compare


def test_monitor_warns_once_after_patience_steps_and_once_when_it_clears():
    monitor = HealthMonitor(group_size=8, patience=2)
    records = [_record(0), _record(1, truncated=0.9), _record(2, truncated=0.9), _record(3, truncated=0.9),
               _record(4), _record(5)]
    messages = [monitor.check(r) for r in records]
    assert messages[0] is None and messages[1] is None  # one bad step is not yet a trend
    assert messages[2].startswith("step 3: generation is degenerating") and "token limit" in messages[2]
    assert messages[3] is None  # said once
    assert messages[4] == "step 5: generation is healthy again" and messages[5] is None
    assert [r.health_warning is not None for r in records] == [False, False, True, True, False, False]


def test_monitor_state_survives_a_restart():
    monitor = HealthMonitor(group_size=8)
    monitor.check(_record(0, distinct=1.0))
    resumed = HealthMonitor(group_size=8)
    resumed.load_state_dict(monitor.state_dict())
    assert resumed.check(_record(1, distinct=1.0)) is not None  # the streak carried over: 2 of 2


@pytest.mark.slow
def test_a_policy_that_never_finishes_is_reported_by_the_trainer(tmp_path, caplog):
    """A real TRL run whose completions are cut at 2 tokens (the tiny BPE model rarely stops): warned, in the log."""
    from test_grpo import run_config, tiny_policy
    from wmrl_scripted import ScriptedWorldModel, make_tasks
    from wmrl_trainer.build import build_trainer

    records = []
    config = run_config(tmp_path, "worldModel", steps=3, sampling={"maxNewTokens": 2})
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=ScriptedWorldModel(),
                            callbacks=[records.append])
    try:
        with caplog.at_level(logging.WARNING, logger="wmrl.trainer"):
            trainer.train()
    finally:
        trainer.close()
    assert all(r.truncated_share >= 0.5 for r in records)
    assert all(r.mean_completion_tokens == 2.0 for r in records)
    assert records[0].health_warning is None and records[1].health_warning is not None
    assert any("generation is degenerating" in m and "token limit" in m for m in caplog.messages)
    assert trainer.summary()["progress"]["health"]["warning"] == records[-1].health_warning
