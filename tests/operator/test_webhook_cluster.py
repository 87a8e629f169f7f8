"""The optional validating webhook: kopf's managed configuration, the apiserver calling it, and the
pydantic validation answering an AdmissionReview."""

import json
import socket
import uuid

import httpx
import pytest

from operator_helpers import Operator, run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebhookOperator(Operator):
    def __init__(self, *a, port, **kw):
        super().__init__(*a, **kw)
        self.port = port

    def start(self):
        import os, subprocess, sys
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        cmd = [sys.executable, "-m", "wmrl.cli", "operator", "--standalone", "--namespace", self.namespace,
               "--health-port", "0", "--metrics-port", "0", "--webhook", "--webhook-host", "localhost",
               "--webhook-port", str(self.port)]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        return self


def review(spec):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "operation": "CREATE",
                        "kind": {"group": "wmrl.dev", "version": "v1alpha1", "kind": "WMRLRun"},
                        "resource": {"group": "wmrl.dev", "version": "v1alpha1", "resource": "wmrlruns"},
                        "userInfo": {"username": "test"}, "namespace": "default",
                        "object": {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun",
                                   "metadata": {"name": "w", "namespace": "default"}, "spec": spec}}}


def test_webhook_is_registered_called_and_rejects_with_the_field(kube, crd_installed, namespace, tmp_path):
    port = free_port()
    op = WebhookOperator(crd_installed.kubeconfig, namespace, tmp_path / "operator.log", port=port).start()
    try:
        def config():
            res = kube.run("get", "validatingwebhookconfiguration", "wmrl.dev", "-o", "json", check=False)
            if res.returncode:
                return None
            hooks = json.loads(res.stdout)["webhooks"]
            return hooks if f":{port}/" in hooks[0]["clientConfig"]["url"] else None
        (hook,) = wait_for(config, timeout=60, what="ValidatingWebhookConfiguration")
        assert hook["failurePolicy"] == "Ignore"
        kube.apply(run_manifest("hooked"))  # admitted through the webhook
        wait_for(lambda: kube.status("hooked").get("phase") in ("Pending", "Running"), what="reconciled")

        url = hook["clientConfig"]["url"]
        good = httpx.post(url, json=review(run_manifest("w")["spec"]), verify=False, timeout=10).json()
        assert good["response"]["allowed"] is True
        bad_spec = run_manifest("w", sandbox={"minReplicas": 3, "maxReplicas": 1})["spec"]
        bad = httpx.post(url, json=review(bad_spec), verify=False, timeout=10).json()["response"]
        assert bad["allowed"] is False
        assert "spec.sandbox" in bad["status"]["message"] and "minReplicas" in bad["status"]["message"]
    finally:
        op.stop()
        kube.run("delete", "validatingwebhookconfiguration", "wmrl.dev", "--ignore-not-found", check=False)
