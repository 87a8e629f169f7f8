"""The optional validating webhook: kopf's managed configuration, the apiserver calling it, the
pydantic validation answering an AdmissionReview, and the operator running it with RBAC limited
to its own webhook configurations."""

import json
import socket
import uuid

import httpx
import pytest
import yaml

from operator_helpers import Operator, run_manifest, wait_for
from wmrl.api.generate import rbac_rules
from wmrl_operator.rbac import WEBHOOK_CONFIGURATION

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
            res = kube.run("get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "-o", "json", check=False)
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
        delete_configurations(kube)


def delete_configurations(kube):
    """kopf's managed mode makes both: a validating and an (empty) mutating configuration."""
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        kube.run("delete", kind, WEBHOOK_CONFIGURATION, "--ignore-not-found", check=False)


def token_kubeconfig(kube, namespace, service_account, path):
    """A kubeconfig that authenticates as ``service_account`` (a bound token), same cluster."""
    config = json.loads(kube.run("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout)
    token = kube.run("create", "token", service_account, "-n", namespace, "--duration=3600s").stdout.strip()
    config["users"] = [{"name": service_account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = service_account
    path.write_text(json.dumps(config))
    return path


def test_webhook_runs_with_rbac_limited_to_its_own_configurations(kube, crd_installed, namespace, tmp_path):
    """The operator, with --webhook, as a service account holding exactly the chart's rules (the
    namespaced ones in its namespace, as with watchedNamespaces): it may patch only the webhook
    configurations named ``wmrl.dev``, and it still starts, registers the webhook and reconciles."""
    rules = rbac_rules()
    sa, cluster_name = "wmrl-op", f"wmrl-op-{namespace}"
    subject = f"system:serviceaccount:{namespace}:{sa}"
    binding_subject = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    rbac_api = "rbac.authorization.k8s.io/v1"
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        {"apiVersion": rbac_api, "kind": "ClusterRole", "metadata": {"name": cluster_name},
         "rules": rules["cluster"] + rules["webhook"]},
        {"apiVersion": rbac_api, "kind": "ClusterRoleBinding", "metadata": {"name": cluster_name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
         "subjects": binding_subject},
        {"apiVersion": rbac_api, "kind": "Role", "metadata": {"name": sa, "namespace": namespace},
         "rules": rules["namespaced"]},
        {"apiVersion": rbac_api, "kind": "RoleBinding", "metadata": {"name": sa, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": binding_subject},
    ]
    kube.run("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    try:
        def can(verb, resource, *extra):
            res = kube.run("auth", "can-i", verb, resource, f"--as={subject}", *extra, check=False)
            return res.stdout.strip() == "yes"

        wait_for(lambda: can("patch", f"validatingwebhookconfigurations.admissionregistration.k8s.io/"
                                      f"{WEBHOOK_CONFIGURATION}"), what="the bindings in effect")
        for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            kind = f"{plural}.admissionregistration.k8s.io"
            assert can("patch", f"{kind}/{WEBHOOK_CONFIGURATION}"), kind
            assert not can("patch", f"{kind}/someone-elses"), kind
            for verb in ("get", "update", "delete"):
                assert not can(verb, f"{kind}/{WEBHOOK_CONFIGURATION}"), (verb, kind)
            assert not can("list", kind) and not can("watch", kind), kind
            assert can("create", kind), kind  # RBAC cannot limit create by name (rbac.py)
        assert not can("get", "secrets", "-n", namespace)

        port = free_port()
        kubeconfig = token_kubeconfig(kube, namespace, sa, tmp_path / "operator.kubeconfig")
        log = tmp_path / "operator.log"
        op = WebhookOperator(kubeconfig, namespace, log, port=port).start()
        try:
            def config():
                res = kube.run("get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "-o", "json", check=False)
                hooks = json.loads(res.stdout).get("webhooks") if res.returncode == 0 else None
                return hooks if hooks and f":{port}/" in hooks[0]["clientConfig"]["url"] else None
            wait_for(config, timeout=60, what="ValidatingWebhookConfiguration patched by the limited operator")
            assert kube.run("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIGURATION, check=False).returncode == 0
            kube.apply(run_manifest("limited"))
            wait_for(lambda: kube.status("limited").get("phase") in ("Pending", "Running"), timeout=60,
                     what="reconciled under the limited RBAC")
            assert kube.get("deployment", "limited-sandbox") is not None
            assert op.proc.poll() is None, "the operator exited"
            text = log.read_text(errors="replace")
            assert "Forbidden" not in text and " 403" not in text, text[-4000:]
        finally:
            op.stop()
    finally:
        delete_configurations(kube)
        kube.run("delete", "clusterrolebinding,clusterrole", cluster_name, "--ignore-not-found", check=False)
