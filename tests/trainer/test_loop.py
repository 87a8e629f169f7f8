"""The WMRL step without TRL: calibration, anchors, weights, ungraded rows, degradation."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
import pytest

from subprocesses import CalibrationServer
from wmrl.anchors import AnchorSelector
from wmrl.api.schema import AlgorithmSpec
from wmrl.calibration.client import CalibrationClient, LocalCalibration
from wmrl.calibration.state import CalibrationConfig
from wmrl.debias import CalibrationMap, apply_map
from wmrl_trainer.loop import WMRLStep, extract_code
from wmrl_scripted import ScriptedExecutor, ScriptedWorldModel, make_tasks, quality

G, B = 8, 8


def algorithm(**kw) -> AlgorithmSpec:
    return AlgorithmSpec.model_validate({"groupSize": G, "groupsPerStep": B, **kw})


def calibration(**kw) -> LocalCalibration:
    base = dict(min_pairs=64, refit_every=32, warmup=8, half_life=16.0)
    base.update(kw)
    return LocalCalibration(CalibrationConfig(**base))


def codes_for(step: int) -> list[list[str]]:
    return [[f"step{step}-group{g}-row{i}" for i in range(G)] for g in range(B)]


def wmrl_step(mode="wmrl", wm=None, executor=None, cal=None, fraction=0.25, alg=None, **kw) -> WMRLStep:
    alg = alg or algorithm()
    return WMRLStep(mode, alg, world_model=wm or ScriptedWorldModel(), dispatcher=executor or ScriptedExecutor(),
                    calibration=cal if cal is not None else calibration(),
                    selector=AnchorSelector(fraction, 1, 16, seed=0), **kw)


def run(step: WMRLStep, n: int, start: int = 0):
    tasks = make_tasks(B)
    return [step.score(step.submit(s, tasks, codes_for(s))) for s in range(start, start + n)]


def real_rewards(step: int) -> np.ndarray:
    return np.array([[0.5 + 0.5 * quality(c) for c in group] for group in codes_for(step)])


@pytest.fixture
def sandbox_gates():
    """``sandbox_gates()`` -> a new event for ``ScriptedExecutor(release=...)``; all are set at teardown."""
    made = []

    def new_gate() -> threading.Event:
        made.append(threading.Event())
        return made[-1]

    yield new_gate
    for gate in made:
        gate.set()


def test_extract_code_takes_the_first_fenced_block_or_everything():
    assert extract_code("Here:\n```python\nprint(1)\n```\nbye") == "print(1)\n"
    assert extract_code("```\nx = 2\n") == "x = 2\n"  # cut off at the token limit
    assert extract_code("import os\nprint(os.sep)") == "import os\nprint(os.sep)"


def test_anchor_groups_get_real_rewards_and_the_rest_calibrated_world_model_rewards():
    step = wmrl_step()
    scored = run(step, 1)[0]
    assert scored.anchor_groups == AnchorSelector(0.25, 1, 16, seed=0).select(0, B)
    real = real_rewards(0)
    for g in range(B):
        expected = real[g] if g in scored.anchor_groups else scored.calibrated[g]
        np.testing.assert_allclose(scored.rewards[g], expected)
    assert np.isnan(scored.real[[g for g in range(B) if g not in scored.anchor_groups]]).all()
    assert scored.record.executions == len(scored.anchor_groups) * G
    assert scored.record.anchor_fraction == len(scored.anchor_groups) / B


def test_calibrated_rewards_converge_to_the_real_ones():
    wm = ScriptedWorldModel(noise=0.02)
    step = wmrl_step(wm=wm, fraction=0.5)
    records = run(step, 30)
    real = real_rewards(999)
    first, last = records[0], records[-1]
    # Score a fresh batch with the final map: calibrated WM rewards are close to the real ones.
    final = step.score(step.submit(999, make_tasks(B), codes_for(999)))
    raw_error = np.nanmean(np.abs(final.world_model - real))
    calibrated_error = np.nanmean(np.abs(final.calibrated - real))
    assert raw_error > 0.05
    assert calibrated_error < raw_error / 2
    assert last.record.bias_reduction is not None and last.record.bias_reduction > 0.2
    assert first.record.bias_reduction is None


def test_weight_rises_with_the_noise_and_falls_without_it():
    def weight_after_switch(noise_before: float, noise_after: float) -> float:
        wm = ScriptedWorldModel(noise=noise_before)
        step = wmrl_step(wm=wm, fraction=0.5)
        run(step, 12)
        assert step.calibration.weight == pytest.approx(2.0, rel=0.25)  # frozen at the target after warm-up
        wm.noise = noise_after
        return run(step, 20, start=12)[-1].record.weight

    assert weight_after_switch(0.05, 0.4) > 2.5
    assert weight_after_switch(0.3, 0.02) < 1.5


def test_denoising_off_gives_weight_one_and_debiasing_off_gives_raw_rewards():
    alg = algorithm(denoising={"enabled": False}, debiasing={"enabled": False})
    step = wmrl_step(alg=alg, fraction=0.5)
    records = run(step, 20)
    assert all(r.record.weight == 1.0 for r in records)
    last = records[-1]
    non_anchor = [g for g in range(B) if g not in last.anchor_groups]
    np.testing.assert_allclose(last.rewards[non_anchor], last.world_model[non_anchor])


def test_world_model_ungraded_rows_stay_nan_and_are_counted():
    wm = ScriptedWorldModel(ungraded=lambda code: code.endswith("row3"))
    scored = run(wmrl_step(wm=wm), 1)[0]
    non_anchor = [g for g in range(B) if g not in scored.anchor_groups]
    assert np.isnan(scored.rewards[non_anchor, 3]).all()
    assert not np.isnan(scored.rewards[scored.anchor_groups]).any()  # real execution graded them
    assert scored.record.ungraded == len(non_anchor)


def test_failed_anchor_executions_drop_the_group_not_the_step():
    executor = ScriptedExecutor(fail=lambda code: "group" in code and code.split("-")[1] in ("group0", "group1", "group2"))
    step = wmrl_step(executor=executor, fraction=1.0)
    scored = run(step, 1)[0]
    assert scored.record.dropped_anchors == 3
    assert scored.anchor_groups == list(range(3, B))
    np.testing.assert_allclose(scored.rewards[:3], scored.calibrated[:3])


def test_sandboxes_slower_than_the_deadline_are_abandoned(sandbox_gates):
    """The executions never finish while the step waits: it returns at the deadline without them."""
    executor = ScriptedExecutor(slots=64, release=sandbox_gates())
    step = wmrl_step(executor=executor, execution_timeout=0.3)
    pending = step.submit(0, make_tasks(B), codes_for(0))
    scored = step.score(pending)
    assert pending.anchors and scored.anchor_groups == []
    assert scored.record.dropped_anchors == len(pending.anchors) and scored.record.late_anchors == 0
    np.testing.assert_allclose(scored.rewards, scored.calibrated)  # every group on world-model rewards
    assert not np.isnan(scored.rewards).any()
    executor.close()


def test_real_mode_executes_everything_and_failures_are_ungraded():
    executor = ScriptedExecutor(fail=lambda code: code.endswith("row0"))
    step = WMRLStep("real", algorithm(), dispatcher=executor)
    scored = run(step, 1)[0]
    assert scored.record.executions == B * G
    assert np.isnan(scored.rewards[:, 0]).all() and not np.isnan(scored.rewards[:, 1:]).any()
    assert scored.anchor_groups == []  # nothing is up-weighted in the baseline
    assert scored.record.mean_world_model_reward is None


def test_world_model_mode_never_executes():
    executor = ScriptedExecutor()
    step = WMRLStep("worldModel", algorithm(), world_model=ScriptedWorldModel(), dispatcher=executor)
    scored = run(step, 2)[-1]
    assert executor.runs == [] and scored.record.executions == 0
    np.testing.assert_allclose(scored.rewards, scored.world_model)


def test_learned_world_model_observes_real_outcomes_of_anchor_rows():
    wm = ScriptedWorldModel()
    scored = run(wmrl_step(wm=wm), 1)[0]
    assert len(wm.observed) == len(scored.anchor_groups) * G
    assert {code.split("-")[1] for _, code, _ in wm.observed} == {f"group{g}" for g in scored.anchor_groups}


def test_calibration_service_that_goes_down_keeps_training_on_the_last_map(tmp_path):
    service = CalibrationServer(["--state-file", str(tmp_path / "calibration.json"), "--min-pairs", "16",
                                 "--refit-every", "16"], log_path=tmp_path / "calibration.log").start()
    client = CalibrationClient(service.url, "test-loop")
    try:
        step = wmrl_step(cal=client, fraction=0.5)
        run(step, 1)
        assert client.flush(timeout=60)  # the service folded step 0's anchors and answered with its map
        last_map = client.view()["map"]
        assert last_map is not None
        service.kill9()
        down = run(step, 1, start=1)
        assert not client.flush(timeout=2)  # nobody acknowledges step 1's anchors now
        assert "POST /v1/observations" in client.last_error
        down += run(step, 1, start=2)
        assert client.view()["map"] == last_map
        assert client.pending_groups == sum(len(s.anchor_groups) for s in down)  # kept for when it is back
        for scored in down:
            others = [g for g in range(B) if g not in scored.anchor_groups]
            expected = apply_map(CalibrationMap.from_json(last_map), scored.world_model[others])
            np.testing.assert_allclose(scored.rewards[others], expected)
            assert not np.allclose(expected, scored.world_model[others])  # the map is not the identity
            anchors = scored.anchor_groups
            np.testing.assert_allclose(scored.rewards[anchors], real_rewards(scored.record.step)[anchors])
        first, second = (s.record.calibration_stale_seconds for s in down)
        assert first is not None and second > first  # no answer since the map: the staleness keeps growing
    finally:
        client.close(timeout=0)
        service.stop()


def test_a_mode_missing_its_parts_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="spec.worldModel"):
        WMRLStep("wmrl", algorithm(), dispatcher=ScriptedExecutor(), calibration=calibration(),
                 selector=AnchorSelector())
    with pytest.raises(ValueError, match="sandbox"):
        WMRLStep("real", algorithm())


def test_late_anchors_train_on_world_model_rewards_and_reach_calibration_when_done(sandbox_gates):
    first_gate = sandbox_gates()
    executor = ScriptedExecutor(slots=64, release=first_gate)
    cal = calibration()
    step = wmrl_step(executor=executor, cal=cal, anchor_wait=0.0, fraction=0.5)
    tasks = make_tasks(B)
    first_pending = step.submit(0, tasks, codes_for(0))
    first = step.score(first_pending)  # its sandboxes are still busy: the trainer goes on without them
    assert first.anchor_groups == [] and first.record.late_anchors == 4
    np.testing.assert_allclose(first.rewards, first.calibrated)
    assert cal.view()["pairsSeen"] == 0 and step.world_model.observed == []
    executor.release = sandbox_gates()  # step 1's own executions stay busy: only step 0's can be folded
    first_gate.set()  # step 0's executions finish while the trainer does other work
    cf.wait(list(first_pending.executions.values()))
    second = step.score(step.submit(1, tasks, codes_for(1)))
    assert second.record.late_folded == 4 and second.record.late_anchors == 4 and second.record.dropped_anchors == 0
    assert cal.view()["pairsSeen"] == 4 * G
    late_codes = {code for g in first_pending.anchors for code in codes_for(0)[g]}
    assert {code for _, code, _ in step.world_model.observed} == late_codes
    executor.close()


def test_the_step_waits_through_its_waits_object():
    """How long a step waits and whether a late group has finished are ``waits``' to say (the benchmark's clock
    is virtual): here every execution is done at once, yet the waits object keeps step 0's late until step 2."""

    class Scripted:
        def __init__(self):
            self.calls = []

        def running_after(self, executions, wait):
            cf.wait(list(executions.values()))
            self.calls.append(("wait", len(executions), wait))
            return set(executions) if len(self.calls) == 1 else set()

        def finished(self, futures):
            self.calls.append(("finished", len(futures)))
            return sum(call[0] == "wait" for call in self.calls) >= 3  # from step 2 on

    waits = Scripted()
    step = wmrl_step(anchor_wait=0.5, fraction=0.25, waits=waits)
    first, second, third = run(step, 3)
    assert first.late_groups and not second.arrivals and second.anchor_groups
    assert [(a.step, a.group) for a in third.arrivals] == [(0, g) for g in first.late_groups]
    assert waits.calls[0] == ("wait", G * len(first.late_groups), 0.5)


