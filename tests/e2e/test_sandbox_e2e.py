"""The sandbox pool with the default isolation (`isolation: namespaces`) on a real containerd 2 node:
the server passes its self-test under --require-isolation, answers /run_code through the pool's
Service from a Pod in the cluster with the scientific stack importable, and contains hostile code.

The hostile cases talk to the sandbox Pod's IP straight from the test (the host routes to the node's
bridge); what an execution left behind is looked for inside the sandbox container (`kubectl exec`)."""

import json
import threading
import uuid

import httpx
import pytest

from e2e_helpers import describe, get_json, unique, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

PORT = 8080


@pytest.fixture(scope="module")
def pool(k8s_cluster, sandbox_run, runs_namespace):
    name, pod = sandbox_run
    return {"run": name, "pod": pod["metadata"]["name"], "url": f"http://{pod['status']['podIP']}:{PORT}",
            "namespace": runs_namespace}


def run_code(pool, code, timeout=60, **fields):
    body = {"code": code, "language": "python", "run_timeout": fields.pop("run_timeout", 10), **fields}
    resp = httpx.post(f"{pool['url']}/run_code", json=body, timeout=timeout)
    assert resp.status_code == 200, resp.text
    return resp.json()


def in_container(k8s_cluster, pool, code):
    """Run ``code`` with the sandbox container's own python, outside any execution."""
    res = k8s_cluster.kubectl("exec", "-n", pool["namespace"], pool["pod"], "-c", "sandbox", "--",
                              "python", "-c", code, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def assert_healthy(pool):
    health = httpx.get(f"{pool['url']}/healthz", timeout=10).json()
    res = run_code(pool, "print(6 * 7)")
    assert res["status"] == "Success" and res["run_result"]["stdout"].strip() == "42", res
    return health


PROCESSES_WITH = """
import os
marker = {marker!r}
found = []
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            if marker.encode() in open(f'/proc/{{pid}}/cmdline', 'rb').read():
                found.append(pid)
        except OSError:
            pass
print(len(found))
"""


def processes_with(k8s_cluster, pool, marker):
    return int(in_container(k8s_cluster, pool, PROCESSES_WITH.format(marker=marker)).strip())


# ---------------------------------------------------------------- the pool as deployed

def test_sandbox_pod_runs_on_the_real_node_with_every_layer_holding(k8s_cluster, real_node, pool):
    pod = get_json(k8s_cluster, "pod", pool["pod"], "-n", pool["namespace"])
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["spec"].get("hostUsers") is False
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0, describe(k8s_cluster, pool["namespace"], "pod", pool["pod"])
    health = assert_healthy(pool)
    assert health["isolation"]["mode"] == "namespaces", health
    assert health["layers"] and all(health["layers"].values()), health

    def sandbox_ready():  # set by the operator's next resync of the run
        run = get_json(k8s_cluster, "wmrlrun", pool["run"], "-n", pool["namespace"])
        return [c for c in run["status"]["conditions"] if c["type"] == "SandboxReady" and c["status"] == "True"]

    wait_for(sandbox_ready, timeout=120, interval=2, what="SandboxReady=True on the run")


CLIENT = """
import json, urllib.request
code = "import numpy, pandas, scipy, sklearn\\nprint(numpy.__version__, pandas.__version__, scipy.__version__, sklearn.__version__)"
body = json.dumps({"code": code, "language": "python", "run_timeout": 60}).encode()
req = urllib.request.Request("http://%s:8080/run_code", data=body, headers={"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=120).read().decode())
"""


def test_run_code_through_the_pool_service_from_a_pod_with_the_scientific_stack(k8s_cluster, real_node, pool,
                                                                                e2e_images):
    name = unique("client")
    service = f"{pool['run']}-sandbox-api"
    client = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
              "spec": {**real_node.placement(), "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                       "containers": [{"name": "client", "image": e2e_images["sandbox"], "imagePullPolicy": "Never",
                                       "command": ["python", "-c", CLIENT % service],
                                       "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]}}
    ns = pool["namespace"]
    k8s_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(client))
    try:
        phase = wait_for(lambda: (get_json(k8s_cluster, "pod", name, "-n", ns)["status"].get("phase")
                                  if get_json(k8s_cluster, "pod", name, "-n", ns)["status"].get("phase")
                                  in ("Succeeded", "Failed") else None), timeout=240, what="the client Pod to finish")
        logs = k8s_cluster.kubectl("logs", name, "-n", ns, check=False).stdout
        assert phase == "Succeeded", logs + describe(k8s_cluster, ns, "pod", name)
        answer = json.loads(logs.strip().splitlines()[-1])
        assert answer["status"] == "Success", answer["run_result"]["stderr"]
        versions = answer["run_result"]["stdout"].split()
        assert len(versions) == 4 and all(v[0].isdigit() for v in versions), answer
    finally:
        k8s_cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)


# ---------------------------------------------------------------- hostile code in a real Pod

def test_killing_every_process_leaves_the_server_serving(pool):
    res = run_code(pool, "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('survived')")
    assert "survived" not in res["run_result"]["stdout"] or res["status"] == "Success"
    assert_healthy(pool)


def test_a_daemon_does_not_outlive_its_execution(k8s_cluster, pool):
    marker = f"wmrl-daemon-{uuid.uuid4().hex}"
    code = ("import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}],\n"
            "                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
            "                 stderr=subprocess.DEVNULL)\nprint('spawned')")
    res = run_code(pool, code)
    assert res["run_result"]["stdout"].strip() == "spawned", res
    wait_for(lambda: processes_with(k8s_cluster, pool, marker) == 0, timeout=30, what="the daemon to be gone")


