"""Helpers shared by the operator tests (a plain module: conftest.py is not importable by name,
and importing it as `conftest` picks whichever conftest.py was loaded first)."""

import os
import subprocess
import sys
import time

from subprocesses import ManagedProcess


class Operator(ManagedProcess):
    """`wmrl operator --standalone --namespace NS` as a real process; restartable and killable."""

    stop_timeout = 15.0

    def __init__(self, kubeconfig, namespace, log_path, resync=1.0, extra_args=(), env=None):
        self.kubeconfig, self.namespace, self.log_path, self.resync = kubeconfig, namespace, log_path, resync
        self.extra_args, self.env = tuple(extra_args), dict(env or {})
        self.proc = None

    def start(self):
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        cmd = [sys.executable, "-m", "wmrl.cli", "operator", "--standalone", "--namespace", self.namespace,
               "--health-port", "0", "--metrics-port", "0", "--resync-interval", str(self.resync),
               "--calibration-interval", "2", *self.extra_args]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def stop(self):
        super().stop()
        self.log.close()


def wait_for(predicate, timeout=30.0, interval=0.25, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def run_manifest(name, **spec):
    body = {"policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers"},
            "tasks": {"builtin": "mini-ml"}, "trainer": {"gpusPerNode": 0}}
    body.update(spec)
    return {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": name}, "spec": body}
