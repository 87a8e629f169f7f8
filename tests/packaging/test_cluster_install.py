"""The chart and the plain manifests against the real control plane (tests/cluster: real
kube-apiserver, controller-manager, scheduler; kwok nodes run the pods' "containers")."""

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "wmrl-operator"
CRD = ROOT / "manifests" / "crds" / "wmrl.dev_wmrlruns.yaml"
INSTALL = ROOT / "manifests" / "install.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def _run(call, *args, **kw):
    """A kubectl/helm call whose failure shows its stderr."""
    res = call(*args, check=False, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, args))} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def _template(cluster, *values, release="wmrl", namespace="wmrl-system"):
    return _docs(_run(cluster.helm, "template", release, str(CHART), "--namespace", namespace, *values))


def _strip_helm_labels(obj):
    """Drop the labels only Helm adds, anywhere in the object."""
    if isinstance(obj, dict):
        return {k: _strip_helm_labels(v) for k, v in obj.items() if k not in HELM_ONLY_LABELS}
    if isinstance(obj, list):
        return [_strip_helm_labels(v) for v in obj]
    return obj


def _by_kind(docs):
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}


@pytest.fixture
def namespace(k8s_cluster):
    created = []

    def make():
        name = "pkg-" + uuid.uuid4().hex[:8]
        _run(k8s_cluster.kubectl, "create", "namespace", name)
        created.append(name)
        return name

    yield make
    for name in created:
        k8s_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def crd(k8s_cluster):
    _run(k8s_cluster.kubectl, "apply", "-f", str(CRD))
    _run(k8s_cluster.kubectl, "wait", "--for=condition=Established", "crd/wmrlruns.wmrl.dev", "--timeout=60s")


# ---------------------------------------------------------------- helm, offline


@pytest.mark.parametrize("values", [[], ["--set", "watchedNamespaces={team-a,team-b}"], ["--set", "webhook.enabled=true"],
                                    ["--set", "replicaCount=1", "--set", "leaderElection.enabled=false"]],
                         ids=["defaults", "watched-namespaces", "webhook", "one-replica-no-lease"])
def test_helm_lint_is_clean(k8s_cluster, values):
    out = _run(k8s_cluster.helm, "lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values,message", [
    (["--set", "logLevel=loud"], "/logLevel"),
    (["--set", "watchedNamespaces={Team_A}"], "/watchedNamespaces/0"),
    (["--set", "webhook.port=0"], "/webhook/port"),
    (["--set", "replicaCount=0"], "/replicaCount"),
], ids=["log-level", "namespace-name", "port", "no-replicas"])
def test_values_schema_refuses_bad_values(k8s_cluster, values, message):
    res = k8s_cluster.helm("lint", "--strict", str(CHART), *values, check=False)
    assert res.returncode != 0
    assert message in res.stdout + res.stderr


def test_two_replicas_without_the_lease_are_refused(k8s_cluster):
    """Both would reconcile: the chart fails to render instead."""
    res = k8s_cluster.helm("template", "wmrl", str(CHART), "--set", "leaderElection.enabled=false", check=False)
    assert res.returncode != 0
    assert "replicaCount > 1 needs leaderElection.enabled" in res.stderr


def test_chart_renders_exactly_install_yaml(k8s_cluster):
    """`helm install wmrl` with default values and `kubectl apply -f install.yaml` create the same objects."""
    rendered = _by_kind(_strip_helm_labels(_template(k8s_cluster)))
    plain = _by_kind(d for d in _docs(INSTALL.read_text()) if d["kind"] not in ("Namespace", "CustomResourceDefinition"))
    assert rendered.keys() == plain.keys()
    for key, obj in plain.items():
        assert rendered[key] == obj, key


@pytest.mark.parametrize("values", [["--set", "watchedNamespaces={team-a,team-b}", "--set", "logLevel=debug"],
                                    ["--set", "webhook.enabled=true", "--set", "logFormat=text"]],
                         ids=["watched-namespaces", "webhook"])