def test_files_planted_for_the_next_execution_are_gone(pool):
    name = f"planted-{uuid.uuid4().hex}"
    plant = ("import os\n"
             f"for d in ('.', '/tmp', os.path.expanduser('~'), '/dev/shm', '/var/tmp'):\n"
             f"    try:\n        open(os.path.join(d, {name!r}), 'w').write('x')\n    except OSError:\n        pass\n")
    run_code(pool, plant)
    look = ("import os\n"
            f"print(sum(os.path.exists(os.path.join(d, {name!r})) for d in "
            "('.', '/tmp', os.path.expanduser('~'), '/dev/shm', '/var/tmp')))")
    for _ in range(3):  # whichever slot runs it
        res = run_code(pool, look)
        assert res["run_result"]["stdout"].strip() == "0", res


def test_writes_outside_the_work_dir_do_not_reach_the_container(k8s_cluster, pool):
    name = f"escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", f"/work/{name}", f"/work/exec/{name}", f"/{name}", f"/etc/{name}"]
    code = "for t in %r:\n    try:\n        open(t, 'w').write('x')\n    except OSError:\n        pass\n" % targets
    run_code(pool, code)
    out = in_container(k8s_cluster, pool, f"import os; print(sum(os.path.exists(t) for t in {targets!r}))")
    assert out.strip() == "0"


def test_a_concurrent_executions_files_cannot_be_read(pool):
    secret = uuid.uuid4().hex
    writer = (f"import time\nopen('secret.txt', 'w').write({secret!r})\nprint('written', flush=True)\ntime.sleep(6)")
    reader = (
        "import os, time\ntime.sleep(2)\nhits = []\n"
        "for root in ('/', '/work', '/tmp', '/proc'):\n"
        "    for dirpath, dirs, files in os.walk(root):\n"
        "        if dirpath.startswith(('/proc/sys', '/sys', '/usr', '/lib')):\n            dirs[:] = []\n            continue\n"
        "        for f in files:\n"
        "            if f == 'secret.txt':\n"
        "                try:\n"
        f"                    if {secret!r} in open(os.path.join(dirpath, f)).read():\n"
        "                        hits.append(os.path.join(dirpath, f))\n"
        "                except OSError:\n                    pass\n"
        "print(len(hits), hits[:3])")
    results = {}
    threads = [threading.Thread(target=lambda k, c: results.__setitem__(k, run_code(pool, c, run_timeout=20)),
                                args=(k, c)) for k, c in (("writer", writer), ("reader", reader))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["writer"]["run_result"]["stdout"].startswith("written"), results
    assert results["reader"]["run_result"]["stdout"].startswith("0 "), results


def test_loopback_to_the_server_is_unreachable(pool):
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 8080), timeout=3)\n    print('reached')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)")
    res = run_code(pool, code)
    assert res["run_result"]["stdout"].startswith("refused"), res


def test_network_egress_dns_and_the_apiserver_are_unreachable(pool):
    code = ("import socket\nout = []\n"
            "for host, port in (('10.96.0.1', 443), ('kubernetes.default.svc.cluster.local', 443), ('1.1.1.1', 53)):\n"
            "    try:\n        socket.create_connection((host, port), timeout=3)\n        out.append('reached')\n"
            "    except OSError:\n        out.append('no')\nprint(' '.join(out))")
    res = run_code(pool, code)
    assert res["run_result"]["stdout"].strip() == "no no no", res


def test_a_fork_bomb_is_capped_and_killed(k8s_cluster, pool):
    marker = f"wmrl-bomb-{uuid.uuid4().hex}"
    code = (f"import os, sys\nsys.argv.append({marker!r})\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass\n")
    res = run_code(pool, code, run_timeout=3)
    assert res["run_result"]["status"] == "TimeLimitExceeded", res
    assert_healthy(pool)


def test_a_memory_bomb_hits_the_limit(pool):
    res = run_code(pool, "x = bytearray(10**10)", memory_limit_MB=256)
    assert res["status"] == "Failed" and "MemoryError" in res["run_result"]["stderr"], res
    assert_healthy(pool)


def test_an_infinite_loop_times_out(pool):
    res = run_code(pool, "while True:\n    pass", run_timeout=2)
    assert res["run_result"]["status"] == "TimeLimitExceeded", res
    assert_healthy(pool)


def test_the_servers_environment_and_processes_are_out_of_reach(pool):
    """The server (``wmrl sandbox serve``, PID 1 of the container, with WMRL_SANDBOX_* in its environment)
    is invisible to an execution: no process it can see runs the server's command line or has its environment."""
    code = ("import os\nservers, envs, seen = 0, 0, 0\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit():\n"
            "        continue\n    seen += 1\n    try:\n        servers += b'sandbox\\x00serve' in open(f'/proc/{pid}/cmdline','rb').read()\n"
            "    except OSError:\n        pass\n    try:\n        envs += b'WMRL_SANDBOX_SLOTS=' in open(f'/proc/{pid}/environ','rb').read()\n"
            "    except OSError:\n        pass\nprint(servers, envs, seen)")
    res = run_code(pool, code)
    servers, envs, seen = res["run_result"]["stdout"].split()
    assert (servers, envs) == ("0", "0"), res
    assert 0 < int(seen) < 10, res
