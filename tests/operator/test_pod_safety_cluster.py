"""Pod safety on the real control plane (issue 14, item 4): every child of a run, server-side
applied as the operator applies it, is accepted by the apiserver; what the apiserver stores (and
the Pods its controllers then create) still carries the securityContext, /dev/shm, the
memory-backed emptyDirs' sizeLimits and the sandbox's default resources; and Pod Security
Admission finds every pod template "restricted" except the vLLM world model's, which is
"baseline" and misses only runAsNonRoot (its image may run as root), with the sandbox's
``isolation: restricted``. With the default ``isolation: namespaces`` the sandbox misses
"baseline" by one field only, its container's seccomp profile (the runtime's forbids the user
namespaces that isolate each execution): its namespace must allow "privileged".

No operator runs here: the test applies ``builders.children`` itself (field manager
``wmrl-operator``, like ``kube.apply``), owned by a real WMRLRun object so that owner references
are the real ones. Pods land on kwok nodes (they run nothing); a Pod that exists was admitted.
"""

import json

import pytest

from operator_helpers import run_manifest, wait_for
from wmrl.api.schema import parse_spec
from wmrl_operator import builders as b

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PSA_WARNING = "would violate PodSecurity"
WORKLOADS = ("Deployment", "Job")


@pytest.fixture(scope="module")
def psa_namespace(kube):
    """The module's namespace, enforcing Pod Security "baseline" and warning on "restricted"."""
    kube.run("label", "namespace", kube.ns, "--overwrite",
             "pod-security.kubernetes.io/enforce=baseline", "pod-security.kubernetes.io/enforce-version=latest",
             "pod-security.kubernetes.io/warn=restricted", "pod-security.kubernetes.io/warn-version=latest")
    return kube


def make_run(kube, name, **spec):
    """A real WMRLRun (nothing reconciles it here) and the spec as stored, apiserver defaults included."""
    kube.apply(run_manifest(name, **spec))
    body = wait_for(lambda: kube.get("wmrlrun", name), what=f"wmrlrun/{name}")
    return b.Run(name, kube.ns, body["metadata"]["uid"]), parse_spec(body["spec"])


def server_side_apply(kube, obj):
    """Apply as the operator does; returns (the object the apiserver stored, kubectl's warnings)."""
    res = kube.run("apply", "--server-side", "--field-manager=wmrl-operator", "-n", kube.ns, "-o", "json",
                   "-f", "-", input=json.dumps(obj), check=False)
    assert res.returncode == 0, f"{obj['kind']}/{obj['metadata']['name']} refused:\n{res.stderr}"
    return json.loads(res.stdout), res.stderr


def pod_spec(obj):
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def by_name(items):
    return {i["name"]: i for i in items}


def assert_pod_carries(built, stored):
    """What the builder put into a pod spec is in the stored one, unchanged (no field dropped,
    quantities already canonical). The stored one may have more: ConfigMap volumes get their
    defaultMode, and a Pod that mounts its service-account token gets that volume and mount."""
    want, got = pod_spec(built), pod_spec(stored)
    assert got.get("securityContext") == want.get("securityContext")
    got_volumes = by_name(got.get("volumes", []))
    for name, volume in by_name(want.get("volumes", [])).items():
        if "configMap" in volume:
            volume = {**volume, "configMap": {"defaultMode": 420, **volume["configMap"]}}
        assert got_volumes.get(name) == volume, name
    for want_c in want["containers"]:
        got_c = by_name(got["containers"])[want_c["name"]]
        assert got_c.get("securityContext") == want_c.get("securityContext"), want_c["name"]
        got_mounts = got_c.get("volumeMounts") or []
        assert [m for m in got_mounts if m["name"] in got_volumes and m["name"] in by_name(want.get("volumes", []))] \
            == want_c.get("volumeMounts", []), want_c["name"]
        assert got_c.get("env") == want_c.get("env"), want_c["name"]
        if "resources" in want_c:
            for side in ("requests", "limits"):
                want_side = {k: str(v) for k, v in want_c["resources"].get(side, {}).items()}
                got_side = got_c["resources"].get(side, {})
                assert {k: got_side.get(k) for k in want_side} == want_side, (want_c["name"], side)


def psa_violations(warnings):
    return [line for line in warnings.splitlines() if PSA_WARNING in line]