def test_anchor_wait_long_enough_uses_real_rewards_as_usual(sandbox_gates):
    """The sandboxes finish only once the world model is done: the step waits for them, as asked."""
    release = sandbox_gates()

    class ReleasesTheSandboxesWhenDone(ScriptedWorldModel):
        def grade(self, items):
            outcomes = super().grade(items)
            release.set()
            return outcomes

    step = wmrl_step(wm=ReleasesTheSandboxesWhenDone(), executor=ScriptedExecutor(slots=64, release=release),
                     anchor_wait=60.0)
    scored = run(step, 1)[0]
    assert scored.anchor_groups and scored.record.late_anchors == 0 and scored.record.dropped_anchors == 0
    np.testing.assert_allclose(scored.rewards[scored.anchor_groups], real_rewards(0)[scored.anchor_groups])


# ---------------------------------------------------------------- failed rows of an anchor group


class RecordingCalibration(LocalCalibration):
    """A local calibration that records every ``observe`` payload and can force the anchor weight."""

    def __init__(self, config: CalibrationConfig = CalibrationConfig(), weight: float | None = None):
        super().__init__(config)
        self.payloads: list[list[dict]] = []
        self.forced_weight = weight

    def observe(self, groups):
        self.payloads.append(groups)
        super().observe(groups)

    @property
    def weight(self) -> float:
        return super().weight if self.forced_weight is None else self.forced_weight


