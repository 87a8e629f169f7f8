"""Limits across all of an execution's processes (wmrl_sandbox.cgroups), on this machine's real kernel.

This machine mounts memory, pids and cpu as cgroup v1 hierarchies (its unified v2 hierarchy
offers only hugetlb), so the limits are checked in v1 here: in root mode (root may write every
cgroup, as on a node) and in the deployed mode inside cgroups delegated to the server's uid.
cgroup v2's own steps (the server moving itself into a leaf, enabling controllers for the
groups below, ``cgroup.kill``) run for real on the unified hierarchy with its hugetlb
controller; its memory/pids/cpu limit files cannot exist on this kernel.
"""

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, DelegatedCgroups, assert_contained, run, start_server
from wmrl_sandbox import cgroups
from wmrl_sandbox.local import LocalServer

UID = DEPLOYED_UID + 20  # executions are told apart by uid: one no other test module uses

# Twelve children of 100 MB each: every one passes a 256 MB per-process limit, together they do not.
TWELVE_CHILDREN = textwrap.dedent("""
    import os, time
    kids = []
    for _ in range(12):
        pid = os.fork()
        if pid == 0:
            block = bytearray(100 << 20)
            time.sleep(1)  # all twelve hold their memory at once
            os._exit(0)
        kids.append(pid)
    print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) == 0 for k in kids))
""")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits a moment for the machine's init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _groups_left(server) -> list[str]:
    return [entry for root in server.healthz()["cgroups"]["groups"] for entry in os.listdir(root)
            if entry.startswith("exec-")]


def _assert_bounded_together(server) -> None:
    res = run(server, TWELVE_CHILDREN, memory_limit_MB=256, run_timeout=30, timeout=60)
    rr = res["run_result"]
    assert rr["oom_kills"] >= 1 and rr["memory_peak_mb"] <= 256, res  # held to 256 MB together
    if rr["return_code"] == 0:  # the kernel killed children; the program saw them die and went on
        assert int(rr["stdout"]) <= 12 - rr["oom_kills"], res
        assert res["status"] == "Success" and res["message"] == ""  # it exited 0: its call
    else:  # the kernel chose the program itself
        assert rr["return_code"] == -9 and res["status"] == "Failed" and "memory limit" in res["message"], res
    assert _groups_left(server) == []  # each execution's group is gone with it
    assert_contained(server)


@pytest.fixture(scope="module", params=["deployed", "deployed-cold"])
def delegated(request, tmp_path_factory):
    with start_server(request.param, tmp_path_factory, uid=UID, args=TEST_ARGS + ("--require-isolation",),
                      delegate_cgroups=True) as srv:
        yield srv


def test_a_deployed_server_uses_the_cgroups_delegated_to_it(delegated):
    state = delegated.healthz()["cgroups"]
    assert state["enabled"] and state["controllers"] == {"memory": "v1", "pids": "v1", "cpu": "v1"}, state
    assert state["missing"] == {}
    for root in state["groups"]:  # its subtree, inside what was delegated, owned by its uid
        assert os.path.basename(os.path.dirname(root)).startswith("wmrl-delegated-")
        assert os.stat(root).st_uid == UID


def test_the_processes_of_a_deployed_execution_are_bounded_together(delegated):
    _assert_bounded_together(delegated)


def test_the_task_limit_counts_only_the_execution(delegated):
    """In the deployed mode RLIMIT_NPROC would count every process of the server's uid (the
    server's own, every other execution's); with a pids group the execution's own tasks are
    counted, and refused at exactly its allowance, which the result reports."""
    code = textwrap.dedent("""
        import os, time
        started = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                started += 1
        except OSError:  # EAGAIN
            pass
        print(started)
    """)
    res = run(delegated, code, run_timeout=20)
    rr = res["run_result"]
    assert int(rr["stdout"]) == 31 and rr["pids_refused"] >= 1, res  # --nproc 32 in TEST_ARGS, the program's own included
    assert_contained(delegated)


