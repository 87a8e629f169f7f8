"""Warm starts (``wmrl_sandbox.warm``): an execution forked from its slot's fork server behaves as a
new interpreter would, shares nothing with the one before, and survives its fork server's death.

The trusted peer is the cold path itself: every program runs on a warm and on a cold
(``--no-warm``) server, both real root-mode servers, and their answers must agree; and again on
a warm and a cold deployed-mode server (an unprivileged uid: the fork server's child makes its
own namespaces, where bubblewrap makes them cold). The hostile suite (test_hostile.py) runs every
attack against the warm paths too.
"""

import base64
import os
import re
import signal
import time

import pytest

from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, assert_contained, run, start_server

ARGS = TEST_ARGS
from wmrl_sandbox.local import LocalServer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="warm starts are root mode's; CI runs as root")


@pytest.fixture(scope="module")
def warm():
    with LocalServer(slots=1, args=ARGS) as server:
        assert server.healthz()["warm"]["ready"] == 1
        yield server


@pytest.fixture(scope="module")
def cold():
    with LocalServer(slots=1, args=(*ARGS, "--no-warm")) as server:
        yield server


def _answer(res: dict) -> tuple:
    run_result = res["run_result"]
    scrub = lambda text: re.sub(r"/\S*/x-[^/\s]+/", "<exec>/", text)  # noqa: E731 - each execution's own directory
    return res["status"], run_result["status"], run_result["return_code"], scrub(run_result["stdout"]), \
        scrub(run_result["stderr"]), res.get("files") or {}