def _row_fails(groups_rows: dict[str, set[str]]):
    """``fail(code)`` for ScriptedExecutor: the rows (``"row3"``, or ``"*"`` for all) of the named groups."""
    def fail(code: str) -> bool:
        _, group, row = code.split("-")
        rows = groups_rows.get(group, set())
        return "*" in rows or row in rows
    return fail


def test_an_anchor_group_with_failed_rows_keeps_its_other_rows():
    executor = ScriptedExecutor(fail=_row_fails({"group0": {"row3"}, "group1": {"row0", "row5"}, "group2": {"*"}}))
    cal = RecordingCalibration(weight=3.0)
    step = wmrl_step(executor=executor, cal=cal, fraction=1.0)
    scored = run(step, 1)[0]
    real = real_rewards(0)
    failed = {(0, 3), (1, 0), (1, 5)}

    # group 2 (no row executed) is the only group dropped; groups 0 and 1 stay anchors
    assert scored.anchor_groups == [0, 1, *range(3, B)]
    assert scored.record.dropped_anchors == 1 and scored.record.anchor_groups == B - 1
    assert scored.record.failed_executions == len(failed) + G and scored.record.executions == B * G
    np.testing.assert_allclose(scored.rewards[2], scored.calibrated[2])  # dropped: on world-model rewards
    for g in scored.anchor_groups:
        for i in range(G):
            if (g, i) in failed:
                assert np.isnan(scored.rewards[g, i]) and np.isnan(scored.real[g, i])  # ungraded, not WM
            else:
                assert scored.rewards[g, i] == pytest.approx(real[g, i])
    assert scored.record.ungraded == len(failed)

    # only executed rows give pairs; a group's pairs stay together as one group; group 2 sends none
    (payload,) = cal.payloads
    assert [p["task"] for p in payload] == [f"task-{g}" for g in scored.anchor_groups]
    by_task = {p["task"]: p for p in payload}
    ok0 = [i for i in range(G) if i != 3]
    np.testing.assert_allclose(by_task["task-0"]["wm"], scored.world_model[0, ok0])
    np.testing.assert_allclose(by_task["task-0"]["env"], real[0, ok0])
    assert len(by_task["task-1"]["wm"]) == len(by_task["task-1"]["env"]) == G - 2
    assert all(not np.isnan(v) for p in payload for side in ("wm", "env") for v in p[side])
    assert cal.view()["pairsSeen"] == (B - 1) * G - len(failed)

    # the learned world model observes only real outcomes
    observed = {code for _, code, _ in step.world_model.observed}
    expected = {codes_for(0)[g][i] for g in scored.anchor_groups for i in range(G) if (g, i) not in failed}
    assert observed == expected


