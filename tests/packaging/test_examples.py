"""Every example WMRLRun validates against the schema (the API server check is in test_cluster_install.py)."""

from pathlib import Path

import pytest
import yaml

from wmrl.api.schema import API_VERSION, KIND, parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def _runs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_three_kinds_of_example_exist():
    names = {p.name for p in EXAMPLES}
    assert {"small-cpu-run.yaml", "gpu-run.yaml", "shared-calibration.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    for run in _runs(path):
        assert run["apiVersion"] == API_VERSION and run["kind"] == KIND
        assert "namespace" not in run["metadata"], "examples go wherever kubectl -n puts them"
        parse_spec(run["spec"])


def test_small_run_needs_no_gpu():
    spec = parse_spec(_runs(ROOT / "manifests/examples/small-cpu-run.yaml")[0]["spec"])
    assert spec.trainer.gpus_per_node == 0
    assert spec.policy.rollout_engine == "transformers"
    assert spec.world_model.backend == "learned"
    assert spec.tasks.builtin == "mini-ml"


def test_gpu_run_serves_its_world_model_with_vllm():
    spec = parse_spec(_runs(ROOT / "manifests/examples/gpu-run.yaml")[0]["spec"])
    assert spec.trainer.gpus_per_node == 8
    assert spec.policy.rollout_engine == "vllm"
    assert spec.world_model.backend == "llm" and spec.world_model.endpoint is None


def test_shared_calibration_runs_name_the_same_calibration():
    runs = _runs(ROOT / "manifests/examples/shared-calibration.yaml")
    assert len(runs) == 2
    names = {parse_spec(r["spec"]).calibration.name for r in runs}
    assert len(names) == 1 and None not in names


def test_two_node_example_shards_the_policy_over_a_shared_checkpoint_volume():
    spec = parse_spec(_runs(ROOT / "manifests/examples/gpu-run-9b-two-nodes.yaml")[0]["spec"])
    assert spec.trainer.nodes == 2 and spec.trainer.strategy == "fsdp" and spec.trainer.checkpoint.claim_name
    processes = spec.trainer.gpus_per_node * spec.trainer.nodes
    assert spec.algorithm.group_size * spec.algorithm.groups_per_step % processes == 0
    assert spec.trainer.gpus_per_node % spec.policy.vllm_tensor_parallel_size == 0