PROGRAMS = {
    "print": ("print('hi')", {}),
    "exit code": ("import sys\nsys.exit(3)", {}),
    "exit message": ("import sys\nsys.exit('bye')", {}),
    "exception": ("def f():\n    raise ValueError('boom')\nf()", {}),
    "syntax error": ("x = (", {}),
    "argv, name, path": ("import os, sys\nprint(sys.argv[0].endswith('/main.py'), __name__, sys.path[0] == os.getcwd())",
                         {}),
    "flags": ("import sys\nprint(sys.flags.ignore_environment, sys.flags.no_user_site, sys.dont_write_bytecode)", {}),
    "atexit": ("import atexit\natexit.register(print, 'at exit')\nprint('main')", {}),
    "late thread": ("import threading, time\n"
                    "def late():\n    time.sleep(0.2)\n    print('thread done', flush=True)\n"
                    "threading.Thread(target=late).start()\nprint('main done', flush=True)", {}),
    "stdin": ("print(input()[::-1])", {"stdin": "abc\n"}),
    "files import": ("import helper\nprint(helper.X)",
                     {"files": {"helper.py": base64.b64encode(b"X = 42\n").decode()}}),
    "environment": ("import os\nprint(sorted(k for k in os.environ))", {}),
    "devices": ("import os\nprint(sorted(n for n in os.listdir('/dev') if n not in ('pts', 'ptmx', 'core')))", {}),
    "killed by a signal": ("import os\nos.kill(os.getpid(), 9)", {}),
    "uid and capabilities": ("import os\nprint(os.getuid() != 0, open('/proc/self/status').read().split('CapEff:')[1]"
                             ".split()[0])", {}),
    "unclosed file": ("f = open('out.txt', 'w')\nf.write('written at exit')", {"fetch_files": ["out.txt"]}),
    "finalizers": ("class Noisy:\n    def __del__(self):\n        print('finalized')\nkeep = Noisy()", {}),
    "keyboard interrupt": ("raise KeyboardInterrupt", {}),
    # The warm exit skips the teardown of the preloaded stack (warm._exit): what a program sees of an exit
    "exit code past a byte": ("import sys\nsys.exit(257)", {}),
    "exit with an object": ("import sys\nsys.exit(['a', 1])", {}),
    "atexit raises": ("import atexit\nclass Bad:\n    def __repr__(self):\n        return 'bad'\n"
                      "    def __call__(self):\n        raise RuntimeError('in atexit')\n"
                      "atexit.register(Bad())\natexit.register(print, 'runs first')", {}),
    "finalizer in a cycle": ("class Noisy:\n    def __del__(self):\n        print('cycle finalized', self.me is self)\n"
                             "n = Noisy()\nn.me = n\ndel n\nprint('main done')", {}),
    "finalizer sees its module": ("import sys\nclass Noisy:\n    def __del__(self):\n"
                                  "        print('sees', type(_hidden).__name__, type(visible).__name__)\n"
                                  "_hidden = 1\nvisible = 2\nkeep = Noisy()", {}),
    "unclosed file in a helper module": ("import helper\nhelper.write()", {
        "files": {"helper.py": base64.b64encode(b"def write():\n    global F\n    F = open('log.txt', 'w')\n"
                                                b"    F.write('from helper')\n").decode()},
        "fetch_files": ["log.txt"]}),
    "logging to a file": ("import logging\nlogging.basicConfig(filename='log.txt')\nlogging.warning('kept')",
                          {"fetch_files": ["log.txt"]}),
    "stdout replaced by a file": ("import sys\nsys.stdout = open('out.txt', 'w')\nprint('into the file')",
                                  {"fetch_files": ["out.txt"]}),
    "stdout closed by the program": ("import sys\nprint('before')\nsys.stdout.close()", {}),
    "stdout's descriptor closed": ("import os, sys\nsys.stdout.write('lost')\nos.close(1)", {}),
    "exit from a thread's atexit": ("import atexit, threading\n"
                                    "atexit.register(lambda: print('atexit after join', t.is_alive()))\n"
                                    "t = threading.Thread(target=lambda: print('worker'))\nt.start()", {}),
    "stdlib shadowed by files": ("print('ok')", {"files": {
        f"{name}.py": base64.b64encode(f"import os\nos.write(2, b'SHADOWED {name}\\n')\n".encode()).decode()
        for name in ("secrets", "tempfile", "shutil", "resource", "platform", "random", "hashlib", "base64", "json",
                     "struct", "selectors", "signal", "socket", "stat", "subprocess", "ctypes", "types", "traceback",
                     "wmrl_sandbox", "executor", "seccomp", "contextlib", "dataclasses", "math")}}),
    "fit a model": ("from sklearn.datasets import load_iris\nfrom sklearn.linear_model import LogisticRegression\n"
                    "X, y = load_iris(return_X_y=True)\n"
                    "print(round(LogisticRegression(max_iter=500).fit(X, y).score(X, y), 3))",
                    {"run_timeout": 60, "memory_limit_MB": 2048}),  # cold: room and time to import the stack
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_warm_execution_answers_as_a_new_interpreter(name, warm, cold):
    code, fields = PROGRAMS[name]
    answer = _answer(run(warm, code, **fields))
    assert answer == _answer(run(cold, code, **fields))
    assert "SHADOWED" not in answer[4]  # nothing is imported from the request's files before its own imports


CLOSES_ITS_STREAMS = ("import os, sys, time\nprint('before', flush=True)\nos.close(1)\nos.close(2)\n"
                      "time.sleep(0.5)\nopen('done.txt', 'w').write('worked on')\nsys.exit(3)")


def test_a_program_that_closes_its_streams_is_not_cut_short(warm, cold, deployed_pair):
    """Both pipes at end of file is not the end of the execution: the main process's exit is (and a
    deployed namespace's first process reports the program's status only after the pipes closed)."""
    for server in (warm, cold, *deployed_pair):
        res = run(server, CLOSES_ITS_STREAMS, fetch_files=["done.txt"])
        assert (res["run_result"]["return_code"], res["run_result"]["stdout"]) == (3, "before\n"), res
        assert base64.b64decode(res["files"]["done.txt"]) == b"worked on"


@pytest.fixture(scope="module")
def deployed_pair(tmp_path_factory):
    """Warm and cold deployed-mode servers, each as a uid of its own, with the system interpreter
    (the one an unprivileged uid can run here; it has no scikit-learn)."""
    with start_server("deployed", tmp_path_factory, uid=DEPLOYED_UID + 10) as warm_server, \
            start_server("deployed-cold", tmp_path_factory, uid=DEPLOYED_UID + 11) as cold_server:
        assert warm_server.healthz()["warm"]["ready"] == 1
        yield warm_server, cold_server


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_deployed_warm_execution_answers_as_a_new_interpreter(name, deployed_pair):
    warm_server, cold_server = deployed_pair
    code, fields = PROGRAMS[name]
    answer = _answer(run(warm_server, code, **fields))
    assert answer == _answer(run(cold_server, code, **fields))
    assert "SHADOWED" not in answer[4]
    probe = "import sys\nprint('wmrl_sandbox.warm' in sys.modules)"  # it really ran warm, and the other cold
    assert [run(srv, probe)["run_result"]["stdout"].strip() for srv in deployed_pair] == ["True", "False"]


def test_the_warm_path_really_ran(warm, cold):
    probe = "import sys\nprint('sklearn' in sys.modules)"
    assert run(warm, probe)["run_result"]["stdout"].strip() == "True"
    assert run(cold, probe)["run_result"]["stdout"].strip() == "False"


def test_executions_share_no_state(warm):
    """What one execution changes in the pre-imported modules, or draws from their random
    generators, is its own: the next starts from the fork server's state with fresh seeds."""
    first = run(warm, "import json, random, sklearn, numpy as np\nsklearn.__version__ = 'tampered'\n"
                      "json.dumps = None\nprint(np.random.rand(), random.random())")
    second = run(warm, "import json, random, sklearn, numpy as np\n"
                       "print(sklearn.__version__ != 'tampered', json.dumps is not None)\n"
                       "print(np.random.rand(), random.random())")
    assert first["status"] == second["status"] == "Success", (first, second)
    lines = second["run_result"]["stdout"].split("\n")
    assert lines[0] == "True True"
    assert lines[1] != first["run_result"]["stdout"].strip()


PROBE = ("import resource, sys\n"
         "print('sklearn' in sys.modules, resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)")


def test_a_warm_program_gets_the_memory_a_cold_one_would(warm, cold):
    """The address-space limit of a warm execution adds what the fork server's imports occupy beyond a
    bare interpreter, so a program has the room it would have cold; and it still binds."""
    preloaded = warm.healthz()["warm"]["preloaded_mb"]
    assert preloaded > 0
    assert run(warm, PROBE, memory_limit_MB=300)["run_result"]["stdout"].split() == ["True", str(300 + preloaded)]
    assert run(cold, PROBE, memory_limit_MB=300)["run_result"]["stdout"].split() == ["False", "300"]
    fits = "x = bytearray(200 << 20)\nprint('ok')"
    for server in (warm, cold):
        assert run(server, fits, memory_limit_MB=300)["status"] == "Success"
        too_big = run(server, "x = bytearray(400 << 20)\nprint('ok')", memory_limit_MB=300)
        assert too_big["status"] == "Failed" and "MemoryError" in too_big["run_result"]["stderr"], too_big


def _fork_servers_of(server_pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == server_pid and b"wmrl_sandbox.warm" in cmdline:
            found.append(int(name))
    return found


def test_a_dead_fork_server_is_replaced_and_its_slot_runs_cold_meanwhile():
    probe = "import sys\nprint('sklearn' in sys.modules)"
    with LocalServer(slots=1, args=ARGS) as server:
        [zygote] = _fork_servers_of(server.proc.pid)
        os.kill(zygote, signal.SIGKILL)
        # Sent at once: the server may not see yet that the fork server is dying; its spawn then
        # fails, and the execution runs cold instead of failing as the sandbox's.
        meanwhile = run(server, probe)
        assert meanwhile["status"] == "Success", meanwhile
        assert meanwhile["run_result"]["stdout"].strip() == "False"  # ran cold while its fork server restarts
        deadline = time.monotonic() + 120
        while server.healthz()["warm"]["ready"] != 1:
            assert time.monotonic() < deadline, server.healthz()["warm"]
            time.sleep(0.2)
        assert run(server, probe)["run_result"]["stdout"].strip() == "True"
        assert _fork_servers_of(server.proc.pid) not in ([], [zygote])


WARM_PROBE = "import sys\nprint('wmrl_sandbox.warm' in sys.modules)"  # forked from a fork server?


@pytest.mark.parametrize("mode", ["root", "deployed"])
def test_an_execution_its_fork_server_cannot_start_runs_cold(mode, tmp_path_factory):
    """A fork server that takes the execution and never answers (stopped here; one killed while
    the server still counts it alive does the same): after the spawn's 10 s the server gives up
    on it and the execution runs cold in a fresh directory, the program's answer, not a
    SandboxError; then the slot is warm again."""
    with start_server(mode, tmp_path_factory, uid=DEPLOYED_UID + 30, args=ARGS) as server:
        assert run(server, WARM_PROBE)["run_result"]["stdout"] == "True\n"
        [zygote] = _fork_servers_of(server.proc.pid)
        os.kill(zygote, signal.SIGSTOP)
        res = run(server, WARM_PROBE, timeout=60)
        assert res["status"] == "Success" and res["run_result"]["stdout"] == "False\n", res  # cold
        deadline = time.monotonic() + 120
        while server.healthz()["warm"]["ready"] != 1:
            assert time.monotonic() < deadline, server.healthz()["warm"]
            time.sleep(0.2)
        assert run(server, WARM_PROBE)["run_result"]["stdout"] == "True\n"
        assert_contained(server)


def test_health_says_why_an_execution_would_start_cold(cold):
    warm_state = cold.healthz()["warm"]
    assert warm_state["enabled"] is False and "--no-warm" in warm_state["reason"]
