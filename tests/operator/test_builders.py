"""Pure builders: spec -> objects, checked without a cluster."""

import yaml
import pytest

from wmrl.api.runconfig import RunConfig
from wmrl.api.schema import parse_spec
from wmrl_operator import builders as b

RUN = b.Run("demo", "ns1", "uid-1")


def spec(**over):
    base = {"policy": {"model": "Qwen/Qwen3-4B"}, "tasks": {"builtin": "mini-ml"}}
    for key, value in over.items():
        base[key] = value
    return parse_spec(base)


def by_kind_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_wmrl_mode_objects_names_and_order():
    objs = b.children(RUN, spec())
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert names[0] == ("ConfigMap", "demo-config")
    assert names[-1] == ("Job", "demo-trainer")
    assert set(names) == {
        ("ConfigMap", "demo-config"), ("ServiceAccount", "demo-trainer"), ("Role", "demo-trainer"),
        ("RoleBinding", "demo-trainer"), ("ConfigMap", "demo-calibration-state"),
        ("ServiceAccount", "demo-calibration"), ("Role", "demo-calibration"), ("RoleBinding", "demo-calibration"),
        ("Deployment", "demo-calibration"), ("Service", "demo-calibration"), ("NetworkPolicy", "demo-sandbox"),
        ("Service", "demo-sandbox"), ("Deployment", "demo-sandbox"), ("Service", "demo-world-model"),
        ("Deployment", "demo-world-model"), ("Job", "demo-trainer"),
    }
    assert len(names) == len(set(names))


def test_every_owned_object_has_owner_reference_and_common_labels():
    for obj in b.children(RUN, spec()):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns1"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "wmrl-operator"
        assert meta["labels"]["app.kubernetes.io/component"] in ("trainer", "sandbox", "world-model", "calibration")
        assert meta["labels"]["wmrl.dev/run"] == "demo"
        (ref,) = meta["ownerReferences"]
        assert ref == {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "name": "demo", "uid": "uid-1",
                       "controller": True, "blockOwnerDeletion": True}


