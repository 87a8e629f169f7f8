"""Pure builders: spec -> objects, checked without a cluster."""

import argparse
import json
import yaml
import pytest
from pydantic import ValidationError

from wmrl.api.runconfig import RunConfig
from wmrl.api.schema import parse_spec
from wmrl.api.vocabulary import COMPONENT_LABEL, WEBHOOK_CONFIGURATION
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
        ("Deployment", "demo-calibration"), ("Service", "demo-calibration"), ("NetworkPolicy", "demo-calibration"),
        ("NetworkPolicy", "demo-sandbox"),
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
    assert "nodeSelector" not in pod and "tolerations" not in pod  # anywhere, unless the spec places it


def test_sandbox_and_calibration_pods_go_where_their_specs_place_them():
    """Users put sandbox pools on CPU pools (and e2e tests on a tainted node): each section's own
    nodeSelector and tolerations, not the trainer's."""
    cpu = {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "cpu",
                                                              "effect": "NoSchedule"}]}
    objs = by_kind_name(b.children(RUN, spec(sandbox=cpu, calibration={"nodeSelector": {"pool": "small"},
                                                                       "tolerations": [{"operator": "Exists"}]},
                                             trainer={"nodeSelector": {"gpu": "h200"}})))
    sandbox = objs[("Deployment", "demo-sandbox")]["spec"]["template"]["spec"]
    assert sandbox["nodeSelector"] == {"pool": "cpu"}
    assert sandbox["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]
    calibration = objs[("Deployment", "demo-calibration")]["spec"]["template"]["spec"]
    assert calibration["nodeSelector"] == {"pool": "small"} and calibration["tolerations"] == [{"operator": "Exists"}]
    assert objs[("Job", "demo-trainer")]["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}
    with pytest.raises(ValidationError, match="effect"):
        spec(sandbox={"tolerations": [{"key": "k", "effect": "Sometimes"}]})


def _token_ref(container):
    found = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "WMRL_CALIBRATION_TOKEN"]
    return found[0] if found else None


def test_the_calibration_and_its_trainers_share_a_token_and_only_they_are_admitted():
    objs = by_kind_name(b.children(RUN, spec(calibration={"name": "team-cal"})))
    ref = {"name": "team-cal-token", "key": "token"}
    assert _token_ref(objs[("Deployment", "team-cal")]["spec"]["template"]["spec"]["containers"][0]) == ref
    job = objs[("Job", "demo-trainer")]["spec"]["template"]
    assert _token_ref(job["spec"]["containers"][0]) == ref
    assert job["metadata"]["labels"]["wmrl.dev/calibration"] == "team-cal"
    assert not any(o["kind"] == "Secret" for o in objs.values())  # drawn once by the reconciler, never applied
    secret = b.calibration_token_secret(RUN, spec(calibration={"name": "team-cal"}), "tok")
    assert secret["metadata"]["name"] == "team-cal-token" and secret["stringData"] == {"token": "tok"}
    assert "ownerReferences" not in secret["metadata"]  # shared: it outlives any one run
    own = b.calibration_token_secret(RUN, spec(), "tok")
    assert own["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert own["metadata"]["name"] == "demo-calibration-token-uid-1"  # a run made again never gets the old one
    policy = objs[("NetworkPolicy", "team-cal")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"wmrl.dev/calibration": "team-cal",
                                                    "app.kubernetes.io/component": "calibration"}
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {
        "wmrl.dev/calibration": "team-cal", "app.kubernetes.io/component": "trainer"}


def test_a_run_without_calibration_gets_no_token():
    objs = by_kind_name(b.children(RUN, spec(mode="real")))
    job = objs[("Job", "demo-trainer")]["spec"]["template"]
    assert _token_ref(job["spec"]["containers"][0]) is None and "wmrl.dev/calibration" not in job["metadata"]["labels"]


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
    assert c["command"] == ["wmrl", "launch", "--config", "/etc/wmrl/run.yaml"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "4" == c["resources"]["limits"]["nvidia.com/gpu"]
    env = {e["name"]: e.get("value") for e in c["env"]}
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
    sp = spec(trainer={"nodes": 4, "checkpoint": {"claimName": "shared"}})
    objs = by_kind_name(b.children(RUN, sp))
    job = objs[("Job", "demo-trainer")]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["template"]["spec"]["subdomain"] == "demo-trainer"
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "demo-trainer-0.demo-trainer" and env["MASTER_PORT"] == str(b.MASTER_PORT)
    svc = objs[("Service", "demo-trainer")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True  # nodes rendezvous before any Pod is ready


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
    # The server's user namespaces need the runtime's seccomp profile off; executions get the server's filter.
    assert sc["seccompProfile"] == {"type": "Unconfined"} and "appArmorProfile" not in sc
    # bubblewrap mounts each execution's /proc, which the kernel refuses over the runtime's masked one:
    # procMount Unmasked, which the kubelet accepts only in a user namespace of the Pod's own.
    assert sc["procMount"] == "Unmasked" and pod["hostUsers"] is False
    assert sc["runAsNonRoot"] is True  # uid 10001 inside the Pod's user namespace: still checked
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["WMRL_SANDBOX_ISOLATION"] == "namespaces"  # the server refuses to start without them
    assert env["WMRL_SANDBOX_REQUIRE_ISOLATION"] == "true"
    assert env["WMRL_SANDBOX_CGROUPS"] == "auto"  # a cgroup per execution where the container's is delegated
    required = b.sandbox_deployment(RUN, spec(sandbox={"cgroups": "required"}))["spec"]["template"]["spec"]
    assert {e["name"]: e["value"] for e in required["containers"][0]["env"]}["WMRL_SANDBOX_CGROUPS"] == "required"
    restricted = b.sandbox_deployment(RUN, spec(sandbox={"isolation": "restricted"}))["spec"]["template"]["spec"]
    assert restricted["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "procMount" not in restricted["containers"][0]["securityContext"] and "hostUsers" not in restricted
    restricted_env = {e["name"]: e["value"] for e in restricted["containers"][0]["env"]}
    assert restricted_env["WMRL_SANDBOX_REQUIRE_ISOLATION"] == "false"
    assert restricted_env["WMRL_SANDBOX_ISOLATION"] == "restricted"  # executions without namespaces, by choice
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    # A server that refuses to start says why in its termination message (else its last log lines):
    # the operator reads it into the run's SandboxReady condition.
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
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
    np = b.sandbox_network_policy(RUN, spec())["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"] and np["egress"] == []
    (rule,) = np["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": b.labels(RUN, "trainer")}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert np["podSelector"]["matchLabels"]["wmrl.dev/run"] == "demo"


def test_client_access_adds_a_cluster_ip_service_and_lets_only_the_selected_pods_in():
    assert not any(o["metadata"]["name"] == "demo-sandbox-api" for o in b.children(RUN, spec()))
    sp = spec(sandbox={"clientAccess": {"enabled": True, "podSelector": {"app": "verl-reward"},
                                        "namespaceSelector": {"team": "rl"}}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in b.children(RUN, sp)}
    api = objs[("Service", "demo-sandbox-api")]
    assert "clusterIP" not in api["spec"]  # ClusterIP: kube-proxy balances across the pool's ready Pods
    assert api["spec"]["selector"] == b.labels(RUN, "sandbox") and api["spec"]["ports"][0]["port"] == 8080
    assert api["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    (rule,) = objs[("NetworkPolicy", "demo-sandbox")]["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": b.labels(RUN, "trainer")}},
                            {"podSelector": {"matchLabels": {"app": "verl-reward"}},
                             "namespaceSelector": {"matchLabels": {"team": "rl"}}}]
    same_namespace = spec(sandbox={"clientAccess": {"enabled": True}})
    (rule,) = b.sandbox_network_policy(RUN, same_namespace)["spec"]["ingress"]
    assert rule["from"][1] == {"podSelector": {"matchLabels": {}}}  # every Pod of the run's namespace


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
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert dep["spec"]["replicas"] == 2


def test_world_model_vllm_constrains_output_with_guidance_without_free_whitespace():
    """The backend under which every world-model answer was JSON on the CPU tier (tests/vllm_cpu)."""
    args = b.world_model_deployment(RUN, spec())["spec"]["template"]["spec"]["containers"][0]["args"]
    config = json.loads(args[args.index("--structured-outputs-config") + 1])
    assert config == {"backend": "guidance", "disable_any_whitespace": True}


def test_tasks_from_pvc_are_mounted_read_only():
    job = b.trainer_job(RUN, spec(tasks={"pvc": "suite"}))
    pod = job["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["tasks"]["persistentVolumeClaim"] == {"claimName": "suite", "readOnly": True}
    assert b.runtime(RUN, spec(tasks={"pvc": "suite"})).tasks_dir == "/tasks"


def test_builders_are_pure():
    sp = spec()
    assert b.children(RUN, sp) == b.children(RUN, sp)


# ---------------------------------------------------------------- pod safety (issue 14, item 4)


def pod_of(obj):
    return obj["spec"]["template"]["spec"]


def volumes_of(obj):
    return {v["name"]: v for v in pod_of(obj)["volumes"]}


def mounts_of(obj):
    return {m["mountPath"]: m["name"] for m in pod_of(obj)["containers"][0]["volumeMounts"]}


def test_sandbox_defaults_follow_the_executor_limits():
    """The per-slot figures are the executor's own defaults, so the two cannot drift apart."""
    from wmrl_sandbox.executor import Limits

    assert b.SANDBOX_EXEC_MEMORY_MI == Limits().memory_mb
    assert b.SANDBOX_FILE_MI == Limits().file_size_mb


@pytest.mark.parametrize("slots,cpu,memory,work,tmp", [
    (1, "1250m", "3840Mi", "768Mi", "256Mi"),
    (2, "2250m", "6912Mi", "1280Mi", "512Mi"),
    (4, "4250m", "13056Mi", "2304Mi", "1Gi"),
])
def test_sandbox_gets_default_resources_and_sized_memory_volumes(slots, cpu, memory, work, tmp):
    dep = b.sandbox_deployment(RUN, spec(sandbox={"slotsPerPod": slots}))
    c = pod_of(dep)["containers"][0]
    assert c["resources"] == {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    vols = volumes_of(dep)
    assert vols["work"]["emptyDir"] == {"medium": "Memory", "sizeLimit": work}
    assert vols["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": tmp}
    assert mounts_of(dep) == {"/work": "work", "/tmp": "tmp"}
    # The memory limit holds every slot's execution cap plus both memory-backed volumes, full.
    mib = lambda q: int(q[:-2]) * (1024 if q.endswith("Gi") else 1)
    assert mib(memory) >= slots * b.SANDBOX_EXEC_MEMORY_MI + mib(work) + mib(tmp) + b.SANDBOX_SERVER_MEMORY_MI


def test_sandbox_explicit_resources_win_per_resource():
    full = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    c = pod_of(b.sandbox_deployment(RUN, spec(sandbox={"resources": full})))["containers"][0]
    assert c["resources"] == full
    # Only a memory limit: memory is the user's alone (no default request above it); cpu is defaulted.
    c = pod_of(b.sandbox_deployment(RUN, spec(sandbox={"resources": {"limits": {"memory": "1Gi"}}})))["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "1250m"}, "limits": {"memory": "1Gi", "cpu": "1250m"}}
    # Something else entirely: cpu and memory still get their defaults.
    c = pod_of(b.sandbox_deployment(RUN, spec(sandbox={"resources": {"requests": {"ephemeral-storage": "1Gi"}}})))["containers"][0]
    assert c["resources"]["requests"] == {"ephemeral-storage": "1Gi", "cpu": "1250m", "memory": "3840Mi"}
    # The volumes' sizeLimits do not depend on the resources.
    assert volumes_of(b.sandbox_deployment(RUN, spec(sandbox={"resources": full})))["work"]["emptyDir"]["sizeLimit"] == "768Mi"


def test_quantities_are_canonical():
    assert [b._mi(n) for n in (256, 1024, 1536, 2048, 3584)] == ["256Mi", "1Gi", "1536Mi", "2Gi", "3584Mi"]
    assert [b._cpu(n) for n in (250, 1000, 1250, 4000)] == ["250m", "1", "1250m", "4"]


@pytest.mark.parametrize("gpus,size", [(0, "2Gi"), (1, "2Gi"), (4, "8Gi"), (8, "16Gi")])
def test_trainer_gets_dev_shm_sized_by_its_gpus(gpus, size):
    job = b.trainer_job(RUN, spec(trainer={"gpusPerNode": gpus}))
    assert volumes_of(job)["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert mounts_of(job)["/dev/shm"] == "shm"


@pytest.mark.parametrize("gpus,size", [(0, "2Gi"), (1, "2Gi"), (2, "4Gi")])
def test_world_model_gets_dev_shm_sized_by_its_gpus(gpus, size):
    dep = b.world_model_deployment(RUN, spec(worldModel={"gpusPerReplica": gpus}))
    assert volumes_of(dep)["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert mounts_of(dep) == {"/dev/shm": "shm"}


def test_trainer_pod_is_hardened_with_writable_scratch_and_cache_env():
    job = b.trainer_job(RUN, spec(trainer={"gpusPerNode": 8, "checkpoint": {"claimName": "ckpt"}}))
    pod = pod_of(job)
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                      "fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}
    c = pod["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                                    "seccompProfile": {"type": "RuntimeDefault"}}
    mounts = mounts_of(job)
    assert mounts == {"/etc/wmrl": "config", "/checkpoints": "checkpoints", "/dev/shm": "shm", "/tmp": "tmp",
                      "/home/wmrl": "home", "/var/cache/wmrl": "cache"}
    vols = volumes_of(job)
    for name in ("tmp", "home", "cache"):  # disk-backed: model downloads are large, and no sizeLimit evicts the trainer
        assert vols[name]["emptyDir"] == {}, name
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOME"] == "/home/wmrl"
    for key in ("XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "WMRL_CACHE"):
        assert env[key].startswith("/var/cache/wmrl"), key
    # Everything the read-only root leaves writable is a mount of its own.
    writable = [p for p, n in mounts.items() if n not in ("config",)]
    for key in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "WMRL_CACHE"):
        assert any(env[key] == p or env[key].startswith(p + "/") for p in writable), key


def test_trainer_env_matches_the_trainer_image():
    """The cache variables keep the image's own values (trainer/Dockerfile), and its USER is the fsGroup."""
    from pathlib import Path

    dockerfile = (Path(__file__).resolve().parents[2] / "trainer" / "Dockerfile").read_text()
    assert "HF_HOME=/var/cache/wmrl/huggingface" in dockerfile
    assert "TRITON_CACHE_DIR=/var/cache/wmrl/triton" in dockerfile
    assert f"USER {b.TRAINER_UID}:{b.TRAINER_UID}" in dockerfile
    assert f"WORKDIR {b.TRAINER_HOME}" in dockerfile


@pytest.mark.parametrize("path", ["/tmp", "/home/wmrl/", "/var/cache/wmrl"])
def test_checkpoint_path_on_a_scratch_directory_replaces_that_scratch_volume(path):
    job = b.trainer_job(RUN, spec(trainer={"checkpoint": {"path": path}}))
    mounts = [m["mountPath"].rstrip("/") for m in pod_of(job)["containers"][0]["volumeMounts"]]
    assert len(mounts) == len(set(mounts)), mounts  # the apiserver refuses a mountPath twice
    assert len(pod_of(job)["volumes"]) == len(mounts)


def test_world_model_drops_capabilities_but_may_run_as_root():
    pod = pod_of(b.world_model_deployment(RUN, spec()))
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    sc = pod["containers"][0]["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsNonRoot" not in str(pod)
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("mode", ["wmrl", "worldModel", "real"])
def test_every_pod_of_every_child_drops_capabilities_and_uses_runtime_default_seccomp(mode):
    pods = [pod_of(o) for o in b.children(RUN, spec(mode=mode)) if o["kind"] in ("Deployment", "Job")]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            if c["name"] != "vllm":
                assert c["securityContext"]["runAsNonRoot"] is True, c["name"]
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
        for v in pod.get("volumes", ()):
            if (v.get("emptyDir") or {}).get("medium") == "Memory":
                assert v["emptyDir"].get("sizeLimit"), v


# ---------------------------------------------------------------- the operator's webhook RBAC


def test_webhook_rbac_is_limited_to_the_operators_own_configurations():
    from wmrl_operator import rbac

    webhook = [r for r in rbac.rules(webhook=True) if r not in rbac.rules(webhook=False)]
    assert webhook and all(r["apiGroups"] == ["admissionregistration.k8s.io"] for r in webhook)
    for rule in webhook:
        assert set(rule["resources"]) == {"validatingwebhookconfigurations", "mutatingwebhookconfigurations"}
        assert not set(rule["verbs"]) & {"get", "list", "watch", "update", "delete", "deletecollection", "*"}
        if rule["verbs"] != ["create"]:  # RBAC cannot limit create by name
            assert rule["resourceNames"] == [WEBHOOK_CONFIGURATION], rule
    assert {"apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
            "resourceNames": ["wmrl.dev"], "verbs": ["patch"]} in webhook
    # Secrets: the calibration tokens, create only; the operator can never read the cluster's Secrets.
    assert [r["verbs"] for r in rbac.rules(webhook=True) if "secrets" in r["resources"]] == [["create"]]
    # rules() hands out copies: editing one cannot change the module's rules.
    rbac.rules(webhook=True)[-1]["resourceNames"].append("other")
    assert rbac.WEBHOOK_RULES[-1]["resourceNames"] == ["wmrl.dev"]


def test_webhook_configuration_name_is_the_one_kopf_manages():
    import argparse

    from wmrl_operator.main import add_arguments, operator_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = operator_settings(parser.parse_args(["--webhook", "--webhook-host", "localhost"]))
    assert settings.admission.managed == WEBHOOK_CONFIGURATION


def test_only_owned_children_the_spec_no_longer_wants_are_pruned():
    with_api = b.children(RUN, spec(sandbox={"clientAccess": {"enabled": True}}))
    without = b.children(RUN, spec())
    other_run = {**with_api[0], "metadata": {**with_api[0]["metadata"], "name": "x",
                                              "ownerReferences": [{"uid": "uid-2"}]}}
    shared = {"kind": "Deployment", "metadata": {"name": "shared-cal", "labels": b.labels(RUN, "calibration")}}
    pruned = b.unwanted(RUN, without, with_api + [other_run, shared])
    assert [(o["kind"], o["metadata"]["name"]) for o in pruned] == [("Service", "demo-sandbox-api")]
    assert b.unwanted(RUN, with_api, with_api) == []


def test_server_mode_without_a_url_gets_a_rollout_server_the_trainer_points_at():
    import yaml

    policy = {"model": "Qwen/Qwen3-4B", "vllmMode": "server", "vllmTensorParallelSize": 2}
    objs = by_kind_name(b.children(RUN, spec(policy=policy, trainer={"gpusPerNode": 8, "nodeSelector": {"gpu": "h200"}})))
    pod = objs[("Deployment", "demo-rollout")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["trl", "vllm-serve", "--model", "Qwen/Qwen3-4B", "--tensor-parallel-size", "2",
                            "--host", "0.0.0.0", "--port", "8000"]
    assert c["image"] == "ghcr.io/wmrl/trainer:0.1.0"  # the trainer image carries TRL and vLLM
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" and pod["nodeSelector"] == {"gpu": "h200"}
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/dev/shm", "/tmp", "/home/wmrl", "/var/cache/wmrl"}
    ports = {p["name"]: p["port"] for p in objs[("Service", "demo-rollout")]["spec"]["ports"]}
    assert ports == {"http": 8000, "weights": 51216}  # TRL's weight-sync group port
    config = yaml.safe_load(objs[("ConfigMap", "demo-config")]["data"]["run.yaml"])
    assert config["runtime"]["rolloutUrl"] == "http://demo-rollout.ns1.svc:8000"
    # The server's GPUs need not divide the trainer's: only a colocated engine shares them.
    assert spec(policy={**policy, "vllmTensorParallelSize": 3}, trainer={"gpusPerNode": 8})
    # A server of your own, or colocated engines: no rollout server.
    for other in ({**policy, "vllmServerUrl": "http://mine:8000"}, {"model": "Qwen/Qwen3-4B", "vllmMode": "colocate"}):
        assert ("Deployment", "demo-rollout") not in by_kind_name(b.children(RUN, spec(policy=other)))
    stopped = b.rollout_deployment(RUN, spec(policy=policy), b.Options(finished=True))
    assert stopped["spec"]["replicas"] == 0  # its GPUs go back when the run ends


def test_the_trainer_uses_the_deployed_rollout_server_unless_the_spec_names_one():
    from wmrl.api.schema import PolicySpec
    from wmrl_trainer.build import vllm_options

    server = PolicySpec.model_validate({"model": "m", "vllmMode": "server"})
    assert vllm_options(server, "http://r-rollout.ns.svc:8000")["vllm_server_base_url"] == "http://r-rollout.ns.svc:8000"
    mine = PolicySpec.model_validate({"model": "m", "vllmMode": "server", "vllmServerUrl": "http://mine:8000"})
    assert vllm_options(mine, "http://r-rollout.ns.svc:8000")["vllm_server_base_url"] == "http://mine:8000"


def test_an_object_of_another_run_or_a_shared_calibration_is_a_conflict_naming_it():
    own = b.Run("alpha", "ns1", "uid-alpha")
    other = b.Run("beta", "ns1", "uid-beta")
    alphas = by_kind_name(b.calibration_objects(own, spec()))[("Deployment", "alpha-calibration")]
    assert b.ownership_conflict(own, alphas, None) is None
    assert b.ownership_conflict(own, alphas, alphas) is None  # its own, as applied before
    # beta names alpha's private calibration: it would take it over.
    borrowed = by_kind_name(b.calibration_objects(other, spec(calibration={"name": "alpha-calibration"})))
    why = b.ownership_conflict(other, borrowed[("Deployment", "alpha-calibration")], alphas)
    assert "Deployment ns1/alpha-calibration belongs to WMRLRun 'alpha'" in why
    # A run's own calibration must not take over a shared one that happens to have its name.
    shared = by_kind_name(b.calibration_objects(other, spec(calibration={"name": "alpha-calibration"})))
    why = b.ownership_conflict(own, alphas, shared[("Deployment", "alpha-calibration")])
    assert "shared calibration 'alpha-calibration'" in why
    # Runs sharing one calibration by name are not in conflict, as long as they agree on its settings.
    first = by_kind_name(b.calibration_objects(other, spec(calibration={"name": "team"})))
    second = by_kind_name(b.calibration_objects(own, spec(calibration={"name": "team"})))
    for key, obj in second.items():
        assert b.ownership_conflict(own, obj, first[key]) is None, key
    stricter = by_kind_name(b.calibration_objects(own, spec(calibration={"name": "team"},
                                                           algorithm={"denoising": {"maxWeight": 2.0}})))
    why = b.ownership_conflict(own, stricter[("Deployment", "team")], first[("Deployment", "team")])
    assert "runs with other settings" in why and "must agree" in why  # never last-writer-wins


def test_a_shared_calibration_is_owned_by_its_state_configmap():
    """Its own object: deleting the state ConfigMap (the calibration's data) deletes all of it."""
    shared = spec(calibration={"name": "team"})
    objs = b.calibration_objects(RUN, shared, b.Options(calibration_state_uid="cm-uid"))
    for obj in objs:
        refs = obj["metadata"].get("ownerReferences")
        if obj["metadata"]["name"] == "team-state":
            assert refs is None  # the owner itself belongs to nobody
        else:
            assert refs == [{"apiVersion": "v1", "kind": "ConfigMap", "name": "team-state", "uid": "cm-uid",
                             "controller": True, "blockOwnerDeletion": False}], obj["kind"]
    secret = b.calibration_token_secret(RUN, shared, "tok", "cm-uid")
    assert secret["metadata"]["ownerReferences"][0]["name"] == "team-state"
    # As applied (owned by the ConfigMap), it is still the same shared calibration to another run ...
    other = b.Run("beta", "ns1", "uid-beta")
    applied = by_kind_name(objs)
    for key, obj in by_kind_name(b.calibration_objects(other, shared)).items():
        assert b.ownership_conflict(other, obj, applied[key]) is None, key
    # ... and never a run's own calibration of that name.
    team = b.Run("team", "ns1", "uid-team")
    mine = by_kind_name(b.calibration_objects(team, spec()))
    why = b.ownership_conflict(team, mine[("Deployment", "team-calibration")],
                               {**applied[("Deployment", "team")],
                                "metadata": {**applied[("Deployment", "team")]["metadata"], "name": "team-calibration",
                                             "labels": {**applied[("Deployment", "team")]["metadata"]["labels"],
                                                        "wmrl.dev/calibration": "team-calibration"},
                                             "ownerReferences": [{"kind": "ConfigMap", "name": "team-calibration-state",
                                                                  "uid": "x", "controller": True}]}})
    assert "shared calibration 'team-calibration'" in why


def test_a_preempted_or_evicted_trainer_pod_is_not_a_failure():
    job = b.trainer_job(RUN, spec())
    assert job["spec"]["podFailurePolicy"] == {"rules": [{"action": "Ignore", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]}]}
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # which podFailurePolicy requires


def test_a_queued_run_hands_its_job_to_kueue_suspended_and_labelled():
    admission = b.admission_labels({"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high",
                                    "other": "x"})
    assert admission == (("kueue.x-k8s.io/queue-name", "team-a"), ("kueue.x-k8s.io/priority-class", "high"))
    assert b.admission_labels(None) == () and b.admission_labels({"kueue.x-k8s.io/queue-name": ""}) == ()
    job = b.trainer_job(RUN, spec(), b.Options(admission=admission))
    assert job["spec"]["suspend"] is True  # only Kueue unsuspends it
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a" and labels["kueue.x-k8s.io/priority-class"] == "high"
    assert labels["wmrl.dev/run"] == "demo"
    plain = b.trainer_job(RUN, spec())
    assert plain["spec"]["suspend"] is False and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    assert b.trainer_job(RUN, spec(), b.Options(admission=(("kueue.x-k8s.io/priority-class", "high"),)))[
        "spec"]["suspend"] is False  # a priority class alone queues nothing


def test_a_run_awaiting_admission_holds_no_pool_and_no_model_server():
    sp = spec(sandbox={"minReplicas": 2}, policy={"model": "Qwen/Qwen3-4B", "rolloutEngine": "vllm",
                                                   "vllmMode": "server"})
    queued = b.Options(admission=(("kueue.x-k8s.io/queue-name", "team-a"),), awaiting_admission=True)
    replicas = {o["metadata"]["labels"][COMPONENT_LABEL]: o["spec"]["replicas"]
                for o in b.children(RUN, sp, queued) if o["kind"] == "Deployment"}
    # The calibration service keeps running: it holds the (possibly shared) bias estimates, on a CPU.
    assert replicas == {"sandbox": 0, "world-model": 0, "rollout": 0, "calibration": 1}
    admitted = b.Options(admission=queued.admission, sandbox_replicas=0)
    assert b.sandbox_deployment(RUN, sp, admitted)["spec"]["replicas"] == 2  # back to minReplicas



def _env_of(dep):
    return {e["name"]: e["value"] for e in pod_of(dep)["containers"][0]["env"]}


def test_sandbox_pods_mount_the_tasks_claim_read_only_and_the_server_hides_it():
    """A PVC source reaches the sandbox Pods whole and read-only at /tasks; the server is told where
    (WMRL_SANDBOX_TASKS_DIR), so it hides it in every execution but for the public directory one asks
    for; the trainer is told the sandboxes have it (runtime.sandboxMountsTasks)."""
    sp = spec(tasks={"pvc": "mle-bench", "format": "mlebench"})
    dep = b.sandbox_deployment(RUN, sp)
    assert volumes_of(dep)["tasks"] == {"name": "tasks", "persistentVolumeClaim": {"claimName": "mle-bench",
                                                                                   "readOnly": True}}
    mount = next(m for m in pod_of(dep)["containers"][0]["volumeMounts"] if m["name"] == "tasks")
    assert mount == {"name": "tasks", "mountPath": "/tasks", "readOnly": True}
    assert _env_of(dep)["WMRL_SANDBOX_TASKS_DIR"] == "/tasks"
    runtime = b.runtime(RUN, sp)
    assert runtime.sandbox_mounts_tasks is True and runtime.tasks_dir == "/tasks"
    assert "sandboxMountsTasks: true" in b.config_map(RUN, sp)["data"]["run.yaml"]
    # No subPath: one mount serves every task; the isolation, not the volume, narrows it.
    assert "subPath" not in mount


@pytest.mark.parametrize("tasks,sandbox", [
    ({"builtin": "mini-ml"}, {}),
    ({"path": "/data/tasks"}, {}),
    ({"configMap": "one-task"}, {}),
    ({"pvc": "mle-bench"}, {"isolation": "restricted"}),  # executions could read the answers: uploads only
])
def test_sandbox_pods_without_a_hideable_tasks_claim_mount_none(tasks, sandbox):
    sp = spec(tasks=tasks, sandbox=sandbox)
    dep = b.sandbox_deployment(RUN, sp)
    assert "tasks" not in volumes_of(dep) and "/tasks" not in mounts_of(dep)
    assert "WMRL_SANDBOX_TASKS_DIR" not in _env_of(dep)
    assert b.runtime(RUN, sp).sandbox_mounts_tasks is False


def test_sandbox_execution_limits_are_per_run_settings():
    default = _env_of(b.sandbox_deployment(RUN, spec()))
    assert {k: default[k] for k in ("WMRL_SANDBOX_MEMORY_MB", "WMRL_SANDBOX_TMPFS_MB", "WMRL_SANDBOX_FILE_SIZE_MB",
                                    "WMRL_SANDBOX_CPUS", "WMRL_SANDBOX_TIMEOUT_SECONDS")} == {
        "WMRL_SANDBOX_MEMORY_MB": "2048", "WMRL_SANDBOX_TMPFS_MB": "64", "WMRL_SANDBOX_FILE_SIZE_MB": "256",
        "WMRL_SANDBOX_CPUS": "1", "WMRL_SANDBOX_TIMEOUT_SECONDS": "600"}
    big = {"memoryMB": 16384, "tmpfsMB": 1024, "fileSizeMB": 2048, "cpusPerExecution": 4, "timeoutSeconds": 3600,
           "slotsPerPod": 2}
    dep = b.sandbox_deployment(RUN, spec(sandbox=big))
    env = _env_of(dep)
    assert (env["WMRL_SANDBOX_MEMORY_MB"], env["WMRL_SANDBOX_TMPFS_MB"], env["WMRL_SANDBOX_FILE_SIZE_MB"],
            env["WMRL_SANDBOX_CPUS"], env["WMRL_SANDBOX_TIMEOUT_SECONDS"]) == ("16384", "1024", "2048", "4", "3600")
    # The Pod is sized from them: 2 x (16384 + 256 fork server + 3 x (1024 - 64) tmpfs) + /work (256 + 2 x 2 x 2048)
    # + /tmp (2 x 2048) + 512 server = 39040 + 8448 + 4096 + 512 = 52096 MiB; 2 x 4 cores + 250m.
    c = pod_of(dep)["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "8250m", "memory": "52096Mi"}
    assert volumes_of(dep)["work"]["emptyDir"]["sizeLimit"] == "8448Mi"
    assert volumes_of(dep)["tmp"]["emptyDir"]["sizeLimit"] == "4Gi"
    # The defaults are what they were (the executor's own Limits).
    from wmrl_sandbox.executor import Limits

    d = Limits()
    s = spec().sandbox
    assert (s.memory_mb, s.tmpfs_mb, s.file_size_mb) == (d.memory_mb, d.tmpfs_mb, d.file_size_mb)
    assert b.SANDBOX_TMPFS_MI == d.tmpfs_mb


def test_sandbox_gpus_are_rendered_as_nvidia_gpu_limits():
    c = pod_of(b.sandbox_deployment(RUN, spec(sandbox={"gpus": 1})))["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["limits"]["cpu"] == "1250m"  # cpu and memory keep their defaults
    c = pod_of(b.sandbox_deployment(RUN, spec()))["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


@pytest.mark.parametrize("gpus", [1, 2])
def test_sandbox_gpus_are_bound_into_every_execution(gpus):
    """With spec.sandbox.gpus the server is told to bind the device plugin's /dev/nvidia* into every
    execution (WMRL_SANDBOX_DEVICES, read as --device); without, it is not told any device."""
    from wmrl_sandbox import devices

    env = _env_of(b.sandbox_deployment(RUN, spec(sandbox={"gpus": gpus})))
    assert devices.parse_env(env[devices.DEVICES_ENV]) == ["/dev/nvidia*"]
    assert devices.DEVICES_ENV not in _env_of(b.sandbox_deployment(RUN, spec()))
    assert devices.DEVICES_ENV not in _env_of(b.sandbox_deployment(RUN, spec(sandbox={"gpus": 0})))


@pytest.mark.parametrize("field,value", [("memoryMB", 64), ("tmpfsMB", 0), ("fileSizeMB", 0),
                                         ("cpusPerExecution", -1), ("gpus", -1)])
def test_bad_sandbox_limits_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        spec(sandbox={field: value})


# ---------------------------------------------------------------- mode eval: `wmrl eval` in the trainer's place


def eval_spec(**over):
    base = {"mode": "eval", "trainer": {"gpusPerNode": 1, "checkpoint": {"claimName": "ckpt"}},
            "tasks": {"pvc": "tasks", "heldOut": ["spaceship-titanic"]},
            "policy": {"model": "Qwen/Qwen3-4B", "rolloutEngine": "vllm", "vllmMode": "server"},
            "evaluation": {"samples": 8, "checkpoint": "step-00000200"}}
    base.update(over)
    return spec(**base)


def test_eval_mode_runs_wmrl_eval_in_the_trainer_jobs_place_beside_the_sandbox_pool_only():
    s = eval_spec()
    kinds = by_kind_name(b.children(RUN, s))
    # No world model (its backend is llm), no calibration, no rollout server (vllmMode server): nothing trains.
    assert {k for k, _ in kinds} == {"ConfigMap", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Service",
                                     "Deployment", "Job"}
    assert {n for k, n in kinds if k in ("Deployment", "Service")} == {"demo-sandbox"}
    job = kinds[("Job", "demo-trainer")]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["wmrl", "eval", "--config", "/etc/wmrl/run.yaml", "--out", "/checkpoints/evaluations/demo",
                            "--no-progress"]
    assert b.evaluation_dir(RUN, s) == "/checkpoints/evaluations/demo"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and job["spec"]["completions"] == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert volumes["tasks"]["persistentVolumeClaim"] == {"claimName": "tasks", "readOnly": True}
    # The sandbox pool admits it (a trainer Pod), and its service account may patch the run's status.
    assert job["spec"]["template"]["metadata"]["labels"][COMPONENT_LABEL] == "trainer"
    (rule,) = b.sandbox_network_policy(RUN, s)["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    role = kinds[("Role", "demo-trainer")]
    assert {"apiGroups": ["wmrl.dev"], "resources": ["wmrlruns/status"], "resourceNames": ["demo"],
            "verbs": ["get", "patch"]} in role["rules"]
    config = RunConfig.model_validate(yaml.safe_load(kinds[("ConfigMap", "demo-config")]["data"]["run.yaml"]))
    assert config.spec.mode.value == "eval" and config.spec.evaluation.checkpoint == "step-00000200"
    assert config.runtime.sandbox_service == "demo-sandbox" and config.runtime.patch_status
    assert config.runtime.rollout_url is None and config.runtime.calibration_url is None
    assert config.runtime.world_model_url is None and config.runtime.tasks_dir == "/tasks"
    # Training still runs `wmrl launch`.
    assert b.trainer_command(RUN, spec()) == ["wmrl", "launch", "--config", "/etc/wmrl/run.yaml"]


def test_the_eval_jobs_rendered_config_is_what_wmrl_eval_reads(tmp_path):
    """The ConfigMap's run.yaml, read by `wmrl eval --config` (its checkpoint volume here a folder):
    the newest complete checkpoint, and the report where the Job's --out puts it."""
    from wmrl_trainer import eval_cli

    s = eval_spec(tasks={"builtin": "mini-ml", "heldOut": ["iris"]}, evaluation={"samples": 2},
                  trainer={"gpusPerNode": 0, "checkpoint": {"path": str(tmp_path)}},
                  policy={"model": "builtin:tiny-coder", "rolloutEngine": "transformers"},
                  algorithm={"maxTurns": 1})
    for step in (100, 200):
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "COMPLETE").write_text(json.dumps({"step": step}))
    rendered = tmp_path / "run.yaml"
    rendered.write_text(b.config_map(RUN, s)["data"]["run.yaml"])
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    plan = eval_cli.plan(parser.parse_args(["--config", str(rendered)]))
    assert plan.cluster and plan.checkpoint == tmp_path / "step-00000200" and plan.checkpoint_step == 200
    assert str(plan.out) == b.evaluation_dir(RUN, s) == str(tmp_path / "evaluations" / "demo")
    assert [t.name for t in plan.tasks] == ["iris"]


def test_eval_mode_pods_are_hardened_like_every_other():
    pods = [pod_of(o) for o in b.children(RUN, eval_spec()) if o["kind"] in ("Deployment", "Job")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"]


@pytest.mark.parametrize("trainer", [{"gpusPerNode": 8}, {"gpusPerNode": 1, "nodes": 2, "checkpoint": {"claimName": "c"}}])
def test_eval_mode_is_one_process_on_at_most_one_gpu(trainer):
    with pytest.raises(ValidationError) as err:
        eval_spec(trainer=trainer)
    assert "spec.trainer.gpusPerNode: mode eval runs one evaluation process" in str(err.value)
