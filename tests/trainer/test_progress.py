"""Progress: status.progress patches on the real apiserver, Prometheus metrics, never crashing on API errors."""

from __future__ import annotations

import subprocess
import sys
import uuid

import httpx
import pytest

from wmrl_trainer.health import HealthMonitor
from wmrl_trainer.records import StepRecord
from wmrl_trainer.progress import ProgressReporter, StatusPatcher, Totals, TrainerMetrics, progress_of


def record(step: int, **kw) -> StepRecord:
    base = dict(mode="wmrl", generation=1.0, world_model=0.2, execution=0.05, calibration=0.01, update=0.5, total=1.76,
                mean_real_reward=0.4, mean_world_model_reward=0.5, mean_calibrated_reward=0.45, anchor_groups=2,
                anchor_fraction=0.25, bias_reduction=0.6, weight=2.0, executions=16, sandbox_seconds=8.0, ungraded=1,
                rows=64, demand=3, calibration_stale_seconds=1.5)
    base.update(kw)
    return StepRecord(step=step, **base)


def test_progress_accumulates_counters_and_names_fields_in_camel_case():
    totals = Totals()
    for step in range(3):
        totals.add(record(step))
    wire = progress_of(record(2), totals, 100).to_wire()
    assert wire["step"] == 3 and wire["totalSteps"] == 100
    assert wire["executions"] == 48 and wire["sandboxSeconds"] == 24.0 and wire["ungraded"] == 3
    assert wire["anchorWeight"] == 2.0 and wire["biasReduction"] == 0.6 and wire["sandboxDemand"] == 3
    assert wire["calibrationStaleSeconds"] == 1.5 and "updatedAt" in wire


def scrape(step_record: StepRecord) -> str:
    """The /metrics text after observing one record, from a real HTTP server on loopback."""
    metrics = TrainerMetrics(port=0, addr="127.0.0.1")
    try:
        metrics.observe(step_record)
        return httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).text
    finally:
        metrics.close()


def test_progress_and_metrics_carry_the_policy_health():
    step_record = record(4, distinct_per_group=1.25, truncated_share=0.5, mean_completion_tokens=3.0, entropy=0.02)
    HealthMonitor(group_size=8, patience=1).check(step_record)
    health = progress_of(step_record, Totals(), 20).to_wire()["health"]
    assert health["distinctPerGroup"] == 1.25 and health["truncatedShare"] == 0.5 and health["entropy"] == 0.02
    assert "stopped exploring" in health["warning"]
    text = scrape(step_record)
    assert 'wmrl_trainer_policy_health{figure="distinct_per_group"} 1.25' in text
    assert 'wmrl_trainer_policy_health{figure="truncated_share"} 0.5' in text
    assert "wmrl_trainer_generation_degenerating 1.0" in text
    assert "wmrl_trainer_generation_degenerating 0.0" in scrape(record(5))


def test_metrics_are_served_on_their_port():
    text = scrape(record(4))
    assert "wmrl_trainer_step 5.0" in text
    assert 'wmrl_trainer_phase_seconds{phase="execution"} 0.05' in text
    assert 'wmrl_trainer_mean_reward{kind="calibrated"} 0.45' in text
    assert "wmrl_trainer_executions_total 16.0" in text


TURNS = {"mean_turns": 2.5, "stops": {"top": 3, "turns": 4, "budget": 1, "truncated": 5, "ungraded": 2},
         "mean_best_turn": 1.75,
         "repair_rate": 0.4, "repair_attempts": 10, "valid_share_by_turn": [0.25, 0.5]}


def test_progress_and_metrics_carry_the_multi_turn_figures():
    wire = progress_of(record(1, turns=TURNS), Totals(), 10).to_wire()
    assert wire["turns"] == {"meanTurns": 2.5, "meanBestTurn": 1.75, "repairRate": 0.4, "stoppedAtTop": 3,
                             "stoppedAtBudget": 1, "truncated": 5, "ungraded": 2, "validByTurn": [0.25, 0.5]}
    assert "turns" not in progress_of(record(1), Totals(), 10).to_wire()  # single-turn runs have none
    text = scrape(record(1, turns=TURNS))
    assert 'wmrl_trainer_turns{figure="mean_turns"} 2.5' in text
    assert 'wmrl_trainer_turns{figure="repair_rate"} 0.4' in text
    assert 'wmrl_trainer_trajectory_stops_total{reason="top"} 3.0' in text
    assert 'wmrl_trainer_turn_valid_share{turn="2"} 0.5' in text


@pytest.mark.cluster
def test_status_progress_is_patched_on_the_real_apiserver(k8s_cluster):
    from kubernetes import client, config

    crd = subprocess.run([sys.executable, "-m", "wmrl.cli", "crd"], capture_output=True, text=True, check=True).stdout
    subprocess.run([str(k8s_cluster.binary("kubectl")), "--kubeconfig", str(k8s_cluster.kubeconfig), "apply", "-f", "-"],
                   input=crd, text=True, check=True, capture_output=True)
    subprocess.run([str(k8s_cluster.binary("kubectl")), "--kubeconfig", str(k8s_cluster.kubeconfig), "wait",
                    "--for=condition=Established", "crd/wmrlruns.wmrl.dev", "--timeout=60s"], check=True, capture_output=True)
    api_client = config.new_client_from_config(config_file=str(k8s_cluster.kubeconfig))
    custom = client.CustomObjectsApi(api_client)
    name, namespace = f"progress-{uuid.uuid4().hex[:8]}", "default"
    custom.create_namespaced_custom_object("wmrl.dev", "v1alpha1", namespace, "wmrlruns", {
        "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": name},
        "spec": {"policy": {"model": "builtin:tiny-coder"}, "tasks": {"builtin": "mini-ml"}, "suspend": True},
    })
    try:
        reporter = ProgressReporter(Totals(), 10, StatusPatcher(name, namespace, api_client=api_client))
        reporter.report(record(0))
        reporter.report(record(1, weight=2.5))
        obj = custom.get_namespaced_custom_object("wmrl.dev", "v1alpha1", namespace, "wmrlruns", name)
        progress = obj["status"]["progress"]
        assert progress["step"] == 2 and progress["totalSteps"] == 10
        assert progress["executions"] == 32 and progress["anchorWeight"] == 2.5
        assert progress["sandboxDemand"] == 3 and progress["meanCalibratedReward"] == 0.45
        assert reporter.patcher.failures == 0
    finally:
        custom.delete_namespaced_custom_object("wmrl.dev", "v1alpha1", namespace, "wmrlruns", name)
    # The object is gone: a patch fails, is counted, and does not raise (training goes on).
    patcher = StatusPatcher(name, namespace, api_client=api_client)
    assert patcher.patch(progress_of(record(2), Totals(), 10)) is False and patcher.failures == 1
