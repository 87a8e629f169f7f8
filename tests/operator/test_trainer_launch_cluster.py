"""A two-node trainer on the real control plane: the operator's Indexed Job, its headless Service,
the launcher command each Pod would run (``wmrl launch --dry-run`` with the Pod's own
environment, as the kubelet would resolve it, and the run's rendered config), and a restart
when one rank's Pod fails."""

import shlex
import subprocess
import sys

import pytest
import yaml

from operator_helpers import run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def pod_env(pod):
    """The trainer container's environment: plain values, and the downward-API fields the job
    controller adds (JOB_COMPLETION_INDEX from the Pod's completion-index annotation)."""
    env = {}
    for item in pod["spec"]["containers"][0].get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        path = item["valueFrom"]["fieldRef"]["fieldPath"]
        if path.startswith("metadata.annotations['"):
            env[item["name"]] = pod["metadata"]["annotations"][path[len("metadata.annotations['"):-2]]
        elif path.startswith("metadata.labels['"):
            env[item["name"]] = pod["metadata"]["labels"][path[len("metadata.labels['"):-2]]
    return env


@pytest.fixture
def shared_volume(kube):
    """A PersistentVolume for the test's claim (cluster-scoped: deleted after the test)."""
    name = f"{kube.ns}-shared-ckpt"
    yield name
    kube.run("delete", "pv", name, "--wait=false", "--ignore-not-found", check=False)


def test_two_nodes_launch_one_torchrun_per_pod_meeting_at_pod_0(kube, operator, kwok_nodes, shared_volume, tmp_path):
    # A shared checkpoint volume, bound to a PersistentVolume made for it (no provisioner here).
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": shared_volume},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": "/tmp/x"},
                         "storageClassName": "", "claimRef": {"namespace": kube.ns, "name": "shared-ckpt"}}})
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-ckpt"},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": shared_volume,
                         "resources": {"requests": {"storage": "1Gi"}}}})
    kube.apply(run_manifest("dist", mode="real", trainer={"gpusPerNode": 0, "nodes": 2,
                                                           "checkpoint": {"claimName": "shared-ckpt"}}))
    job = wait_for(lambda: kube.get("job", "dist-trainer"), what="trainer Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["wmrl", "launch"]
    service = kube.get("service", "dist-trainer")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True

    selector = "wmrl.dev/run=dist,app.kubernetes.io/component=trainer"
    pods = wait_for(lambda: len(kube.items("pods", selector)) == 2 and kube.items("pods", selector), what="2 pods")
    # Each Pod gets the stable name <job>-<index>.<job> that MASTER_ADDR points at.
    assert sorted(p["spec"]["hostname"] for p in pods) == ["dist-trainer-0", "dist-trainer-1"]
    assert {p["spec"]["subdomain"] for p in pods} == {"dist-trainer"}

    config = tmp_path / "run.yaml"
    config.write_text(kube.get("configmap", "dist-config")["data"]["run.yaml"])
    assert yaml.safe_load(config.read_text())["spec"]["trainer"]["nodes"] == 2
    ranks = {}
    for pod in pods:
        env = pod_env(pod)
        args = container["command"][2:]
        args[args.index("--config") + 1] = str(config)
        out = subprocess.run([sys.executable, "-m", "wmrl.cli", "launch", *args, "--dry-run"], env={**env, "PATH": ""},
                             capture_output=True, text=True, check=True).stdout
        words = shlex.split(out)
        assert words[1:3] == ["-m", "torch.distributed.run"], out
        flags = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
        assert flags["--nnodes"] == "2" and flags["--nproc-per-node"] == "1"
        assert flags["--master-addr"] == "dist-trainer-0.dist-trainer" and flags["--master-port"] == env["MASTER_PORT"]
        assert "--max-restarts=0" in words  # a dead rank fails the Pod; the operator restarts from the checkpoint
        assert words[words.index("wmrl.cli") + 1:] == ["train", "--config", str(config)]
        ranks[pod["spec"]["hostname"]] = int(flags["--node-rank"])
    assert ranks == {"dist-trainer-0": 0, "dist-trainer-1": 1}

    # One rank dies (its Pod fails): the whole Job fails and the operator starts a new one, which
    # resumes from the shared checkpoint, counting one restart.
    first = job["metadata"]["uid"]
    wait_for(lambda: kube.status("dist").get("phase") == "Running", what="Running")
    kube.run("annotate", "pod", next(p["metadata"]["name"] for p in pods if p["spec"]["hostname"] == "dist-trainer-1"),
             "-n", kube.ns, "wmrl.dev/kwok-phase=Failed", "--overwrite")
    wait_for(lambda: kube.status("dist").get("restarts") == 1, timeout=60, what="restarts == 1")
    wait_for(lambda: (kube.get("job", "dist-trainer") or {}).get("metadata", {}).get("uid") not in (None, first),
             timeout=60, what="a new trainer Job")


def test_a_multi_node_trainer_without_a_shared_checkpoint_volume_is_refused(kube, operator):
    result = kube.apply(run_manifest("lonely", trainer={"gpusPerNode": 0, "nodes": 2}), check=False)
    assert result.returncode != 0
    assert "spec.trainer.checkpoint.claimName" in result.stderr
