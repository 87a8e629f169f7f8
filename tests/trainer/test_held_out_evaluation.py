"""Held-out evaluation during training (spec.evaluation): the builtin tiny coder, graded by REAL
local sandbox servers (``wmrl sandbox serve`` subprocesses), reported to status, metrics, the
step log and a per-task report on the checkpoint volume; partial when the sandbox goes away."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from wmrl.api.crd import PRINTER_COLUMNS, crd
from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec, field_errors, parse_spec
from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task
from wmrl_trainer.evaluation import BoundedGrader, summarize, single_turn_trajectories
from wmrl_trainer.progress import TrainerMetrics
from wmrl_trainer.services import LocalServices, free_port

BASE = {
    "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
    "worldModel": {"backend": "learned"},
    "tasks": {"builtin": "mini-ml", "heldOut": ["iris"]},
    "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 3, "learningRate": 0.002, "klBeta": 0.0,
                  "maxTurns": 1, "entropyCoef": 0.0, "anchors": {"fraction": 0.5, "minPerStep": 1}},
    "sandbox": {"timeoutSeconds": 60},
    "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": 100}},
}


def _config(tmp_path: Path, urls, mode="wmrl", evaluation=None, steps=3) -> RunConfig:
    spec = json.loads(json.dumps(BASE))
    spec["mode"] = mode
    spec["algorithm"]["steps"] = steps
    spec["evaluation"] = evaluation or {"intervalSteps": 2, "samples": 3, "maxConcurrent": 2}
    return RunConfig(metadata=RunMetadata(name="t"), spec=WMRLRunSpec.model_validate(spec),
                     runtime=Runtime(sandbox_urls=list(urls), checkpoint_dir=str(tmp_path / "ckpt"),
                                     patch_status=False, metrics_port=None))


def _train(config, callbacks=(), metrics=None):
    from wmrl_trainer.build import build_trainer

    trainer = build_trainer(config, callbacks=callbacks)
    if metrics is not None:
        trainer.reporter.metrics = metrics
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


# ---------------------------------------------------------------- the whole path, real sandboxes

@pytest.mark.slow
def test_held_out_is_evaluated_at_interval_steps_and_at_the_end_by_real_execution(tmp_path, capsys):
    metrics = TrainerMetrics()
    with LocalServices(1, tmp_path / "logs") as services:
        trainer = _train(_config(tmp_path, services.sandbox_urls), metrics=metrics)
    # steps 1..3, intervalSteps 2: after step 2 and after the last one, never after step 1
    reports = sorted((tmp_path / "ckpt" / "eval").iterdir())
    assert [p.name for p in reports] == ["step-2.json", "step-3.json"]
    points = [json.loads(p.read_text()) for p in reports]
    for point in points:
        assert point["complete"] and point["partial"] is None
        iris = point["tasks"]["iris"]
        assert iris["samples"] == iris["graded"] == 3 == point["samples"]
        assert 0.0 <= iris["mean_reward"] <= 1.0 and 0.0 <= iris["valid_rate"] <= 1.0
        assert point["reward"] == pytest.approx(iris["mean_reward"])  # one task: the pooled mean is its mean
        if iris["valid_rate"] > 0:  # a valid run scored on the leaderboard: its reward is 0.5 + 0.5 x position
            assert 0.0 <= iris["best_position"] <= 1.0
            assert iris["mean_reward"] <= 0.5 + 0.5 * iris["best_position"] + 1e-9
        assert 1 <= point["executed"] <= 3 and point["eval_seconds"] > 0
        assert point["temperature"] == 1.0 and point["samples_per_task"] == 3
        assert point["tasks"]["iris"]["category"] == "tabular" and point["by_category"]["tabular"]["tasks"] == 1
    # What training had spent by each evaluation (CPU: trainer seconds, no GPU-hours), for curves over compute.
    step_seconds = [r.total for r in trainer.records]
    assert [p["compute"]["train_seconds"] for p in points] == [pytest.approx(sum(step_seconds[:2])),
                                                               pytest.approx(sum(step_seconds))]
    assert all(p["compute"]["gpus"] == 0 and p["compute"]["gpu_hours"] is None for p in points)
    assert points[-1]["compute"]["executions"] == sum(r.executions for r in trainer.records)
    # The reporter holds the last complete one, and status.progress carries it.
    assert trainer.reporter.held_out_reward == pytest.approx(points[-1]["reward"])
    wire = trainer.reporter.last.to_wire()
    assert wire["heldOutReward"] == pytest.approx(points[-1]["reward"])
    held = wire["heldOut"]
    assert held["step"] == 3 and held["evaluations"] == 2 and held["samples"] == 3 and "partial" not in held
    assert held["report"] == str(reports[-1])
    # Evaluation cost is apart from training's: training's executions are the anchors' only.
    assert held["executions"] == sum(p["executed"] for p in points)
    assert wire["executions"] == sum(r.executions for r in trainer.records)
    assert held["seconds"] == pytest.approx(sum(p["eval_seconds"] for p in points), abs=1e-3)
    # The step log line says it: held_out_reward on every step, the evaluation on the steps that ran one.
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"event": "step"')]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["held_out_reward"] is None and "evaluation" not in steps[0]
    assert steps[1]["evaluation"]["step"] == 2 and steps[1]["held_out_reward"] == pytest.approx(points[0]["reward"])
    assert steps[2]["evaluation"]["report"] == str(reports[-1])
    # Prometheus.
    text = _metrics_text(metrics)
    assert f"wmrl_trainer_held_out_reward {points[-1]['reward']}" in text
    assert 'wmrl_trainer_evaluations_total{result="complete"} 2.0' in text
    assert "wmrl_trainer_held_out_partial 0.0" in text


def _metrics_text(metrics: TrainerMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


@pytest.mark.slow
def test_a_sandbox_that_goes_down_makes_the_evaluation_partial_and_keeps_the_last_complete_reward(tmp_path):
    """Mode worldModel (training never executes): the dispatcher exists for the evaluation only. The
    real sandbox server is stopped after step 1's evaluation; step 2's is partial, with the reason."""
    with LocalServices(1, tmp_path / "logs") as services:
        def stop_sandbox(record):
            if record.step == 0:  # called after step 1's report, which follows its evaluation
                services.stop(services.sandboxes[0])

        config = _config(tmp_path, services.sandbox_urls, mode="worldModel", steps=2,
                         evaluation={"intervalSteps": 1, "samples": 2})
        started = time.perf_counter()
        trainer = _train(config, callbacks=[stop_sandbox])
        elapsed = time.perf_counter() - started
    first = json.loads((tmp_path / "ckpt" / "eval" / "step-1.json").read_text())
    second = json.loads((tmp_path / "ckpt" / "eval" / "step-2.json").read_text())
    assert first["complete"] and first["reward"] is not None
    assert not second["complete"] and second["reward"] is None
    assert "failed" in second["partial"] and ("SandboxUnavailable" in second["partial"] or "Connect" in second["partial"])
    assert trainer.reporter.held_out_reward == pytest.approx(first["reward"])  # never the partial one
    held = trainer.reporter.last.to_wire()["heldOut"]
    assert held["step"] == 1 and held["partial"].startswith("step 2: ") and held["evaluations"] == 2
    assert elapsed < 120  # a dead sandbox fails the evaluation fast (dispatcher retries), it does not hang


@pytest.mark.slow
def test_a_closed_port_is_partial_from_the_first_evaluation(tmp_path):
    config = _config(tmp_path, [f"http://127.0.0.1:{free_port()}"], mode="worldModel", steps=1,
                     evaluation={"samples": 2})
    trainer = _train(config)
    point = json.loads((tmp_path / "ckpt" / "eval" / "step-1.json").read_text())
    assert point["complete"] is False and point["reward"] is None and point["partial"]
    assert point["executed"] >= 1 and point["failed_executions"] >= 1
    assert trainer.reporter.held_out_reward is None
    wire = trainer.reporter.last.to_wire()
    assert "heldOutReward" not in wire and wire["heldOut"]["partial"].startswith("step 1: ")


# ---------------------------------------------------------------- the pure part and the bound

def _task(name="t") -> Task:
    return Task(name=name, description="d", kind="classification", metric="accuracy", target="y")


def test_summarize_reports_per_task_figures_and_refuses_a_number_when_partial():
    a, b = _task("a"), _task("b")
    valid = Outcome(status=Status.VALID, rank_score=0.8)
    crash = Outcome(status=Status.RUNTIME_ERR)
    items = [(a, "x"), (a, "y"), (b, "z"), (b, "w")]
    trajectories = single_turn_trajectories(items, [valid, crash, crash, crash])
    point = summarize([a, b], trajectories, failures=[], executed=4, seconds=1.5, max_turns=1)
    assert point["complete"] and point["reward"] == pytest.approx((0.9 + 0.1 + 0.1 + 0.1) / 4)
    assert point["tasks"]["a"] == {"mean_reward": pytest.approx(0.5), "valid_rate": 0.5, "best_position": 0.8,
                                   "mean_best_position": 0.8, "percentile": pytest.approx(0.4), "medals": None,
                                   "category": "other", "complete": True, "samples": 2, "graded": 2}
    assert point["tasks"]["b"]["best_position"] is None and point["tasks"]["b"]["valid_rate"] == 0.0
    assert point["tasks"]["b"]["percentile"] == 0.0 and point["tasks"]["b"]["mean_best_position"] is None
    assert point["overall"]["percentile"] == pytest.approx(0.2) and list(point["by_category"]) == ["other"]
    partial = summarize([a, b], single_turn_trajectories(items, [valid, None, crash, crash]),
                        failures=["execution of a a script failed: ConnectError: refused"], executed=4, seconds=1.0,
                        max_turns=1)
    assert not partial["complete"] and partial["reward"] is None
    assert partial["partial"] == "3 of 4 trajectories graded: execution of a a script failed: ConnectError: refused"
    assert partial["tasks"]["a"]["graded"] == 1
    # A task not all graded has no figures, and nothing is averaged: a partial evaluation is never a number.
    assert not partial["tasks"]["a"]["complete"] and partial["tasks"]["a"]["percentile"] is None
    assert partial["tasks"]["b"]["complete"] and partial["tasks"]["b"]["percentile"] == 0.0
    assert partial["overall"] is None and partial["by_category"] is None


class _SlowExecutor:
    """Counts executions in flight (a stand-in dispatcher: the bound is the grader's, not a sandbox's)."""

    def __init__(self):
        self.lock, self.now, self.peak = threading.Lock(), 0, 0

    def run_task(self, task, code):
        import concurrent.futures as cf

        future = cf.Future()

        def run():
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            future.set_result(Outcome(status=Status.RAN_NO_SUB))

        threading.Thread(target=run, daemon=True).start()
        return future


def test_the_grader_keeps_at_most_max_concurrent_executions_in_flight():
    executor = _SlowExecutor()
    grader = BoundedGrader(executor, limit=3)
    outcomes = grader([(_task(), f"code {i}") for i in range(12)] + [(_task(), "code 0")])
    assert all(o.status is Status.RAN_NO_SUB for o in outcomes)
    assert executor.peak == 3 and grader.executed == 12  # the duplicate ran once
    assert not grader.failures


def test_a_dead_pool_makes_the_grader_partial_naming_the_endpoint_with_retries_to_spare():
    """Through the real dispatcher, its only endpoint refusing: each execution gives up once the pool
    has been down for the grace, not after its retry budget (50 here: minutes of backoff), and says so."""
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints

    url = f"http://127.0.0.1:{free_port()}"
    with SandboxDispatcher(StaticEndpoints([url]), timeout=5, max_retries=50, backoff=0.05) as dispatcher:
        grader = BoundedGrader(dispatcher, limit=2, dead_pool_grace=0.5)
        outcomes = grader([(_task(), f"code {i}") for i in range(6)])
    assert outcomes == [None] * 6
    assert grader.executed == 2  # the two in flight: none submitted once one of them had failed
    assert len(grader.failures) == 2
    for failure in grader.failures:
        assert "SandboxUnavailable: every sandbox endpoint is down: 1 failing" in failure, failure
        assert url in failure and "ConnectError" in failure


# ---------------------------------------------------------------- schema

@pytest.mark.parametrize("field, value, path", [
    ("intervalSteps", -1, "spec.evaluation.intervalSteps"),
    ("samples", 0, "spec.evaluation.samples"),
    ("temperature", 0, "spec.evaluation.temperature"),
    ("maxConcurrent", 0, "spec.evaluation.maxConcurrent"),
    ("every", 3, "spec.evaluation.every"),
])
def test_bad_evaluation_fields_are_refused_naming_the_field(field, value, path):
    spec = {**json.loads(json.dumps(BASE)), "evaluation": {field: value}}
    with pytest.raises(ValidationError) as err:
        parse_spec(spec)
    assert any(line.startswith(path + ":") for line in field_errors(err.value)), field_errors(err.value)


def test_evaluation_defaults_and_crd():
    spec = parse_spec(json.loads(json.dumps(BASE)))
    assert (spec.evaluation.interval_steps, spec.evaluation.samples, spec.evaluation.temperature,
            spec.evaluation.max_concurrent) == (0, 4, 1.0, 4)
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    evaluation = schema["properties"]["spec"]["properties"]["evaluation"]["properties"]
    assert evaluation["samples"]["minimum"] == 1 and evaluation["intervalSteps"]["minimum"] == 0
    progress = schema["properties"]["status"]["properties"]["progress"]["properties"]
    assert {"heldOutReward", "heldOut"} <= set(progress)
    column = next(c for c in PRINTER_COLUMNS if c["name"] == "HeldOut")
    assert column["jsonPath"] == ".status.progress.heldOutReward" and column["type"] == "number"
