"""Scoring (issue 13, item 5): what the program does to itself is a runtime error for the reward; what
goes wrong in the sandbox is ungraded. Real runs through the dispatcher and a real server."""

import os

import pytest

from sandbox_helpers import OK_BODY, TEST_ARGS, Scripted
from wmrl.grading import SandboxFailure, grade
from wmrl.outcome import Status
from wmrl.tasks import Task
from wmrl_sandbox.dispatcher import SandboxDispatcher, SandboxUnavailable, StaticEndpoints
from wmrl_sandbox.local import LocalServer

TASK = Task(name="tiny", description="", kind="classification", metric="accuracy", target="target",
            data={"test.csv": b"id,f0\n1,0.5\n2,0.7\n"}, hidden_labels=b"id,target\n1,0\n2,1\n",
            leaderboard=(1.0, 0.5))
GOOD = "open('submission.csv', 'w').write('id,target\\n1,0\\n2,1\\n')\n"
FETCH_CAP = 200


@pytest.fixture(scope="module")
def dispatcher():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-fetch-bytes", str(FETCH_CAP))) as srv:
        with SandboxDispatcher(StaticEndpoints([srv.url]), timeout=20, max_retries=0) as d:
            yield d


def outcome(d, code, run_timeout=None):
    return d.run_task(TASK, code, run_timeout=run_timeout).result(timeout=120)


def test_a_good_program_is_valid(dispatcher):
    out = outcome(dispatcher, GOOD)
    assert out.status is Status.VALID and out.rank_score == 1.0


@pytest.mark.parametrize("code, error_type", [
    (GOOD + "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),  # kills itself
    (GOOD + "import os, signal\nos.killpg(0, signal.SIGKILL)", "SIGKILL"),  # kills its whole process group
    (GOOD + "import os\nos.abort()", "SIGABRT"),
    (GOOD + "x = bytearray(10**10)", "MemoryError"),  # over the memory limit
    (GOOD + "open('big', 'wb').write(b'x' * (32 << 20))", "OSError"),  # over the file size limit: File too large
    (GOOD + "open('submission.csv', 'a').write('9,1\\n' * 100)\nprint('wrote')", "OutputLimitExceeded"),
    (GOOD + "while True:\n    pass", "TimeLimitExceeded"),
])
def test_failures_the_program_causes_are_runtime_errors(dispatcher, code, error_type):
    out = outcome(dispatcher, code, run_timeout=2)
    assert out.status is Status.RUNTIME_ERR, out
    assert out.error_type == error_type, out


@pytest.mark.skipif(os.geteuid() != 0, reason="kill(-1) as the slot's own uid is contained only in root mode")
def test_killing_every_process_of_its_uid_is_graded(dispatcher):
    """kill(-1) reaches every other process of the execution (not the caller, as Linux does it): the
    program's own result, graded -- valid if it still writes its submission, a runtime error if it
    then dies."""
    spawn = "import os, signal, time\nchild = os.fork()\nif child == 0:\n    time.sleep(60)\n    os._exit(0)\n"
    survives = outcome(dispatcher, spawn + "os.kill(-1, signal.SIGKILL)\n"
                       "assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == -9\n" + GOOD)
    assert survives.status is Status.VALID, survives
    dies = outcome(dispatcher, spawn + GOOD + "os.kill(-1, signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)")
    assert dies.status is Status.RUNTIME_ERR and dies.error_type == "SIGKILL"


def test_fetch_over_the_limit_tells_the_agent_why(dispatcher):
    out = outcome(dispatcher, "open('submission.csv', 'w').write('id,target\\n' + '1,0\\n' * 200)")
    assert out.status is Status.RUNTIME_ERR and out.error_type == "OutputLimitExceeded"
    assert f"{FETCH_CAP} bytes" in out.feedback


SANDBOX_ERRORS = [
    # SandboxFusion's answer when running raised: no results at all
    {"status": "SandboxError", "message": "sandbox error: OSError: disk", "compile_result": None,
     "run_result": None, "executor_pod_name": "p", "files": {}},
    # the sandbox failed around the run: run_result status Error
    {"status": "SandboxError", "message": "sandbox error: could not kill", "compile_result": None,
     "run_result": {"status": "Error", "execution_time": 0.1, "return_code": None, "stdout": "",
                    "stderr": "sandbox error: could not kill"}, "executor_pod_name": "p", "files": {}},
]


@pytest.mark.parametrize("body", SANDBOX_ERRORS)
def test_a_sandbox_error_is_ungraded(body):
    with pytest.raises(SandboxFailure):
        grade(TASK, body, None)
    with Scripted([(200, {}, body)]) as stub:  # the dispatcher retries it, then gives up: no Outcome
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, max_retries=1, backoff=0.01) as d:
            with pytest.raises(SandboxUnavailable, match="SandboxError"):
                d.run_task(TASK, GOOD).result(timeout=30)
        assert stub.calls == 2


def test_a_server_error_is_ungraded():
    with Scripted([(500, {}, {"error": "boom"})]) as stub:
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, max_retries=1, backoff=0.01) as d:
            with pytest.raises(SandboxUnavailable, match="HTTP 500"):
                d.run_task(TASK, GOOD).result(timeout=30)


def test_a_sandbox_error_then_a_result_is_graded():
    """Ungraded only when every attempt failed: a retry that runs the program is graded as usual."""
    with Scripted([(200, {}, SANDBOX_ERRORS[0]), (200, {}, OK_BODY)]) as stub:
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, max_retries=1, backoff=0.01) as d:
            out = d.run_task(TASK, GOOD).result(timeout=30)
    assert out.status is Status.RAN_NO_SUB  # the stub returns no submission
