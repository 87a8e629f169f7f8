"""Really run a task's solution and grade it with the real grader (test helper).

``run_subprocess`` runs the script as ``main.py`` in a fresh directory holding ``data/``,
like a sandbox does (minus the isolation, which the sandbox tests cover). ``run_in_process``
executes it in this interpreter (scikit-learn already imported), which is ~10x faster and
lets the world-model tests gather a corpus of real outcomes; tracebacks still name
``main.py`` so the grader reads them exactly as sandbox output.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

from wmrl.grading import grade
from wmrl.outcome import Outcome
from wmrl.tasks import Task


def _workdir(task: Task, root: Path) -> Path:
    for rel, content in task.data.items():
        path = root / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def _response(return_code: int, stdout: str, stderr: str) -> dict:
    return {"status": "Success" if return_code == 0 else "Failed", "message": "",
            "run_result": {"status": "Finished", "return_code": return_code, "execution_time": 0.0,
                           "stdout": stdout, "stderr": stderr}}


def _submission(task: Task, root: Path) -> bytes | None:
    path = root / task.submission
    return path.read_bytes() if path.is_file() else None


def run_subprocess(task: Task, code: str, root: Path, timeout: float = 120) -> Outcome:
    root = _workdir(task, root)
    (root / "main.py").write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-B", "main.py"], cwd=root, capture_output=True, text=True,
                          timeout=timeout, env=env)
    return grade(task, _response(proc.returncode, proc.stdout, proc.stderr), _submission(task, root))


def run_in_process(task: Task, code: str, root: Path) -> Outcome:
    """Execute ``code`` here with ``root`` as the working directory (tests run serially)."""
    root = _workdir(task, root)
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    rc = 0
    try:
        os.chdir(root)
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                exec(compile(code, "main.py", "exec"), {"__name__": "__main__"})  # noqa: S102 - the code under test
            except SyntaxError as exc:  # as Python prints it: no traceback header
                rc = 1
                err.write("".join(traceback.format_exception_only(exc)))
            except Exception:  # noqa: BLE001 - any crash of the solution is its runtime error
                rc = 1
                err.write(traceback.format_exc())
    finally:
        os.chdir(old)
    return grade(task, _response(rc, out.getvalue(), err.getvalue()), _submission(task, root))
