import os
import signal
import subprocess
import sys
import time

import numpy as np

from wmrl.calibration.state import CalibrationConfig
from wmrl.calibration.store import FileStore

WRITER = """
import sys, numpy as np
from wmrl.calibration.store import FileStore
path, trainer, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = FileStore(path)
rng = np.random.default_rng(abs(hash(trainer)) % 1000)
for i in range(n):
    g = [{"wm": rng.random(8).round(6).tolist(), "env": rng.random(8).round(6).tolist()} for _ in range(8)]
    _, state = store.transact(lambda s: s.observe(trainer, str(i), g))
    print(state.version, flush=True)
"""


def run_writer(path, trainer, n):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), trainer, str(n)],
                            stdout=subprocess.PIPE, text=True)


def test_several_processes_on_one_file_lose_nothing(tmp_path):
    path = tmp_path / "state.json"
    writers = [run_writer(path, f"w{i}", 30) for i in range(4)]
    for w in writers:
        w.communicate(timeout=120)
        assert w.returncode == 0
    view = FileStore(path).load().view()
    assert view["batches"] == 120 and view["pairsSeen"] == 120 * 64 and view["version"] == 120


def test_a_writer_killed_mid_write_leaves_a_loadable_state(tmp_path):
    path = tmp_path / "state.json"
    acknowledged = 0
    rng = np.random.default_rng(0)
    for round_ in range(8):
        writer = run_writer(path, f"r{round_}", 10_000)
        time.sleep(0.2 + 0.3 * rng.random())
        os.kill(writer.pid, signal.SIGKILL)
        out, _ = writer.communicate()
        versions = [int(v) for v in out.split()]
        state = FileStore(path).load()  # must parse: the old or the new file, never a torn one
        if versions:
            acknowledged = versions[-1]
        assert state.version >= acknowledged  # nothing acknowledged is lost
        assert state.view()["pairsSeen"] == state.version * 64
    FileStore(path).transact(lambda s: None)  # the next writer sweeps temp files of killed ones
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_transact_without_change_does_not_rewrite(tmp_path):
    store = FileStore(tmp_path / "s.json", CalibrationConfig(min_pairs=1))
    store.transact(lambda s: s.observe("t", "b", [{"wm": [0.1, 0.9], "env": [0.2, 0.8]}]))
    mtime = os.stat(tmp_path / "s.json").st_mtime_ns
    applied, state = store.transact(lambda s: s.observe("t", "b", [{"wm": [0.1, 0.9], "env": [0.2, 0.8]}]))
    assert applied is False and state.version == 1
    assert os.stat(tmp_path / "s.json").st_mtime_ns == mtime
