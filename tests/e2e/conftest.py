"""Fixtures of the end-to-end suite on the real node (docs/e2e.md): the project's images built here
(tests/images) and imported into the node's containerd, the operator installed by its Helm chart onto
the node, a namespace whose WMRLRuns that operator reconciles, and a run whose sandbox pool and
calibration service run there."""

import json
import sys

import pytest

from e2e_helpers import (CHART, RELEASE, ROOT, RUNS_NS, SYSTEM_NS, describe, unique, wait_for,
                         wait_ready_sandbox)

sys.path.insert(0, str(ROOT / "tests" / "images"))
import images as project_images  # noqa: E402  (tests/images/images.py: stdlib only)


@pytest.fixture(scope="session")
def e2e_images(real_node):
    """name -> image reference of the operator and sandbox images, present in the real node's containerd.
    The CPU trainer image (several GB) is built and imported only for the test that trains."""
    return _imported(real_node, ("operator", "sandbox"))


@pytest.fixture(scope="session")
def trainer_image(real_node):
    """The CPU trainer image's reference, present in the real node's containerd."""
    return _imported(real_node, ("trainer-cpu",))["trainer-cpu"]


def _imported(real_node, names):
    built = project_images.build(names)
    present = set(real_node.image_names())
    for b in built.values():
        if b.ref not in present:
            real_node.import_image(b.tarball)
    return {name: b.ref for name, b in built.items()}


@pytest.fixture(scope="session")
def runs_namespace(k8s_cluster):
    k8s_cluster.kubectl("create", "namespace", RUNS_NS, check=False)
    wait_for(lambda: k8s_cluster.kubectl("get", "sa", "default", "-n", RUNS_NS, check=False).returncode == 0,
             what="the default ServiceAccount")
    yield RUNS_NS
    k8s_cluster.kubectl("delete", "wmrlruns", "--all", "-n", RUNS_NS, "--wait=true", "--timeout=120s", check=False)
    k8s_cluster.kubectl("delete", "namespace", RUNS_NS, "--wait=false", check=False)


def _split(ref):
    repository, tag = ref.rsplit(":", 1)
    return repository, tag


@pytest.fixture(scope="session")
def e2e_operator(k8s_cluster, real_node, e2e_images, runs_namespace, tmp_path_factory):
    """`helm install` of the chart: two operator replicas on the real node, watching RUNS_NS."""
    repository, tag = _split(e2e_images["operator"])
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 2,
        "watchedNamespaces": [runs_namespace],
        "logFormat": "text",
        **real_node.placement(),
    }
    path = tmp_path_factory.mktemp("helm") / "values.json"
    path.write_text(json.dumps(values))
    k8s_cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    # Earlier tests apply the same CRD with kubectl (client-side); Helm 4 installs a chart's CRDs by
    # server-side apply, which refuses the fields kubectl owns unless told to take them over.
    res = k8s_cluster.helm("install", RELEASE, str(CHART), "-n", SYSTEM_NS, "-f", str(path), "--wait",
                           "--force-conflicts", "--timeout", "300s", check=False, timeout=420)
    if res.returncode != 0:  # helm's own timeout comes first, so it says what it waited for
        raise AssertionError(f"helm install failed:\n{res.stdout}\n{res.stderr}\n"
                             + describe(k8s_cluster, SYSTEM_NS, "pods")
                             + k8s_cluster.kubectl("get", "events", "-n", SYSTEM_NS, "--sort-by=.lastTimestamp",
                                                   check=False).stdout)
    yield {"release": RELEASE, "namespace": SYSTEM_NS}
    k8s_cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s", check=False)
    k8s_cluster.kubectl("delete", "namespace", SYSTEM_NS, "--wait=false", check=False)




@pytest.fixture(scope="session")
def sandbox_run(k8s_cluster, real_node, e2e_images, e2e_operator, runs_namespace):
    """A WMRLRun with the default isolation whose sandbox pool (2 slots) and calibration service run on
    the real node, reconciled by the operator the chart installed. Yields (name, sandbox Pod)."""
    from e2e_runs import sandbox_only_run

    name = unique("sbx")
    manifest = sandbox_only_run(name, e2e_images, real_node.placement())
    k8s_cluster.kubectl("apply", "-n", runs_namespace, "-f", "-", input=json.dumps(manifest))

    pod = wait_ready_sandbox(k8s_cluster, runs_namespace, name)
    yield name, pod
    k8s_cluster.kubectl("delete", "wmrlrun", name, "-n", runs_namespace, "--wait=false", check=False)