def test_the_anchor_weight_reaches_only_graded_anchor_rows():
    from wmrl.advantages import grpo_advantages
    from wmrl_trainer.grpo import wmrl_advantages

    executor = ScriptedExecutor(fail=_row_fails({"group0": {"row3"}, "group1": {"*"}}))
    step = wmrl_step(executor=executor, cal=RecordingCalibration(weight=3.0), fraction=1.0)
    scored = run(step, 1)[0]
    assert scored.weight == 3.0 and scored.anchor_groups == [0, *range(2, B)]
    advantages, graded = wmrl_advantages(scored)
    advantages, graded = advantages.reshape(B, G), graded.reshape(B, G)
    plain = grpo_advantages(scored.rewards)
    assert not graded[0, 3] and advantages[0, 3] == 0.0  # the failed row: out of the loss, never weighted
    assert graded.sum() == B * G - 1
    rows = [i for i in range(G) if i != 3]
    np.testing.assert_allclose(advantages[0, rows], 3.0 * plain[0, rows])  # normalised over its 7 graded rows
    np.testing.assert_allclose(advantages[1], plain[1])  # the dropped group: world-model rewards, weight 1
    np.testing.assert_allclose(advantages[2:], 3.0 * plain[2:])


def test_late_anchor_groups_keep_their_executed_rows(sandbox_gates):
    first_gate = sandbox_gates()
    executor = ScriptedExecutor(slots=64, release=first_gate)  # ``fail`` is read when an execution runs
    cal = RecordingCalibration()
    step = wmrl_step(executor=executor, cal=cal, anchor_wait=0.0, fraction=0.5)
    tasks = make_tasks(B)
    first_pending = step.submit(0, tasks, codes_for(0))
    first = step.score(first_pending)
    late = first_pending.anchors
    assert first.record.late_anchors == len(late) == 4
    # step 0's executions: the first late group loses row 1 only, the other late groups lose every row
    fail = _row_fails({f"group{late[0]}": {"row1"}, **{f"group{g}": {"*"} for g in late[1:]}})
    executor.fail = lambda code: code.startswith("step0-") and fail(code)
    executor.release = sandbox_gates()
    first_gate.set()
    cf.wait(list(first_pending.executions.values()))
    second = step.score(step.submit(1, tasks, codes_for(1)))
    assert second.record.late_folded == 1 and second.record.dropped_anchors == 3
    # the trainer hears of both: the group that arrived (real rewards, NaN on the failed row) and those given up
    [arrival] = second.arrivals
    assert (arrival.step, arrival.group) == (0, late[0]) and np.isnan(arrival.real[1])
    np.testing.assert_allclose(np.delete(arrival.real, 1), np.delete(real_rewards(0)[late[0]], 1))
    assert sorted(second.late_expired) == [(0, g) for g in sorted(late[1:])]
    (payload,) = cal.payloads
    assert payload == [{"task": f"task-{late[0]}",
                        "wm": [first.world_model[late[0], i] for i in range(G) if i != 1],
                        "env": [real_rewards(0)[late[0], i] for i in range(G) if i != 1]}]
    observed = {code for _, code, _ in step.world_model.observed}
    assert observed == {codes_for(0)[late[0]][i] for i in range(G) if i != 1}
    executor.close()


