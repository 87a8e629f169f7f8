"""Writes only for children that are missing or differ (issue 14, item 1), on the real apiserver.

A real `wmrl operator` process; its /metrics (``wmrl_operator_child_writes_total``) says which
children it wrote and which it found already as wanted. Without the cache every spec reconcile
(a restart resumes every run) rewrites every child, and the first test sees writes.
"""

import json
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from operator_helpers import Operator, run_manifest, wait_for

pytestmark = pytest.mark.cluster

RUNS = ("rho-a", "rho-b", "rho-c")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(port):
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _writes(port, *results):
    """Children created (known absent), applied or skipped (the ``results`` named), by kind."""
    out = {}
    for s in _samples(port):
        if s.name == "wmrl_operator_child_writes_total" and s.labels.get("result") in results:
            out[s.labels["kind"]] = out.get(s.labels["kind"], 0) + s.value
    return out


def _spec_reconciles(port):
    return sum(s.value for s in _samples(port) if s.name == "wmrl_operator_reconciles_total"
               and s.labels.get("trigger") == "spec" and s.labels.get("result") == "ok")


def _start(crd_installed, namespace, tmp_path, name):
    port = _free_port()
    op = Operator(crd_installed.kubeconfig, namespace, tmp_path / f"{name}.log",
                  extra_args=("--metrics-port", str(port), "--cache-children")).start()
    wait_for(lambda: _try(lambda: _samples(port)), timeout=60, what=f"{name}'s /metrics")
    return op, port


def _try(call):
    try:
        return call()
    except httpx.HTTPError:
        return None


@pytest.fixture(scope="module")
def resumed(crd_installed, namespace, kube, tmp_path_factory):
    """Three runs made by one operator process, then resumed by a second one (the first stopped)."""
    tmp = tmp_path_factory.mktemp("children-cache")
    first, port = _start(crd_installed, namespace, tmp, "first")
    try:
        for name in RUNS:
            kube.apply(run_manifest(name))
        for name in RUNS:
            wait_for(lambda: kube.get("job", f"{name}-trainer"), timeout=60, what=f"{name}'s trainer Job")
        first_writes = _writes(port, "created", "applied")
    finally:
        first.stop()
    second, port = _start(crd_installed, namespace, tmp, "second")
    wait_for(lambda: _spec_reconciles(port) >= len(RUNS), timeout=60, what="the runs resumed")
    yield second, port, first_writes
    second.stop()


def test_a_restarted_operator_resumes_its_runs_without_rewriting_a_child(resumed):
    _, port, first_writes = resumed
    assert sum(first_writes.values()) >= 10 * len(RUNS)  # the first process really wrote them
    assert _writes(port, "created", "applied") == {}
    skipped = _writes(port, "skipped")
    assert set(skipped) == set(first_writes)  # every kind it wrote before is known and unchanged
    assert sum(skipped.values()) >= 10 * len(RUNS)


def test_a_child_deleted_by_hand_is_made_again(resumed, kube):
    _, port, _ = resumed
    old = kube.get("service", "rho-a-sandbox")["metadata"]["uid"]
    kube.run("delete", "service", "rho-a-sandbox", "-n", kube.ns)
    new = wait_for(lambda: (kube.get("service", "rho-a-sandbox") or {}).get("metadata", {}).get("uid"),
                   timeout=30, what="the sandbox Service made again")
    assert new != old
    assert _writes(port, "created").get("Service") == 1  # that one (known gone: a POST), and nothing else
    assert set(_writes(port, "created", "applied")) == {"Service"}


def test_a_field_edited_by_hand_after_our_write_is_written_back_at_the_next_spec_reconcile(resumed, kube):
    """This process writes the Deployment (a new sandbox image in the spec), someone edits it, and
    the next spec reconcile (here: an annotation on the run) writes it back: the stamp alone still
    matches, only the generation says it changed."""
    _, port, _ = resumed
    name, ours = "rho-b-sandbox", "example.com/sandbox:2"
    image = lambda: kube.get("deployment", name)["spec"]["template"]["spec"]["containers"][0]["image"]
    before = _writes(port, "applied").get("Deployment", 0)
    kube.run("patch", "wmrlrun", "rho-b", "-n", kube.ns, "--type=merge", "-p",
             json.dumps({"spec": {"sandbox": {"image": ours}}}))
    wait_for(lambda: image() == ours, timeout=30, what="the new sandbox image applied")
    # Counted once the write is done (the first apply over a POSTed child is followed by two more requests).
    deployments = lambda: _writes(port, "applied").get("Deployment", 0)
    wait_for(lambda: deployments() >= before + 1, timeout=10, what="the write counted")
    assert deployments() == before + 1
    kube.run("set", "image", f"deployment/{name}", "-n", kube.ns, "*=example.invalid/not-ours:1")
    kube.run("annotate", "wmrlrun", "rho-b", "-n", kube.ns, "example.com/touch=1")
    wait_for(lambda: image() == ours, timeout=30, what="the sandbox image written back")
    wait_for(lambda: deployments() >= before + 2, timeout=10, what="the write counted")
    assert deployments() == before + 2


def test_a_field_the_spec_drops_is_removed_from_a_child_first_created_by_post(resumed, kube):
    """A child known to be absent is created with a POST, whose fields the apiserver records as an
    ``Update``; a server-side apply alone would then keep a field that a later manifest leaves out.
    The operator takes those fields over at its first apply, so the field goes."""
    _, port, _ = resumed
    name = "rho-d-sandbox"
    template = lambda: kube.get("deployment", name)["spec"]["template"]["spec"]
    managers = lambda: {(e["manager"], e["operation"]) for e in json.loads(kube.run(
        "get", "deployment", name, "-n", kube.ns, "-o", "json", "--show-managed-fields").stdout)["metadata"]["managedFields"]}
    created = _writes(port, "created").get("Deployment", 0)
    kube.apply(run_manifest("rho-d", sandbox={"runtimeClassName": "gvisor"}))
    wait_for(lambda: kube.get("deployment", name), timeout=30, what="the sandbox Deployment")
    assert template()["runtimeClassName"] == "gvisor"
    assert ("wmrl-operator", "Update") in managers()  # made by a POST
    assert _writes(port, "created").get("Deployment", 0) >= created + 1
    res = kube.run("patch", "wmrlrun", "rho-d", "-n", kube.ns, "--type=json", "-p",
                   '[{"op":"remove","path":"/spec/sandbox/runtimeClassName"}]', check=False)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: "runtimeClassName" not in template(), timeout=30, what="runtimeClassName removed")
    assert ("wmrl-operator", "Update") not in managers() and ("wmrl-operator", "Apply") in managers()
