"""A task collection on a PersistentVolume reaches the real sandbox Pods read-only, and each execution
sees only the public directory it names (spec.tasks.pvc; docs/sandbox.md, "Data").

The volume is a hostPath PersistentVolume on the real node holding one competition in MLE-bench's
prepared layout, its private answers carrying a random secret. An execution reads its public data at
data/ and cannot find the secret anywhere in its file system; the tasks directory is empty to it."""

import json
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from e2e_helpers import get_json, unique, wait_for, wait_ready_sandbox
from e2e_runs import sandbox_only_run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

COMPETITION = "spaceship"
PUBLIC = f"{COMPETITION}/prepared/public"

FIND_SECRET = """
import os, sys
secret = {reversed_secret!r}[::-1].encode()  # the script itself must not hold it
hits, read = [], 0
for top, dirs, files in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]
    for name in files:
        path = os.path.join(top, name)
        try:
            if os.path.islink(path) or os.path.getsize(path) > 4 << 20:
                continue
            with open(path, 'rb') as f:
                read += 1
                if secret in f.read():
                    hits.append(path)
        except OSError:
            pass
print(read, hits)
"""


@pytest.fixture(scope="module")
def tasks_volume(k8s_cluster, real_node, runs_namespace):
    """A hostPath PersistentVolume on the real node with one MLE-bench-style competition, bound to a claim."""
    secret = uuid.uuid4().hex
    root = Path(f"/var/lib/wmrl-e2e-tasks-{secret[:8]}")
    public, private = root / PUBLIC, root / COMPETITION / "prepared" / "private"
    public.mkdir(parents=True)
    private.mkdir(parents=True)
    (public / "train.csv").write_text("PassengerId,Age,Transported\n0001_01,39,False\n0002_01,24,True\n")
    (public / "sample_submission.csv").write_text("PassengerId,Transported\n0003_01,False\n")
    (private / "test.csv").write_text(f"PassengerId,Transported\n0003_01,True\n# {secret}\n")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    name = unique("tasks")
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                   "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(root), "type": "Directory"},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In", "values": [real_node.name]}]}]}}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": name,
                    "resources": {"requests": {"storage": "1Gi"}}}}
    k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
    k8s_cluster.kubectl("apply", "-n", runs_namespace, "-f", "-", input=json.dumps(pvc))
    try:
        yield {"claim": name, "secret": secret}
    finally:
        k8s_cluster.kubectl("delete", "pvc", name, "-n", runs_namespace, "--wait=false", check=False)
        k8s_cluster.kubectl("delete", "pv", name, "--wait=false", check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def mounted_pool(k8s_cluster, real_node, e2e_images, e2e_operator, runs_namespace, tasks_volume):
    """A run whose tasks come from the claim: its sandbox Pod on the real node mounts it at /tasks."""
    name = unique("data")
    manifest = sandbox_only_run(name, e2e_images, real_node.placement(), slots=1)
    manifest["spec"]["tasks"] = {"pvc": tasks_volume["claim"], "format": "mlebench"}
    k8s_cluster.kubectl("apply", "-n", runs_namespace, "-f", "-", input=json.dumps(manifest))

    pod = wait_ready_sandbox(k8s_cluster, runs_namespace, name)
    yield {"pod": pod, "url": f"http://{pod['status']['podIP']}:8080"}
    # Gone before the next module: the real node's CPU is small, and later tests schedule Pods there.
    k8s_cluster.kubectl("delete", "wmrlrun", name, "-n", runs_namespace, "--wait=true", "--timeout=120s", check=False)
    wait_for(lambda: not get_json(k8s_cluster, "pods", "-n", runs_namespace, "-l", f"wmrl.dev/run={name}")["items"],
             timeout=180, interval=2, what=f"the Pods of {name}, terminating ones included, to go")


def run_code(pool, code, run_timeout=20, **fields):
    body = {"code": code, "language": "python", "run_timeout": run_timeout, **fields}
    resp = httpx.post(f"{pool['url']}/run_code", json=body, timeout=run_timeout + 60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_sandbox_pod_mounts_the_claim_read_only(mounted_pool, tasks_volume, real_node):
    pod = mounted_pool["pod"]
    assert pod["spec"]["nodeName"] == real_node.name
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tasks"]["persistentVolumeClaim"] == {"claimName": tasks_volume["claim"], "readOnly": True}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["tasks"]["mountPath"] == "/tasks" and mounts["tasks"]["readOnly"] is True


def test_an_execution_reads_its_public_data_and_cannot_write_it(mounted_pool):
    res = run_code(mounted_pool, "import pandas as pd\n"
                                 "df = pd.read_csv('data/train.csv')\n"
                                 "print(len(df), list(df.columns))\n"
                                 "try:\n    open('data/new.csv', 'w')\nexcept OSError as e:\n    print('refused', e.errno)\n",
                   data_dir=PUBLIC)
    assert res["status"] == "Success", res
    lines = res["run_result"]["stdout"].splitlines()
    assert lines[0] == "2 ['PassengerId', 'Age', 'Transported']", res
    assert lines[1].startswith("refused"), res


@pytest.mark.parametrize("data_dir", [PUBLIC, None], ids=["with-data-dir", "without-data-dir"])
def test_the_private_answers_are_nowhere_in_an_executions_file_system(mounted_pool, tasks_volume, data_dir):
    fields = {"data_dir": data_dir} if data_dir else {}
    probe = ("import os\n"
             "print(sorted(os.listdir('/tasks')) if os.path.isdir('/tasks') else 'absent')\n"
             f"for p in ('/tasks/{COMPETITION}/prepared/private/test.csv', 'data/../private/test.csv',\n"
             "          'data/../../private/test.csv'):\n"
             "    print(os.path.exists(p))\n")
    res = run_code(mounted_pool, probe, **fields)
    assert res["status"] == "Success", res
    assert res["run_result"]["stdout"].split("\n")[:4] in (["[]", "False", "False", "False"],
                                                           ["absent", "False", "False", "False"]), res
    res = run_code(mounted_pool, FIND_SECRET.format(reversed_secret=tasks_volume["secret"][::-1]), run_timeout=120, **fields)
    assert res["status"] == "Success", res
    read, hits = res["run_result"]["stdout"].split(" ", 1)
    assert int(read) > 1000, res  # the walk really read the file system (the interpreter's files at least)
    assert hits.strip() == "[]", res