def test_shared_calibration_is_not_owned_and_labelled_by_calibration():
    objs = b.children(RUN, spec(calibration={"name": "team-cal"}))
    cal = [o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component") == "calibration"]
    assert {o["metadata"]["name"] for o in cal} == {"team-cal", "team-cal-state"}
    for o in cal:
        assert "ownerReferences" not in o["metadata"]
        assert "wmrl.dev/run" not in o["metadata"]["labels"]
        assert o["metadata"]["labels"]["wmrl.dev/calibration"] == "team-cal"
    cfg = yaml.safe_load(by_kind_name(objs)[("ConfigMap", "demo-config")]["data"]["run.yaml"])
    assert cfg["runtime"]["calibrationUrl"] == "http://team-cal.ns1.svc:8080"


def test_calibration_deployment_runs_the_service_on_its_configmap():
    objs = by_kind_name(b.children(RUN, spec()))
    dep = objs[("Deployment", "demo-calibration")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-calibration"
    assert pod["containers"][0]["args"][:5] == ["wmrl", "calibration", "serve", "--configmap", "ns1/demo-calibration-state"]
    role = objs[("Role", "demo-calibration")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["demo-calibration-state"],
                              "verbs": ["get", "update", "patch"]}]
    assert "data" not in objs[("ConfigMap", "demo-calibration-state")]  # the service owns the state


def test_rendered_config_round_trips_and_names_runtime_endpoints():
    objs = by_kind_name(b.children(RUN, spec()))
    text = objs[("ConfigMap", "demo-config")]["data"]["run.yaml"]
    cfg = RunConfig.model_validate(yaml.safe_load(text))
    assert cfg.metadata.name == "demo" and cfg.metadata.uid == "uid-1"
    assert cfg.spec.policy.model == "Qwen/Qwen3-4B"
    assert cfg.runtime.sandbox_service == "demo-sandbox"
    assert cfg.runtime.world_model_url == "http://demo-world-model.ns1.svc:8000/v1"
    assert cfg.runtime.calibration_url == "http://demo-calibration.ns1.svc:8080"


def test_trainer_job_gpus_config_mount_env_and_no_kube_retries():
    job = b.trainer_job(RUN, spec(trainer={"gpusPerNode": 4, "checkpoint": {"claimName": "ckpt"}}), b.Options(job_deadline_seconds=99))
    s = job["spec"]
    assert s["backoffLimit"] == 0 and s["activeDeadlineSeconds"] == 99 and s["suspend"] is False
    pod = s["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["wmrl", "train", "--config", "/etc/wmrl/run.yaml"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "4" == c["resources"]["limits"]["nvidia.com/gpu"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["WMRL_RUN"] == "demo" and env["WMRL_NAMESPACE"] == "ns1"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["config"]["configMap"]["name"] == "demo-config"
    assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt"
    assert pod["serviceAccountName"] == "demo-trainer" and pod["restartPolicy"] == "Never"
    assert "completionMode" not in s


def test_cpu_trainer_requests_no_gpu_and_uses_emptydir():
    job = b.trainer_job(RUN, spec(trainer={"gpusPerNode": 0}))
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(c.get("resources"))
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}


def test_multi_node_is_indexed_with_headless_service():
    sp = spec(trainer={"nodes": 4})
    objs = by_kind_name(b.children(RUN, sp))
    job = objs[("Job", "demo-trainer")]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["template"]["spec"]["subdomain"] == "demo-trainer"
    svc = objs[("Service", "demo-trainer")]
    assert svc["spec"]["clusterIP"] == "None"


def test_trainer_role_is_least_privilege():
    role = by_kind_name(b.trainer_rbac(RUN))[("Role", "demo-trainer")]
    rules = role["rules"]
    assert {"apiGroups": ["wmrl.dev"], "resources": ["wmrlruns/status"], "resourceNames": ["demo"],
            "verbs": ["get", "patch"]} in rules
    for rule in rules:
        assert not set(rule["verbs"]) & {"create", "delete", "update", "*"}
        if rule["resources"] != ["endpointslices"]:
            assert rule.get("resourceNames"), rule


def test_sandbox_pod_is_hardened():
    dep = b.sandbox_deployment(RUN, spec(sandbox={"runtimeClassName": "gvisor", "minReplicas": 2, "maxReplicas": 4}))
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/work" in mounts
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["work"]["emptyDir"]["medium"] == "Memory"


def test_sandbox_replicas_clamped_and_zero_when_suspended():
    sp = spec(sandbox={"minReplicas": 2, "maxReplicas": 5})
    assert b.sandbox_deployment(RUN, sp, b.Options(sandbox_replicas=9))["spec"]["replicas"] == 5
    assert b.sandbox_deployment(RUN, sp, b.Options(sandbox_replicas=0))["spec"]["replicas"] == 2
    assert b.sandbox_deployment(RUN, sp, b.Options(suspended=True))["spec"]["replicas"] == 0
    assert b.world_model_deployment(RUN, sp, b.Options(suspended=True))["spec"]["replicas"] == 0
    assert b.trainer_job(RUN, sp, b.Options(suspended=True))["spec"]["suspend"] is True


def test_network_policy_ingress_only_from_this_runs_trainer_and_no_egress():
    np = b.sandbox_network_policy(RUN)["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"] and np["egress"] == []
    (rule,) = np["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": b.labels(RUN, "trainer")}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert np["podSelector"]["matchLabels"]["wmrl.dev/run"] == "demo"


@pytest.mark.parametrize("mode,world_model,calibration", [("wmrl", True, True), ("worldModel", True, False), ("real", False, False)])
def test_mode_decides_children(mode, world_model, calibration):
    kinds = by_kind_name(b.children(RUN, spec(mode=mode)))
    assert (("Deployment", "demo-world-model") in kinds) is world_model
    assert (("Deployment", "demo-calibration") in kinds) is calibration
    assert ("Deployment", "demo-sandbox") in kinds


def test_world_model_endpoint_or_other_backend_deploys_no_vllm():
    for wm in ({"endpoint": "http://vllm.example:8000/v1"}, {"backend": "learned"}):
        kinds = by_kind_name(b.children(RUN, spec(worldModel=wm)))
        assert ("Deployment", "demo-world-model") not in kinds
    cfg = b.runtime(RUN, spec(worldModel={"endpoint": "http://vllm.example:8000/v1"}))
    assert cfg.world_model_url == "http://vllm.example:8000/v1"


def test_world_model_serves_policy_model_by_default_with_gpus():
    dep = b.world_model_deployment(RUN, spec(worldModel={"replicas": 2, "gpusPerReplica": 2}))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:2] == ["--model", "Qwen/Qwen3-4B"]
    assert "--tensor-parallel-size" in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert dep["spec"]["replicas"] == 2


def test_tasks_from_pvc_are_mounted_read_only():
    job = b.trainer_job(RUN, spec(tasks={"pvc": "suite"}))
    pod = job["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["tasks"]["persistentVolumeClaim"] == {"claimName": "suite", "readOnly": True}
    assert b.runtime(RUN, spec(tasks={"pvc": "suite"})).tasks_dir == "/tasks"


def test_builders_are_pure():
    sp = spec()
    assert b.children(RUN, sp) == b.children(RUN, sp)