@pytest.fixture(scope="module")
def root_server():
    with LocalServer(slots=1, args=TEST_ARGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def half_cpu_server():
    """--cpus 0.5. (Kept apart from the memory cases: a group at its memory limit with no swap
    spends its CPU quota in reclaim, and under half a CPU the kernel's kills take many seconds.)"""
    with LocalServer(slots=1, args=TEST_ARGS + ("--cpus", "0.5")) as srv:
        yield srv


def test_a_root_server_bounds_memory_together_and_reports_it(root_server):
    state = root_server.healthz()["cgroups"]
    assert state["controllers"] == {"memory": "v1", "pids": "v1", "cpu": "v1"} and state["cpus"] == 1.0
    _assert_bounded_together(root_server)


def test_cpu_time_is_capped_across_threads(half_cpu_server):
    """Two busy threads for a second of wall-clock: at most half a CPU with --cpus 0.5 (without
    the cap they get up to two on this machine)."""
    code = textwrap.dedent("""
        import os, threading, time
        def spin(until):
            while time.monotonic() < until:
                pass
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        wall0, cpu0 = time.monotonic(), time.process_time()
        until = wall0 + 1.5
        threads = [threading.Thread(target=spin, args=(until,)) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print((time.process_time() - cpu0) / (time.monotonic() - wall0))
    """)
    assert half_cpu_server.healthz()["cgroups"]["cpus"] == 0.5
    res = run(half_cpu_server, code, run_timeout=20)
    assert res["status"] == "Success", res
    assert float(res["run_result"]["stdout"]) < 0.75, res  # 0.5 and the quota period's slack


def test_an_ordinary_execution_has_its_peak_memory_and_no_kill(root_server):
    res = run(root_server, "x = bytearray(64 << 20)\nprint(len(x))")
    rr = res["run_result"]
    assert res["status"] == "Success" and rr["oom_kills"] == 0 and rr["pids_refused"] == 0, res
    assert 64 <= rr["memory_peak_mb"] < 256, res
    assert res["message"] == ""


def test_off_falls_back_to_per_process_limits(tmp_path_factory):
    """--cgroups off (and a Pod whose cgroup is not delegated): the documented fallback; the
    twelve children all pass their per-process limit, nothing is counted, nothing is left."""
    with LocalServer(slots=1, args=TEST_ARGS + ("--cgroups", "off")) as srv:
        state = srv.healthz()["cgroups"]
        assert not state["enabled"] and set(state["missing"]) == set(cgroups.CONTROLLERS)
        res = run(srv, TWELVE_CHILDREN, memory_limit_MB=256, run_timeout=30)
        assert res["run_result"]["stdout"] == "12\n" and res["run_result"]["oom_kills"] is None, res
        assert_contained(srv)


def test_required_refuses_to_start_where_nothing_is_delegated(tmp_path_factory):
    with pytest.raises(RuntimeError) as failed:
        start_server("deployed", tmp_path_factory, uid=UID + 1, args=TEST_ARGS + ("--cgroups", "required"))
    message = str(failed.value)
    assert "cgroups required" in message and "memory:" in message and "not delegated" in message, message


def test_the_next_server_removes_what_a_killed_one_left(tmp_path_factory):
    """A server killed while an execution runs leaves its cgroups; the next one to start in the
    same cgroup kills what is left in them and removes them."""
    srv = LocalServer(slots=1, args=TEST_ARGS + ("--no-warm",))  # a cold execution outlives its server
    try:
        roots = srv.healthz()["cgroups"]["groups"]
        def sleep_there():
            with contextlib.suppress(httpx.HTTPError):  # the server dies under it
                run(srv, "import time\ntime.sleep(60)", run_timeout=60, timeout=90)

        threading.Thread(target=sleep_there, daemon=True).start()
        deadline = time.monotonic() + 20
        while not any(e.startswith("exec-") for r in roots for e in os.listdir(r)):
            assert time.monotonic() < deadline, "the execution never started"
            time.sleep(0.05)
        execution = [e for e in os.listdir(roots[0]) if e.startswith("exec-")][0]
        while not cgroups._procs(os.path.join(roots[0], execution)):
            assert time.monotonic() < deadline, "the execution's process never joined its group"
            time.sleep(0.05)
        leftover = cgroups._procs(os.path.join(roots[0], execution))
        srv.kill()
        assert all(os.path.isdir(r) for r in roots)
        with LocalServer(slots=1, args=TEST_ARGS) as nxt:
            assert nxt.healthz()["cgroups"]["enabled"]
            assert not any(os.path.exists(r) for r in roots)
            assert not any(_running(pid) for pid in leftover)
    finally:
        srv.close()


V2_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from wmrl_sandbox import cgroups
    from wmrl_sandbox.cgroups import Cgroups

    manager = Cgroups.setup("required", wanted=("hugetlb",))
    (hierarchy,) = manager.hierarchies
    me = open("/proc/self/cgroup").read()
    group = manager.create(memory_mb=64, tasks=8)
    # The execution's first process joins its group itself and leaves a daemon behind.
    child = subprocess.Popen([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
                              "    time.sleep(60)\\ntime.sleep(60)"],
                             preexec_fn=lambda: cgroups.join(group.join_files))
    deadline = time.monotonic() + 10
    while len(cgroups._procs(group.directories[0])) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    inside = cgroups._procs(group.directories[0])
    killed_by_the_kernel = os.path.exists(os.path.join(group.directories[0], "cgroup.kill"))
    group.end()
    child.wait()
    manager.close()
    print(json.dumps({"version": hierarchy.version, "root": hierarchy.root, "me": me, "inside": len(inside),
                      "pids": inside, "subtree": open(os.path.join(hierarchy.root, "cgroup.subtree_control")).read(),
                      "group_left": os.path.exists(group.directories[0]), "cgroup_kill": killed_by_the_kernel}))
""")


@pytest.fixture
def unified_with_hugetlb():
    """The unified hierarchy's mount point, its root cgroup handing hugetlb to the cgroups below
    (as a node's init hands controllers down); restored after the test."""
    unified = next((point for point, _, fstype, _ in cgroups._mountinfo() if fstype == "cgroup2"), None)
    assert unified and "hugetlb" in open(os.path.join(unified, "cgroup.controllers")).read().split()
    subtree = os.path.join(unified, "cgroup.subtree_control")
    enabled_before = "hugetlb" in open(subtree).read().split()
    if not enabled_before:
        with open(subtree, "w") as fh:
            fh.write("+hugetlb")
    yield unified
    if not enabled_before:
        with open(subtree, "w") as fh:
            fh.write("-hugetlb")


def test_cgroup_v2_leaf_enable_and_kill_on_the_unified_hierarchy(unified_with_hugetlb):
    """cgroup v2's steps for real, with the one controller this kernel gives v2 (hugetlb): the
    server moves into ``wmrl-<pid>/server``, enables the controller for the groups below, and an
    execution's group is emptied through ``cgroup.kill`` (a daemon included) and removed."""
    unified = unified_with_hugetlb
    own = os.path.join(unified, f"wmrl-test-v2-{os.getpid()}")  # a cgroup of its own, as delegation gives
    os.mkdir(own)
    try:
        proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "in_cgroups.py"),
                               os.path.join(own, "cgroup.procs"), "--", sys.executable, "-c", V2_SCRIPT],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)
        v2_line = next(line for line in found["me"].splitlines() if line.startswith("0::"))
        assert found["version"] == 2 and v2_line == f"0::{found['root'][len(unified):]}/server"
        assert found["subtree"].split() == ["hugetlb"]
        assert found["inside"] == 2 and not found["group_left"]
        assert found["cgroup_kill"]  # Linux 5.14+: the group was emptied by cgroup.kill
        assert not any(_running(pid) for pid in found["pids"])
    finally:
        cgroups.remove_tree(own)
    assert not os.path.exists(own)


