"""A task's public data mounted into executions from the tasks volume (``--tasks-dir``, ``data_dir``).

A real server in each isolation mode (root warm and cold, deployed warm and cold, as
test_hostile.py) serves a tasks directory laid out as MLE-bench prepares one: ``<id>/prepared/public``
beside ``<id>/prepared/private/answers.csv``. An execution reads the public files at ``data/``; it
cannot write there, and the private answers are unreadable by any path: absolute, relative, through
links planted in the public directory, or by searching every file it can reach in the places an
answers file could show up (the tasks directory, its working directory, /tmp, /var/tmp, /dev/shm).
The secret searched for is random per test run and only ever written to the answers file; the
program carries it reversed, so its own source never matches.
"""

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, run, start_server
from wmrl_sandbox import data_mount
from wmrl_sandbox.local import LocalServer

MODES = ["root", "root-cold", "deployed", "deployed-cold"]
COMPETITION = "spaceship"
TRAIN = b"id,f0,target\n1,0.5,1\n2,0.1,0\n"


def _tasks_dir(base, secret: str):
    """An MLE-bench-like tasks directory under ``base`` (readable by everyone, as a PVC's files are)."""
    base.mkdir()
    tasks = base / "tasks"
    public = tasks / COMPETITION / "prepared" / "public"
    private = tasks / COMPETITION / "prepared" / "private"
    public.mkdir(parents=True)
    private.mkdir(parents=True)
    (public / "train.csv").write_bytes(TRAIN)
    (public / "test.csv").write_bytes(b"id,f0\n3,0.7\n")
    (private / "answers.csv").write_text(f"id,target\n3,{secret}\n")
    (tasks / "other").mkdir()
    (tasks / "other" / "notes.txt").write_text(f"another task's file {secret}\n")
    # Links a hostile collection (or a careless copy) could leave in the public directory.
    os.symlink("../private/answers.csv", public / "relative-link.csv")
    os.symlink(str(private / "answers.csv"), public / "absolute-link.csv")
    for directory, dirs, files in os.walk(base):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    os.chmod(base.parent, 0o755)
    return tasks


@pytest.fixture(scope="module")
def secret():
    return "answers-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def tasks_base():
    """Outside /tmp, /var/tmp and /dev/shm, which every execution's own tmpfs masks anyway: the
    tasks directory's own mask must do the hiding (as for a PVC at /tasks)."""
    parent = next(p for p in ("/srv", "/opt", "/var/lib") if os.path.isdir(p))
    base = Path(tempfile.mkdtemp(prefix="wmrl-test-tasks-", dir=parent))
    try:
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture(scope="module", params=MODES)
def mounted(request, tmp_path_factory, tasks_base, secret):
    tasks = _tasks_dir(tasks_base / request.param, secret)
    uid = DEPLOYED_UID + 10  # a uid of its own: other modules' deployed servers use DEPLOYED_UID + slots
    with start_server(request.param, tmp_path_factory, 1, uid=uid,
                      args=TEST_ARGS + ("--require-isolation", "--tasks-dir", str(tasks))) as srv:
        yield srv, tasks, request.param


DATA_DIR = f"{COMPETITION}/prepared/public"

READ = """
import os
print(sorted(os.listdir('data')))
print(open('data/train.csv').read(), end='')
"""


def test_an_execution_reads_the_public_directory_at_data(mounted):
    srv, tasks, mode = mounted
    res = run(srv, READ, data_dir=DATA_DIR)
    assert res["status"] == "Success", res
    listing, content = res["run_result"]["stdout"].split("\n", 1)
    assert listing == str(sorted(["train.csv", "test.csv", "relative-link.csv", "absolute-link.csv"]))
    assert content.encode() == TRAIN
    assert srv.healthz()["tasks_dir"] == os.path.realpath(tasks)


def _probe(secret: str, tasks, answers) -> str:
    """A program that tries every way to the answers and prints what it reached (nothing, if contained)."""
    return f"""
import os
secret = {secret[::-1]!r}[::-1].encode()
reached = []
for path in [{str(answers)!r}, 'data/../private/answers.csv', 'data/../../prepared/private/answers.csv',
             'data/relative-link.csv', 'data/absolute-link.csv', {str(tasks / 'other' / 'notes.txt')!r}]:
    try:
        with open(path, 'rb') as fh:
            reached.append(('opened', path, secret in fh.read()))
    except OSError as exc:
        pass
try:
    listed = os.listdir({str(tasks)!r})
except OSError:
    listed = []
if listed:
    reached.append(('listed', {str(tasks)!r}, listed))
for top in [{str(tasks)!r}, os.getcwd(), '/tmp', '/var/tmp', '/dev/shm']:
    for base, dirs, files in os.walk(top, followlinks=True):
        for name in files:
            path = os.path.join(base, name)
            try:
                with open(path, 'rb') as fh:
                    if secret in fh.read(1 << 20):
                        reached.append(('found', path))
            except OSError:
                pass
print(reached)
"""


