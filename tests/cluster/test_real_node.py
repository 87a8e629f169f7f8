"""The real kubelet node beside the kwok nodes (tests/cluster/README.md, "Real node"): real
containers through containerd and runc, a bridge CNI, kube-proxy Services and CoreDNS, and a
host put back as it was when the node stops."""

import hashlib
import io
import ipaddress
import json
import os
import subprocess
import tarfile
import time
import uuid

import pytest
import wmrl_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

nc = wmrl_cluster.nodeconfig
hoststate = wmrl_cluster.hoststate


def _wait_for(pred, timeout=90.0, interval=0.5, what="condition"):
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
    name = "rn-" + uuid.uuid4().hex[:8]
    k8s_cluster.kubectl("create", "namespace", name)
    _wait_for(lambda: k8s_cluster.kubectl("get", "sa", "default", "-n", name,
                                          check=False).returncode == 0,
              what="default ServiceAccount")
    yield name
    k8s_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pod(node, name, args, labels=None, port=None):
    container = {"name": "main", "image": node.images["nodetool"], "imagePullPolicy": "Never",
                 "command": ["/nodetool", *args]}
    if port:
        container["ports"] = [{"containerPort": port}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {**node.placement(), "terminationGracePeriodSeconds": 1,
                     "containers": [container]}}