# ---------------------------------------------------------------- disagreement on the scores trained on


class AffineWorldModel(ScriptedWorldModel):
    """World-model reward = 0.5 * real + 0.4: a constant monotone bias, no noise."""

    def predicted_score(self, code: str) -> float:
        real = 0.5 + 0.5 * quality(code)
        return 2.0 * (0.5 * real + 0.4) - 1.0  # the rank score whose ladder reward is 0.5 * real + 0.4


def _disagreement_after(alg, steps: int = 16) -> LocalCalibration:
    import dataclasses

    config = dataclasses.replace(CalibrationConfig.from_spec(alg), min_pairs=64, refit_every=32, warmup=8,
                                 half_life=16.0)
    cal = LocalCalibration(config)
    step = wmrl_step(wm=AffineWorldModel(), cal=cal, alg=alg, fraction=0.5)
    records = run(step, steps)
    last = records[-1]
    scored_on = last.calibrated if alg.debiasing.enabled else last.world_model
    np.testing.assert_allclose(last.rewards[[g for g in range(B) if g not in last.anchor_groups]],
                               scored_on[[g for g in range(B) if g not in last.anchor_groups]])
    return cal


def test_debiasing_off_measures_the_disagreement_of_raw_world_model_rewards():
    cal = _disagreement_after(algorithm(debiasing={"enabled": False}))
    view = cal.view()
    assert view["map"] is not None  # still fitted and reported, only not applied
    # centred(0.5 r + 0.4) - centred(r) = -0.5 centred(r): s^2 = 0.25 in every group
    assert view["disagreement"] == pytest.approx(0.25, abs=1e-4)
    assert view["weight"] == pytest.approx(2.0, abs=1e-3)  # frozen at the target, raw disagreement unchanged


def test_debiasing_on_measures_the_disagreement_after_calibration():
    cal = _disagreement_after(algorithm())
    view = cal.view()
    assert view["map"] is not None
    assert view["disagreement"] < 0.1  # the map removes most of the bias the raw scores carry (0.25)
    assert view["config"].get("debiasingEnabled", True) is True


def test_a_calibration_measuring_other_scores_is_reported(caplog):
    alg = algorithm(debiasing={"enabled": False})
    step = wmrl_step(alg=alg, cal=calibration(debiasing_enabled=True))
    with caplog.at_level("WARNING", logger="wmrl.trainer.loop"):
        run(step, 2)
    assert sum("measures the anchor disagreement on calibrated" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    step = wmrl_step(alg=alg, cal=calibration(debiasing_enabled=False))
    with caplog.at_level("WARNING", logger="wmrl.trainer.loop"):
        run(step, 2)
    assert not any("anchor disagreement" in r.getMessage() for r in caplog.records)
