"""Tests against the real test control plane (tests/cluster)."""

import json
import subprocess
import time
import uuid

import pytest

PHASE = "wmrl.dev/kwok-phase"
COMPLETE_AFTER = "wmrl.dev/kwok-complete-after"


def _json(cluster, *args):
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def _wait_for(pred, timeout=60.0, interval=0.3, what="condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last={last!r})")


@pytest.fixture
def ns(k8s_cluster):
    name = "t-" + uuid.uuid4().hex[:8]
    k8s_cluster.kubectl("create", "namespace", name)
    _wait_for(lambda: k8s_cluster.kubectl("get", "sa", "default", "-n", name,
                                          check=False).returncode == 0,
              what="default ServiceAccount")
    yield name
    k8s_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _apply(cluster, ns, manifest):
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def _job(name, pod_annotations=None, backoff_limit=0):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"annotations": pod_annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox",
                                    "resources": {"requests": {"cpu": "1"}}}],
                },
            },
        },
    }


def _job_pod(cluster, ns, job):
    def get():
        pods = _json(cluster, "get", "pods", "-n", ns, "-l", f"job-name={job}")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running[0]["metadata"]["name"] if running else None
    return _wait_for(get, what=f"a Running pod of job {job}")


def _job_condition(cluster, ns, job, cond, timeout=60):
    cluster.kubectl("wait", "-n", ns, f"--for=condition={cond}", f"job/{job}",
                    f"--timeout={timeout}s", timeout=timeout + 10)


# --------------------------------------------------------------------------


def test_versions(k8s_cluster):
    v = k8s_cluster.versions
    out = json.loads(k8s_cluster.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == v["k8s"]
    assert out["clientVersion"]["gitVersion"] == v["k8s"]
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        res = subprocess.run([str(k8s_cluster.binary(b)), "--version"],
                             capture_output=True, text=True, check=True)
        assert res.stdout.strip() == f"Kubernetes {v['k8s']}", res.stdout
    etcd = subprocess.run([str(k8s_cluster.binary("etcd")), "--version"],
                          capture_output=True, text=True, check=True).stdout
    assert f"etcd Version: {v['etcd'].lstrip('v')}" in etcd, etcd
    kwok = subprocess.run([str(k8s_cluster.binary("kwok")), "--version"],
                          capture_output=True, text=True, check=True).stdout
    assert v["kwok"].lstrip("v") in kwok, kwok
    helm = k8s_cluster.helm("version", "--short").stdout
    assert helm.startswith(v["helm"]), helm


def test_nodes(k8s_cluster):
    nodes = {n["metadata"]["name"]: n for n in _json(k8s_cluster, "get", "nodes")["items"]}
    assert {"kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0", "kwok-gpu-1"} <= set(nodes)
    for name in ("kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0", "kwok-gpu-1"):
        n = nodes[name]
        assert n["metadata"]["labels"]["type"] == "kwok"
        assert not n["spec"].get("taints")
        ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        gpu = name.startswith("kwok-gpu")
        for field in ("capacity", "allocatable"):
            res = n["status"][field]
            assert res["cpu"] == ("64" if gpu else "16")
            assert res["memory"] == ("512Gi" if gpu else "64Gi")
            if gpu:
                assert res["nvidia.com/gpu"] == "8"
            else:
                assert "nvidia.com/gpu" not in res
        if gpu:
            assert n["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


def test_deployment_pods_become_ready(k8s_cluster, ns):
    _apply(k8s_cluster, ns, {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    })
    k8s_cluster.kubectl("rollout", "status", "-n", ns, "deployment/web", "--timeout=60s",
                        timeout=70)
    pods = _json(k8s_cluster, "get", "pods", "-n", ns, "-l", "app=web")["items"]
    assert len(pods) == 3
    for p in pods:
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["nodeName"].startswith("kwok-")
        assert p["status"].get("podIP")
        cond = {c["type"]: c["status"] for c in p["status"]["conditions"]}
        assert cond["Ready"] == "True"


def test_job_succeeds_when_pod_annotated(k8s_cluster, ns):
    _apply(k8s_cluster, ns, _job("ok"))
    pod = _job_pod(k8s_cluster, ns, "ok")
    # the pod stays Running until the test decides otherwise
    time.sleep(1)
    assert _json(k8s_cluster, "get", "pod", "-n", ns, pod)["status"]["phase"] == "Running"
    k8s_cluster.kubectl("annotate", "-n", ns, "pod", pod, f"{PHASE}=Succeeded")
    _job_condition(k8s_cluster, ns, "ok", "Complete")
    p = _json(k8s_cluster, "get", "pod", "-n", ns, pod)
    assert p["status"]["phase"] == "Succeeded"
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0


def test_job_fails_when_pod_annotated(k8s_cluster, ns):
    _apply(k8s_cluster, ns, _job("bad", backoff_limit=0))
    pod = _job_pod(k8s_cluster, ns, "bad")
    k8s_cluster.kubectl("annotate", "-n", ns, "pod", pod, f"{PHASE}=Failed")
    _job_condition(k8s_cluster, ns, "bad", "Failed")
    p = _json(k8s_cluster, "get", "pod", "-n", ns, pod)
    assert p["status"]["phase"] == "Failed"
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1


def test_job_complete_after(k8s_cluster, ns):
    _apply(k8s_cluster, ns, _job("timed", pod_annotations={COMPLETE_AFTER: "2s"}))
    t0 = time.time()
    _job_condition(k8s_cluster, ns, "timed", "Complete")
    assert time.time() - t0 >= 2


def test_gpu_pod_lands_on_gpu_node(k8s_cluster, ns):
    _apply(k8s_cluster, ns, {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu"},
        "spec": {"containers": [{"name": "c", "image": "cuda",
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    })
    k8s_cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/gpu",
                        "--timeout=60s", timeout=70)
    p = _json(k8s_cluster, "get", "pod", "-n", ns, "gpu")
    assert p["spec"]["nodeName"] in ("kwok-gpu-0", "kwok-gpu-1")


def test_garbage_collection(k8s_cluster, ns):
    k8s_cluster.kubectl("create", "configmap", "owner", "-n", ns)
    uid = _json(k8s_cluster, "get", "configmap", "owner", "-n", ns)["metadata"]["uid"]
    _apply(k8s_cluster, ns, {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "child", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]},
    })
    k8s_cluster.kubectl("delete", "configmap", "owner", "-n", ns)
    _wait_for(lambda: k8s_cluster.kubectl("get", "configmap", "child", "-n", ns,
                                          check=False).returncode != 0,
              what="child garbage collected")


def test_deleted_pod_is_removed(k8s_cluster, ns):
    k8s_cluster.kubectl("run", "sleeper", "-n", ns, "--image=busybox", "--restart=Never")
    k8s_cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/sleeper",
                        "--timeout=60s", timeout=70)
    k8s_cluster.kubectl("delete", "pod", "sleeper", "-n", ns, "--timeout=30s", timeout=40)
    assert k8s_cluster.kubectl("get", "pod", "sleeper", "-n", ns, check=False).returncode != 0


def test_helm_install(k8s_cluster, ns, tmp_path):
    chart = tmp_path / "mini"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: mini\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n")
    k8s_cluster.helm("install", "rel", str(chart), "-n", ns, "--set", "greeting=hi")
    cm = _json(k8s_cluster, "get", "configmap", "rel-cm", "-n", ns)
    assert cm["data"]["greeting"] == "hi"
