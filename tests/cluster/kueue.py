"""Kueue's controller manager, built from source by ``tests/cluster/build``, against the test control plane.

Kueue admits a Job by unsuspending it; that is all the operator's admission tests need, so the
manager runs with the batch/job integration only, without leader election and without its
webhooks registered (the apiserver cannot reach a webhook outside the cluster's Services; Kueue's
job reconciler does the admission either way, and the operator creates queued Jobs suspended, as
Kueue's mutating webhook would make them). Kueue still serves its webhook and metrics endpoints
over TLS, so a self-signed certificate is made for them; with Kueue's internal certificate
management off, its metrics certificate path is fixed at ``/etc/kueue/metrics/certs``.

Standard library only::

    from kueue import start
    manager = start(cluster, state_dir)    # installs the CRDs, starts the manager, waits until ready
    manager.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's main without internal cert management
NAMESPACE = "kueue-system"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        return
    subprocess.run(["openssl", "req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-keyout", "tls.key", "-out", "tls.crt", "-days", "3650", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   cwd=directory, check=True, capture_output=True)


def config_yaml(cert_dir: Path, health_port: int, metrics_port: int, webhook_port: int) -> str:
    return f"""apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: {NAMESPACE}
health:
  healthProbeBindAddress: 127.0.0.1:{health_port}
metrics:
  bindAddress: 127.0.0.1:{metrics_port}
webhook:
  host: 127.0.0.1
  port: {webhook_port}
  certDir: {cert_dir}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["batch/job"]
featureGates:
  VisibilityOnDemand: false
"""


@dataclass
class Manager:
    process: subprocess.Popen
    log: Path
    health_url: str

    def stop(self, timeout: float = 15.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.is_file() else ""


def install_crds(cluster, crd_dir: Path) -> None:
    """Kueue's CRDs, server-side (some exceed the client-side apply annotation's size limit)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
    cluster.kubectl("wait", "--for", "condition=established", "--timeout=60s", "-f", str(crd_dir))
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", NAMESPACE)


def start(cluster, state_dir: Path, timeout: float = 90.0) -> Manager:
    binary = cluster.binary("kueue")
    install_crds(cluster, binary.parent / "crds")
    state_dir.mkdir(parents=True, exist_ok=True)
    _self_signed(state_dir / "webhook-certs")
    _self_signed(METRICS_CERT_DIR)
    health, metrics, webhook = _free_port(), _free_port(), _free_port()
    config = state_dir / "kueue-config.yaml"
    config.write_text(config_yaml(state_dir / "webhook-certs", health, metrics, webhook))
    log = state_dir / "kueue.log"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    with open(log, "ab") as out:
        process = subprocess.Popen([str(binary), "--config", str(config)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    manager = Manager(process, log, f"http://127.0.0.1:{health}/readyz")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited with {process.returncode}:\n{manager.log_tail()}")
        try:
            with urllib.request.urlopen(manager.health_url, timeout=2) as resp:
                if resp.status == 200:
                    return manager
        except OSError:
            pass
        time.sleep(0.5)
    manager.stop()
    raise RuntimeError(f"kueue not ready after {timeout:.0f} s:\n{manager.log_tail()}")