def test_the_private_answers_are_unreachable_by_any_path(mounted, secret):
    srv, tasks, mode = mounted
    answers = tasks / COMPETITION / "prepared" / "private" / "answers.csv"
    assert secret in answers.read_text()  # there on the host, readable by everyone
    res = run(srv, _probe(secret, tasks, answers), data_dir=DATA_DIR, run_timeout=20)
    assert res["status"] == "Success", res
    assert res["run_result"]["stdout"].strip() == "[]", (mode, res["run_result"]["stdout"])


def test_without_data_dir_the_tasks_directory_is_hidden_too(mounted, secret):
    srv, tasks, mode = mounted
    answers = tasks / COMPETITION / "prepared" / "private" / "answers.csv"
    res = run(srv, _probe(secret, tasks, answers), run_timeout=20)
    assert res["status"] == "Success" and res["run_result"]["stdout"].strip() == "[]", (mode, res)


WRITE = """
import os
refused = []
for path, mode in (('data/train.csv', 'ab'), ('data/new.csv', 'wb')):
    try:
        with open(path, mode) as fh:
            fh.write(b'x')
    except OSError as exc:
        refused.append(exc.errno)
try:
    os.remove('data/test.csv')
except OSError as exc:
    refused.append(exc.errno)
open('submission.csv', 'w').write('id,target\\n3,1\\n')
print(refused)
"""


def test_writes_to_the_mounted_data_are_refused(mounted):
    srv, tasks, mode = mounted
    public = tasks / COMPETITION / "prepared" / "public"
    res = run(srv, WRITE, data_dir=DATA_DIR, fetch_files=["submission.csv"])
    assert res["status"] == "Success", res
    errnos = eval(res["run_result"]["stdout"])  # a list of ints printed by the program
    assert len(errnos) == 3, (mode, errnos)  # EROFS (or EACCES) each time
    assert (public / "train.csv").read_bytes() == TRAIN and (public / "test.csv").exists()
    assert not (public / "new.csv").exists()
    assert res["files"]["submission.csv"]  # the working directory itself stays writable


@pytest.mark.parametrize("data_dir, says", [
    ("../outside", "without '..'"),
    ("/etc", "must be relative"),
    (f"{COMPETITION}/prepared/nowhere", "no such directory"),
    (".", "the whole of it"),
])
def test_a_bad_data_dir_is_refused_naming_it(mounted, data_dir, says):
    srv, _, _ = mounted
    resp = httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python", "data_dir": data_dir},
                      timeout=30)
    assert resp.status_code == 422 and "data_dir" in resp.json()["error"] and says in resp.json()["error"], resp.text


def test_files_under_data_clash_with_the_mount(mounted):
    srv, _, _ = mounted
    resp = httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python", "data_dir": DATA_DIR,
                                                  "files": {"data/x.csv": "eA=="}}, timeout=30)
    assert resp.status_code == 422 and "data/ is where data_dir is mounted" in resp.json()["error"], resp.text


def test_a_server_without_tasks_dir_refuses_data_dir():
    with LocalServer(slots=1, args=TEST_ARGS + ("--no-warm",)) as srv:
        resp = httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python", "data_dir": "x"},
                          timeout=30)
        assert resp.status_code == 422 and "no tasks directory (--tasks-dir" in resp.json()["error"], resp.text
        assert srv.healthz()["tasks_dir"] is None


def test_a_tasks_dir_holding_the_work_root_is_refused_at_start(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for directory in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
        os.chmod(directory, 0o755)
    done = subprocess.run([sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--host", "127.0.0.1", "--port", "0",
                           "--no-warm", "--work-root", str(work), "--tasks-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--tasks-dir {tmp_path}: the work root" in done.stderr, done.stderr


def test_check_tasks_dir_needs_a_mount_namespace(tmp_path):
    with pytest.raises(ValueError, match="--tasks-dir .*no mount namespace of their own"):
        data_mount.check_tasks_dir(str(tmp_path), work_root="/work", interpreter_root="/usr", mount_namespace=False)
    with pytest.raises(ValueError, match="not a directory"):
        data_mount.check_tasks_dir(str(tmp_path / "none"), work_root="/work", interpreter_root="/usr",
                                   mount_namespace=True)