def _apply(cluster, ns, *objs):
    cluster.kubectl("apply", "-n", ns, "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


def _ready_pod(cluster, ns, name, timeout=120):
    def get():
        pod = json.loads(cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return pod if conds.get("Ready") == "True" else None
    try:
        return _wait_for(get, timeout=timeout, what=f"pod {ns}/{name} Ready")
    except AssertionError:
        print(cluster.kubectl("describe", "pod", name, "-n", ns, check=False).stdout)
        raise


def _exec(cluster, ns, pod, *args, check=True):
    res = cluster.kubectl("exec", "-n", ns, pod, "--", "/nodetool", *args, check=False,
                          timeout=60)
    if check:
        assert res.returncode == 0, f"nodetool {' '.join(args)} in {pod}: exit " \
            f"{res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res


def test_node_registers_ready_labelled_and_tainted_beside_kwok(k8s_cluster, real_node):
    nodes = {n["metadata"]["name"]: n for n in
             json.loads(k8s_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    assert {"kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0", "kwok-gpu-1"} <= set(nodes)
    node = nodes[real_node.name]
    assert real_node.name == "real-0"
    assert node["metadata"]["labels"]["wmrl.dev/real-node"] == "true"
    assert {"key": "wmrl.dev/real-node", "value": "true", "effect": "NoSchedule"} in \
        node["spec"]["taints"]
    conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conds["Ready"] == "True"
    addrs = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addrs["InternalIP"] == real_node.node_ip
    assert not ipaddress.ip_address(real_node.node_ip).is_loopback
    info = node["status"]["nodeInfo"]
    versions = k8s_cluster.versions
    assert info["kubeletVersion"] == versions["k8s"]
    assert info["containerRuntimeVersion"] == "containerd://" + versions["containerd"].lstrip("v")
    # the images the node was started with are there, under their full names
    assert set(real_node.images.values()) <= set(real_node.image_names())


def test_node_binaries_report_their_versions(k8s_cluster, real_node):
    v = k8s_cluster.versions

    def out(name, flag="--version"):
        return subprocess.run([str(wmrl_cluster.binary(name)), flag], capture_output=True,
                              text=True, check=True).stdout
    assert out("kubelet").strip() == f"Kubernetes {v['k8s']}"
    assert out("kube-proxy").strip() == f"Kubernetes {v['k8s']}"
    assert out("containerd").split()[2] == v["containerd"]
    assert out("ctr").split()[2] == v["containerd"]
    assert out("runc").splitlines()[0] == f"runc version {v['runc'].lstrip('v')}"
    assert "libseccomp: 2." in out("runc")
    assert out("coredns", "-version").splitlines()[0] == f"CoreDNS-{v['coredns'].lstrip('v')}"
    assert real_node.ctr == wmrl_cluster.binary("ctr") and real_node.containerd_socket.is_socket()


def test_pod_runs_on_the_bridge_with_logs_and_exec(k8s_cluster, real_node, ns):
    _apply(k8s_cluster, ns, _pod(real_node, "hello", ["serve", "-text", "hello"], port=8080))
    pod = _ready_pod(k8s_cluster, ns, "hello")
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["hostIP"] == real_node.node_ip
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.pod_cidr)

    logs = k8s_cluster.kubectl("logs", "-n", ns, "hello").stdout
    assert 'serving "hello" on :8080' in logs
    resolv = _exec(k8s_cluster, ns, "hello", "cat", "/etc/resolv.conf").stdout
    assert f"nameserver {real_node.dns_ip}" in resolv
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in resolv
    # the Pod's own server, over the Pod network, from inside the Pod
    ip = pod["status"]["podIP"]
    assert _exec(k8s_cluster, ns, "hello", "get", f"http://{ip}:8080/").stdout == "hello\n"
    # exec reports the command's exit status
    failed = _exec(k8s_cluster, ns, "hello", "cat", "/no/such/file", check=False)
    assert failed.returncode != 0 and "no such file" in failed.stderr


def _docker_archive(path, repo_tag, files, entrypoint):
    """A `docker save` archive (manifest.json with RepoTags), as Docker or buildah write it."""
    layer = wmrl_cluster._sibling("ociimage").layer(files)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": entrypoint},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
                         }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [repo_tag],
                            "Layers": ["layer0/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in (("manifest.json", manifest), (config_name, config),
                           ("layer0/layer.tar", layer)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_docker_archive_imported_by_its_short_name_runs(k8s_cluster, real_node, ns, tmp_path):
    nodetool = wmrl_cluster.own_image("nodetool")[1].with_name("nodetool")
    tag = f"wmrl-test/docker-archive:{uuid.uuid4().hex[:8]}"
    archive = _docker_archive(tmp_path / "img.tar", tag, {"/bin/tool": nodetool.read_bytes()},
                              ["/bin/tool"])
    # the CRI's name for a short name is the docker.io one, and that is what import gives
    assert real_node.import_image(archive) == [f"docker.io/{tag}"]
    pod = _pod(real_node, "docker-archive", [])
    container = pod["spec"]["containers"][0]
    del container["command"]  # the image's entrypoint
    container.update(image=tag, args=["echo", "from", "docker"])
    pod["spec"]["restartPolicy"] = "Never"
    _apply(k8s_cluster, ns, pod)

    def finished():
        p = json.loads(k8s_cluster.kubectl("get", "pod", "docker-archive", "-n", ns, "-o",
                                           "json").stdout)
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None
    assert _wait_for(finished, what="the pod to finish")["status"]["phase"] == "Succeeded"
    assert k8s_cluster.kubectl("logs", "-n", ns, "docker-archive").stdout == "from docker\n"


def test_a_user_namespaced_pod_with_an_unmasked_proc_runs(k8s_cluster, real_node, ns):
    """hostUsers: false (containerd 2 and runc 1.3 map the Pod's root to an unprivileged
    range) with procMount: Unmasked, which the sandbox's namespaced isolation needs."""
    pod = _pod(real_node, "userns", ["sleep"])
    pod["spec"]["hostUsers"] = False
    pod["spec"]["containers"][0]["securityContext"] = {"procMount": "Unmasked"}
    _apply(k8s_cluster, ns, pod)
    _ready_pod(k8s_cluster, ns, "userns")
    inside, outside, count = _exec(k8s_cluster, ns, "userns", "cat",
                                   "/proc/self/uid_map").stdout.split()
    assert inside == "0" and int(outside) > 0 and int(count) == 65536


def test_pods_without_the_toleration_stay_on_kwok_nodes(k8s_cluster, real_node, ns):
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"plain-{i}"},
             "spec": {"containers": [{"name": "main", "image": "busybox"}]}} for i in range(6)]
    _apply(k8s_cluster, ns, *pods)

    def placed():
        items = json.loads(k8s_cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
        nodes = [p["spec"].get("nodeName") for p in items]
        return nodes if len(nodes) == 6 and all(nodes) else None
    nodes = _wait_for(placed, what="6 pods scheduled")
    assert real_node.name not in nodes and all(n.startswith("kwok-") for n in nodes)


def test_cluster_dns_services_and_the_apiserver_from_a_pod(k8s_cluster, real_node, ns):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    _apply(k8s_cluster, ns,
           _pod(real_node, "web", ["serve", "-text", "from-web"], labels={"app": "web"}, port=8080),
           _pod(real_node, "client", ["sleep"]), service)
    _ready_pod(k8s_cluster, ns, "web")
    _ready_pod(k8s_cluster, ns, "client")
    cluster_ip = json.loads(k8s_cluster.kubectl("get", "svc", "web", "-n", ns, "-o",
                                                "json").stdout)["spec"]["clusterIP"]

    looked_up = _exec(k8s_cluster, ns, "client", "lookup",
                      "kubernetes.default.svc.cluster.local").stdout.split()
    assert looked_up == [wmrl_cluster.SERVICE_FIRST_IP]
    assert _exec(k8s_cluster, ns, "client", "lookup", "web").stdout.split() == [cluster_ip]

    # kube-proxy: the ClusterIP, by address and by name, reaches the Pod behind it (kube-proxy
    # may take a moment to program a new Service)
    def through_service():
        res = _exec(k8s_cluster, ns, "client", "get", "-timeout", "3s", f"http://{cluster_ip}/",
                    check=False)
        return res.stdout if res.returncode == 0 else None
    assert _wait_for(through_service, timeout=60, what="the web Service") == "from-web\n"
    assert _exec(k8s_cluster, ns, "client", "get",
                 f"http://web.{ns}.svc.cluster.local/").stdout == "from-web\n"

    # the apiserver, through the kubernetes Service, verified with the Pod's service account
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    attempts = []

    def apiserver():
        res = _exec(k8s_cluster, ns, "client", "get", "-ca", f"{sa}/ca.crt", "-token",
                    f"{sa}/token", "https://kubernetes.default.svc/api", check=False)
        attempts.append(res.stderr.strip())
        return res.stdout if res.returncode == 0 else None
    try:
        body = _wait_for(apiserver, timeout=60, what="the apiserver from the Pod")
    finally:
        print("apiserver attempts:", attempts)
    assert json.loads(body)["kind"] == "APIVersions"
    assert len(attempts) <= 3, attempts  # a retry or two for a busy machine, not more

    # nothing outside cluster.local is answered (no forwarding, no internet)
    outside = _exec(k8s_cluster, ns, "client", "lookup", "example.com.", check=False)
    assert outside.returncode != 0 and "no such host" in outside.stderr


def test_stopping_the_node_restores_the_host(k8s_cluster, real_node, ns):
    """Stop the node with a Pod running and check the host against the state recorded before
    it started; then start it again for the rest of the session."""
    lay = nc.Layout(real_node.root)
    others = [pid for pid in wmrl_cluster._live_pids(lay.holders) if pid != os.getpid()]
    if others:
        pytest.skip(f"other test sessions (pids {others}) use the real node; not stopping it")
    _apply(k8s_cluster, ns, _pod(real_node, "victim", ["sleep"]))
    _ready_pod(k8s_cluster, ns, "victim")
    recorded = json.loads(lay.record.read_text())
    ephemeral = lay.ephemeral.exists()  # started by a test session, not by `up --real-node`
    # the node did change the host (else this test would prove nothing)
    assert hoststate.leftovers(lay, before=recorded)
    assert any(c.startswith("nat/KUBE-") for c in hoststate.iptables_chains()["iptables"])
    assert hoststate.link_exists(nc.BRIDGE)

    wmrl_cluster.stop_real_node(k8s_cluster.state_dir)
    try:
        assert hoststate.leftovers(lay, before=recorded) == []
        assert not lay.record.exists() and not lay.root.exists()
        now = hoststate.read_sysctls(recorded["sysctls"])
        assert nc.sysctls_to_restore(recorded["sysctls"], now) == {}
        assert all(not chains for chains in hoststate.iptables_chains().values())
        for comp in nc.COMPONENTS:
            assert not wmrl_cluster._alive(wmrl_cluster._Paths(k8s_cluster.state_dir), comp)
        # idempotent
        wmrl_cluster.stop_real_node(k8s_cluster.state_dir)
    finally:  # as it was: running, held by this session, stopped at its end if it was before
        wmrl_cluster.acquire_real_node(k8s_cluster)
        if not ephemeral:
            lay.ephemeral.unlink()