def test_cgroup_v2_needs_a_cgroup_the_server_has_to_itself(unified_with_hugetlb):
    """v2 enables controllers below a cgroup only if no process sits in it: a server that shares
    its cgroup with another process says so and runs without a cgroup per execution."""
    own = os.path.join(unified_with_hugetlb, f"wmrl-test-v2-shared-{os.getpid()}")
    os.mkdir(own)
    helper = os.path.join(os.path.dirname(__file__), "in_cgroups.py")
    sleeper = subprocess.Popen([sys.executable, helper, os.path.join(own, "cgroup.procs"), "--", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while str(sleeper.pid) not in open(os.path.join(own, "cgroup.procs")).read().split():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        shared = subprocess.run([sys.executable, helper, os.path.join(own, "cgroup.procs"), "--", sys.executable, "-c",
                                 "from wmrl_sandbox.cgroups import Cgroups\n"
                                 "m = Cgroups.setup('auto', wanted=('hugetlb',))\n"
                                 "print(m.enabled, m.missing['hugetlb'])"],
                                capture_output=True, text=True, timeout=60)
        assert shared.returncode == 0, shared.stderr
        assert shared.stdout.startswith("False ") and "other processes" in shared.stdout, shared.stdout
    finally:
        sleeper.kill()
        sleeper.wait()
        cgroups.remove_tree(own)
    assert not os.path.exists(own)


def test_a_program_killed_at_the_group_limit_grades_as_memory_limit_exceeded(root_server):
    """Each process under its own limit, together over the group's: the largest (the program
    itself) is killed, and the reward sees the program's failure, not the sandbox's."""
    from wmrl.grading import grade
    from wmrl.outcome import Status
    from wmrl.tasks import Task

    task = Task(name="tiny", description="", kind="classification", metric="accuracy", target="target",
                data={}, hidden_labels=b"id,target\n1,1\n", leaderboard=(1.0, 0.5, 0.0))
    code = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            block = bytearray(100 << 20)
            time.sleep(5)
            os._exit(0)
        time.sleep(0.5)
        mine = bytearray(200 << 20)
        time.sleep(5)
    """)
    res = run(root_server, code, memory_limit_MB=256, run_timeout=20)
    assert res["run_result"]["return_code"] == -9 and res["run_result"]["oom_kills"] >= 1, res
    assert res["status"] == "Failed" and "memory limit" in res["message"], res
    outcome = grade(task, res, None)
    assert outcome.status is Status.RUNTIME_ERR and outcome.error_type == "MemoryLimitExceeded", outcome
    assert_contained(root_server)


TAMPER = textwrap.dedent("""
    import glob, os, sys
    mine = [d for root in sys.argv[1:] for d in glob.glob(root + "/exec-*")]
    print(len(mine))
    for directory in mine:
        for name in ("pids.max", "memory.limit_in_bytes", "cpu.cfs_quota_us", "cgroup.procs", "tasks"):
            path = os.path.join(directory, name)
            if os.path.exists(path):
                try:
                    with open(path, "w") as fh:
                        fh.write("max" if name == "pids.max" else "-1" if name != "tasks" else "1")
                    print("WROTE", path)
                except OSError as exc:
                    print("refused", name, type(exc).__name__)
        for target in (os.path.join(directory, "escape"), os.path.join(os.path.dirname(directory), "escape")):
            try:
                os.mkdir(target)
                print("MADE", target)
            except OSError as exc:
                print("refused mkdir", type(exc).__name__)
""")


@pytest.mark.parametrize("which", ["root", "delegated"])
def test_an_execution_cannot_change_or_leave_its_cgroup(which, root_server, delegated):
    """Its group's files and the server's subtree are visible to it, and none can be written:
    root's files (root mode: the slot's uid), a read-only mount (deployed mode)."""
    server = root_server if which == "root" else delegated
    groups = server.healthz()["cgroups"]["groups"]
    code = "import sys\nsys.argv[1:] = " + repr(groups) + "\n" + TAMPER
    res = run(server, code)
    out = res["run_result"]["stdout"]
    assert res["status"] == "Success" and out.splitlines()[0] == str(len(groups)), res  # it found its group
    assert "WROTE" not in out and "MADE" not in out and out.count("refused") >= 4 * len(groups), out
    assert _groups_left(server) == []


def test_unisolated_mode_gets_no_cgroups_even_where_they_are_delegated(tmp_path_factory):
    """Without namespaces an execution runs as the server's uid in its mount namespace and could
    rewrite a delegated group's limits: the server makes none, says why, and its rlimits hold."""
    uid = UID + 2
    delegated = DelegatedCgroups(uid)
    try:
        root = tmp_path_factory.mktemp("unisolated-work")
        for directory in (root.parent, root.parent.parent):
            os.chmod(directory, 0o755)
        os.chown(root, uid, uid)
        setpriv = ("setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups")
        options = dict(slots=1, work_root=str(root), prefix=delegated.prefix() + setpriv,
                       args=TEST_ARGS + ("--python", "/usr/bin/python3", "--isolation", "restricted"))
        with LocalServer(**options) as srv:
            state = srv.healthz()["cgroups"]
            assert srv.healthz()["isolation"]["mode"] == "unisolated"
            assert not state["enabled"] and "unisolated" in state["missing"]["memory"], state
            bomb = "import os\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n" \
                   "            import time; time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)"
            assert int(run(srv, bomb, run_timeout=10)["run_result"]["stdout"]) < 32  # RLIMIT_NPROC, --nproc 32
        with pytest.raises(RuntimeError, match="unisolated mode"):
            LocalServer(**{**options, "args": options["args"] + ("--cgroups", "required")})
    finally:
        delegated.remove()


def test_the_cpu_limit_is_held_to_what_the_servers_own_cgroup_may_use():
    """cgroup v1 refuses a child a CPU quota above its parent's: a server in a cgroup of half a
    CPU gives each execution at most that (asked for 1), instead of failing every execution."""
    version, own = cgroups.locate("cpu")
    assert version == 1
    parent = os.path.join(own, f"wmrl-test-quota-{os.getpid()}")
    os.mkdir(parent)
    try:
        with open(os.path.join(parent, "cpu.cfs_quota_us"), "w") as fh:
            fh.write(str(cgroups.CPU_PERIOD_US // 2))
        helper = os.path.join(os.path.dirname(__file__), "in_cgroups.py")
        with LocalServer(slots=1, args=TEST_ARGS, prefix=(sys.executable, helper, os.path.join(parent, "cgroup.procs"),
                                                          "--")) as srv:
            assert srv.healthz()["cgroups"]["cpus"] == 0.5
            assert run(srv, "print('ran')")["run_result"]["stdout"] == "ran\n"
    finally:
        cgroups.remove_tree(parent)