def test_every_child_is_accepted_and_keeps_its_pod_safety(psa_namespace):
    kube = psa_namespace
    run, spec = make_run(kube, "safe", trainer={"gpusPerNode": 2}, sandbox={"slotsPerPod": 2, "isolation": "restricted"},
                         worldModel={"gpusPerReplica": 2})
    built = b.children(run, spec)
    kinds = {o["kind"] for o in built}
    assert {"Job", "Deployment", "ConfigMap", "Service", "NetworkPolicy", "Role"} <= kinds
    stored, warned = {}, {}
    for obj in built:
        key = (obj["kind"], obj["metadata"]["name"])
        stored[key], warnings = server_side_apply(kube, obj)
        warned[key] = psa_violations(warnings)

    workloads = [o for o in built if o["kind"] in WORKLOADS]
    assert {o["metadata"]["name"] for o in workloads} == {"safe-trainer", "safe-sandbox", "safe-calibration",
                                                          "safe-world-model"}
    for obj in workloads:
        key = (obj["kind"], obj["metadata"]["name"])
        assert_pod_carries(obj, stored[key])
        if obj["metadata"]["name"] == "safe-world-model":
            # The apiserver's Pod Security check is live (so the silence below means something),
            # and the vLLM template misses "restricted" only by not promising runAsNonRoot.
            (warning,) = warned[key]
            assert "runAsNonRoot" in warning, warning
            for other in ("allowPrivilegeEscalation", "capabilities", "seccompProfile", "volume", "privileged"):
                assert other not in warning, warning
        else:
            assert warned[key] == [], f"{key} is not 'restricted': {warned[key]}"

    # The default isolation: one field short of "baseline", the seccomp profile, and nothing else.
    default_run, default_spec = make_run(kube, "ns")
    assert default_spec.sandbox.isolation == "namespaces"
    (sandbox_obj,) = [o for o in b.children(default_run, default_spec)
                      if o["kind"] == "Deployment" and o["metadata"]["name"] == "ns-sandbox"]
    stored_default, warnings = server_side_apply(kube, sandbox_obj)
    # What bubblewrap needs on a real node survives the apiserver (no feature gate drops it): a user
    # namespace of the Pod's own and an unmasked /proc.
    assert pod_spec(stored_default)["hostUsers"] is False
    assert pod_spec(stored_default)["containers"][0]["securityContext"]["procMount"] == "Unmasked"
    (warning,) = psa_violations(warnings)
    assert 'container "sandbox" must not set securityContext.seccompProfile.type to "Unconfined"' in warning, warning
    for other in ("allowPrivilegeEscalation", "capabilities", "runAsNonRoot", "AppArmor", "volume", "privileged"):
        assert other not in warning, warning
    # So a namespace enforcing "baseline" refuses its Pods (the operator's users label the
    # sandbox's namespace "privileged", or choose isolation: restricted).
    wait_for(lambda: any("Unconfined" in e.get("message", "") for e in (kube.get("events") or {}).get("items", [])
                         if e["involvedObject"]["kind"] == "ReplicaSet"
                         and e["involvedObject"]["name"].startswith("ns-sandbox")),
             timeout=60, what="the ReplicaSet's FailedCreate event")

    # The figures themselves, as the apiserver stored them.
    sandbox = pod_spec(stored[("Deployment", "safe-sandbox")])
    defaults = b.sandbox_default_resources(2)
    assert defaults == {"cpu": "2250m", "memory": "6912Mi"}
    assert sandbox["containers"][0]["resources"] == {"requests": defaults, "limits": defaults}
    vols = by_name(sandbox["volumes"])
    assert vols["work"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1280Mi"}
    assert vols["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
    trainer = pod_spec(stored[("Job", "safe-trainer")])
    assert by_name(trainer["volumes"])["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert trainer["securityContext"]["fsGroup"] == 65532
    assert trainer["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    vllm = pod_spec(stored[("Deployment", "safe-world-model")])
    assert by_name(vllm["volumes"])["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in vllm["containers"][0]["volumeMounts"]
    assert "runAsNonRoot" not in json.dumps(vllm)

    # The controllers' Pods were admitted (the namespace enforces "baseline") and carry it all.
    for obj in workloads:
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        pods = wait_for(lambda: kube.items("pods", f"wmrl.dev/run=safe,app.kubernetes.io/component={component}"),
                        timeout=60, what=f"{component} pods")
        for pod in pods:
            assert_pod_carries(obj, pod)
    for pod in kube.items("pods", "wmrl.dev/run=safe"):
        for v in pod["spec"].get("volumes", []):
            if (v.get("emptyDir") or {}).get("medium") == "Memory":
                assert v["emptyDir"].get("sizeLimit"), (pod["metadata"]["name"], v)


def test_explicit_sandbox_resources_win_and_stay_valid(psa_namespace):
    """Only a memory limit in the spec: memory is the user's (the apiserver defaults its request to
    the limit on the Pod), cpu gets the default, and the Pod is admitted."""
    kube = psa_namespace
    # isolation: restricted, since the namespace enforces "baseline" (see the module docstring).
    run, spec = make_run(kube, "explicit", mode="real", sandbox={"resources": {"limits": {"memory": "1Gi"}},
                                                                 "isolation": "restricted"})
    for obj in b.children(run, spec):
        if obj["kind"] != "Job":  # the sandbox pool is what this is about
            server_side_apply(kube, obj)
    pods = wait_for(lambda: kube.items("pods", "wmrl.dev/run=explicit,app.kubernetes.io/component=sandbox"),
                    timeout=60, what="sandbox pod")
    resources = pods[0]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "1250m", "memory": "1Gi"}
    assert resources["requests"] == {"cpu": "1250m", "memory": "1Gi"}


def test_client_access_service_is_a_cluster_ip_with_the_pool_behind_it(psa_namespace):
    """spec.sandbox.clientAccess on the real apiserver: the CRD keeps the field, the Service gets a
    cluster IP, and its EndpointSlice lists the pool's Pods (kwok reports them ready)."""
    kube = psa_namespace
    run, spec = make_run(kube, "clients", mode="real",
                         sandbox={"clientAccess": {"enabled": True, "podSelector": {"app": "verl-reward"}},
                                  "isolation": "restricted"})
    assert spec.sandbox.client_access.enabled and spec.sandbox.client_access.pod_selector == {"app": "verl-reward"}
    stored = {}
    for obj in b.children(run, spec):
        if obj["kind"] != "Job":
            stored[(obj["kind"], obj["metadata"]["name"])] = server_side_apply(kube, obj)[0]
    api = stored[("Service", "clients-sandbox-api")]
    assert api["spec"]["type"] == "ClusterIP" and api["spec"]["clusterIP"] not in ("", "None")
    ingress = stored[("NetworkPolicy", "clients-sandbox")]["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {"app": "verl-reward"}}} in ingress
    slices = wait_for(lambda: [s for s in kube.items("endpointslices", "kubernetes.io/service-name=clients-sandbox-api")
                               if s.get("endpoints")], timeout=90, what="endpoints of the API service")
    assert slices[0]["ports"][0]["port"] == 8080
