"""A collection task whose public data is too large to upload, run for real from a mounted tasks volume.

A real sandbox server (root mode, warm) is started with ``--tasks-dir`` on a normalised-layout
collection outside /tmp; the trainer's dispatcher, told that the servers mount that directory, sends
``data_dir`` instead of the files. The solution reads ``data/test.csv`` with pandas (the sandbox image's
stack), its submission is graded by the task's own grader in the grading subprocess.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from collections_fixture import bikes_rmsle
from wmrl.collection_tasks import UPLOAD_LIMIT_BYTES, TaskTooLargeForUpload
from wmrl.task_layouts import load_collection
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_sandbox.local import LocalServer

SOLUTION = """
import numpy as np, pandas as pd
test = pd.read_csv('data/test.csv')
assert os.path.getsize('data/big.bin') > 16 << 20
pd.DataFrame({'datetime': test['datetime'], 'count': np.exp(1 + 0.1 * test['hour'])}).to_csv('submission.csv', index=False)
""".replace("import numpy", "import os\nimport numpy", 1)


@pytest.fixture(scope="module")
def collection():
    parent = next(p for p in ("/srv", "/opt", "/var/lib") if os.path.isdir(p))
    base = Path(tempfile.mkdtemp(prefix="wmrl-test-mounted-", dir=parent))
    try:
        bikes_rmsle(base)
        public = base / "bike-sharing-demand" / "data" / "public"
        with open(public / "big.bin", "wb") as fh:  # over the upload limit: only a mount can bring it
            fh.truncate(UPLOAD_LIMIT_BYTES + (1 << 20))
        for directory, _, files in os.walk(base):
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(os.path.join(directory, name), 0o644)
        yield base
    finally:
        shutil.rmtree(base)


def test_a_large_collection_task_runs_from_the_mounted_volume(collection):
    (task,) = load_collection(collection, "normalised")
    assert task.public.total_bytes > UPLOAD_LIMIT_BYTES
    with LocalServer(slots=1, args=("--tasks-dir", str(collection))) as server, \
            SandboxDispatcher(StaticEndpoints([server.url]), timeout=120, tasks_dir=str(collection)) as dispatcher:
        assert dispatcher.data_dir(task) == "bike-sharing-demand/data/public"
        outcome = dispatcher.run_task(task, SOLUTION).result(timeout=300)
    assert outcome.status.value == "valid", outcome
    # The noise-free formula of the answers: RMSLE about 0.2, ahead of 94% of the board (0.1 .. 2.0).
    assert outcome.rank_score == pytest.approx(0.94) and "rmsle = 0.19" in outcome.feedback, outcome


def test_without_the_mount_the_upload_is_refused_saying_how_to_mount(collection):
    (task,) = load_collection(collection, "normalised")
    with SandboxDispatcher(StaticEndpoints(["http://127.0.0.1:9"]), timeout=5) as dispatcher:
        assert dispatcher.data_dir(task) is None
        with pytest.raises(TaskTooLargeForUpload, match="spec.tasks.pvc"):
            dispatcher.run_task(task, SOLUTION)
    # A tasks directory the public directory is not inside: uploaded (here: refused), never mounted.
    with SandboxDispatcher(StaticEndpoints(["http://127.0.0.1:9"]), timeout=5, tasks_dir="/nonexistent") as other:
        assert other.data_dir(task) is None