def test_rendered_args_are_what_wmrl_operator_accepts(k8s_cluster, values):
    import argparse

    from wmrl_operator.main import add_arguments

    deployment = _by_kind(_template(k8s_cluster, *values))[("Deployment", "wmrl-system", "wmrl-operator")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    if args.namespace:
        assert args.namespace == ["team-a", "team-b"] and args.verbose
    else:
        assert args.webhook and args.webhook_port == 9443 and args.log_format == "text"


def test_watched_namespaces_get_a_role_each_and_no_cluster_wide_access(k8s_cluster):
    docs = _template(k8s_cluster, "--set", "watchedNamespaces={team-a,team-b}")
    kinds = _by_kind(docs)
    for ns in ("team-a", "team-b"):
        assert ("Role", ns, "wmrl-operator") in kinds and ("RoleBinding", ns, "wmrl-operator") in kinds
    cluster_role = kinds[("ClusterRole", None, "wmrl-operator")]
    role = kinds[("Role", "team-a", "wmrl-operator")]
    assert not [r for r in cluster_role["rules"] if r in role["rules"]], "namespaced rules granted cluster-wide"
    args = kinds[("Deployment", "wmrl-system", "wmrl-operator")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args


def test_webhook_adds_service_port_and_rules(k8s_cluster):
    default = _by_kind(_template(k8s_cluster))
    kinds = _by_kind(_template(k8s_cluster, "--set", "webhook.enabled=true"))
    service = kinds[("Service", "wmrl-system", "wmrl-operator-webhook")]
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    container = kinds[("Deployment", "wmrl-system", "wmrl-operator")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    assert "--webhook" in container["args"]
    assert "--webhook-host=wmrl-operator-webhook.wmrl-system.svc" in container["args"]
    key = ("ClusterRole", None, "wmrl-operator")
    added = [r for r in kinds[key]["rules"] if r not in default[key]["rules"]]
    assert any("admissionregistration.k8s.io" in r.get("apiGroups", ()) for r in added)


# ---------------------------------------------------------------- on the API server


def test_helm_install_runs_the_operator_then_uninstalls(k8s_cluster, namespace, crd):
    ns = namespace()
    release = "wmrl-" + ns
    _run(k8s_cluster.helm, "install", release, str(CHART), "--namespace", ns, "--wait", "--timeout", "180s")
    try:
        deployment = json.loads(_run(k8s_cluster.kubectl, "get", "deployment", "-n", ns, "-o", "json"))["items"]
        assert len(deployment) == 1
        assert deployment[0]["status"].get("availableReplicas") == 2  # one active, one standby (Lease)
        pods = json.loads(_run(k8s_cluster.kubectl, "get", "pods", "-n", ns, "-o", "json"))["items"]
        assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
        status = _run(k8s_cluster.helm, "status", release, "--namespace", ns, "-o", "json")
        assert json.loads(status)["info"]["status"] == "deployed"
    finally:
        _run(k8s_cluster.helm, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "120s")
    left = k8s_cluster.kubectl("get", "clusterrole", f"{release}-wmrl-operator", check=False)
    assert left.returncode != 0 and "NotFound" in left.stderr
    assert json.loads(_run(k8s_cluster.kubectl, "get", "deployment", "-n", ns, "-o", "json"))["items"] == []


def test_least_privilege_variant_is_accepted_by_the_api_server(k8s_cluster, namespace, crd):
    """Roles in watched namespaces + the webhook: a server-side dry run of every rendered object."""
    home, team_a, team_b = namespace(), namespace(), namespace()
    text = _run(k8s_cluster.helm, "template", "wmrl", str(CHART), "--namespace", home,
                "--set", f"watchedNamespaces={{{team_a},{team_b}}}", "--set", "webhook.enabled=true")
    _run(k8s_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", input=text)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_api_server(k8s_cluster, namespace, crd, path):
    out = _run(k8s_cluster.kubectl, "apply", "--dry-run=server", "-n", namespace(), "-f", str(path))
    assert out.count("wmrlrun.wmrl.dev/") == len(_docs(path.read_text()))


def test_install_yaml_applies_and_the_operator_runs(k8s_cluster, crd):
    _run(k8s_cluster.kubectl, "apply", "-f", str(INSTALL))
    objects = [d for d in _docs(INSTALL.read_text()) if d["kind"] not in ("Namespace", "CustomResourceDefinition")]
    try:
        _run(k8s_cluster.kubectl, "-n", "wmrl-system", "wait", "--for=condition=Available",
             "deployment/wmrl-operator", "--timeout=120s")
        _run(k8s_cluster.kubectl, "auth", "can-i", "patch", "wmrlruns.wmrl.dev", "--subresource=status", "--all-namespaces",
             "--as=system:serviceaccount:wmrl-system:wmrl-operator")
    finally:
        # Everything but the CRD (shared with the other tests) and the namespace (deleted last).
        k8s_cluster.kubectl("delete", "--wait=true", "-f", "-", input=yaml.safe_dump_all(objects), check=False)
        k8s_cluster.kubectl("delete", "namespace", "wmrl-system", "--wait=false", check=False)


def test_invalid_example_is_refused_naming_the_field(k8s_cluster, namespace, crd):
    run = _docs((ROOT / "manifests/examples/small-cpu-run.yaml").read_text())[0]
    run["spec"]["algorithm"]["groupSize"] = 1
    res = k8s_cluster.kubectl("apply", "--dry-run=server", "-n", namespace(), "-f", "-",
                              input=json.dumps(run), check=False)
    assert res.returncode != 0
    assert "spec.algorithm.groupSize" in res.stderr
