"""The exact permissions the operator needs: the Helm chart and ``manifests/install.yaml`` render
these rules (``python -m wmrl_operator.rbac`` prints the ClusterRole YAML).

Least privilege, and why each rule is there:

- WMRLRuns: watch them, patch kopf's annotations, delete on ``ttlSecondsAfterFinished``;
  ``/status`` for phase/conditions; ``/finalizers`` because owner references set
  ``blockOwnerDeletion`` (OwnerReferencesPermissionEnforcement);
- the children it creates (ConfigMaps, Services, ServiceAccounts, Roles, RoleBindings, Jobs,
  Deployments, NetworkPolicies): create (a POST when the cache knows the child is absent),
  patch (server-side apply), get/list/watch, delete (trainer restarts, pruning);
- PersistentVolumeClaims get: a run naming a missing claim waits (WaitingForReferences);
- EndpointSlices get/list/watch: the trainer's Role grants it, and RBAC only lets a subject grant
  what it holds itself (no ``escalate``/``bind`` needed);
- Events: transitions are posted as Events;
- Pods and Events list: while no sandbox Pod is ready, the resync reads the pool's Pods (and the
  kubelet's FailedCreatePodSandBox Events of those stuck being created) to say why on the run
  (condition SandboxReady: a runtime that cannot give the isolation, a crash loop);
- CRDs list/watch: kopf's resource discovery;
- webhook configurations: only with ``--webhook``, and only the operator's own. kopf's managed
  mode (``settings.admission.managed``) creates a Validating *and* a Mutating
  WebhookConfiguration named ``WEBHOOK_CONFIGURATION`` (the mutating one without webhooks: the
  operator registers none) and then only patches them; it never gets, lists, watches, updates or
  deletes them. ``patch`` is limited to that name by ``resourceNames``. ``create`` cannot be:
  Kubernetes RBAC never matches a create against ``resourceNames`` (the object has no name
  until it exists), so a rule with them would refuse every create, and kopf creates before it
  patches (a 403 there stops the operator: it is one of kopf's root tasks). The webhook's TLS
  is self-signed in memory at start-up (``webhook.py``): no Secret is read or written.
"""

from __future__ import annotations

from typing import Any

import yaml

from wmrl.api.schema import GROUP, PLURAL
from wmrl.api.vocabulary import WEBHOOK_CONFIGURATION

CHILD_VERBS = ["get", "list", "watch", "create", "patch", "update", "delete"]

CLUSTER_ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch", "update", "delete"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "serviceaccounts"], "verbs": CHILD_VERBS},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": CHILD_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": CHILD_VERBS},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": CHILD_VERBS},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": CHILD_VERBS},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
    # A calibration's token: created once (409 when it exists). Never read, listed, updated or watched: the
    # operator must not be a way to read the cluster's Secrets.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    # Kueue (when installed): suspend and resume a queued run through its Workload's spec.active.
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "patch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
]

def lease_rules(lease: str) -> list[dict[str, Any]]:
    """Leader election (``--leader-elect``), a Role in the operator's own namespace: ``create`` a
    Lease (it cannot be limited by name, see the webhook rules below), get/update only its own."""
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "update"]},
    ]


WEBHOOK_RESOURCES = ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]

WEBHOOK_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": WEBHOOK_RESOURCES, "verbs": ["create"]},
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": WEBHOOK_RESOURCES,
     "resourceNames": [WEBHOOK_CONFIGURATION], "verbs": ["patch"]},
]


def rules(webhook: bool = False) -> list[dict[str, Any]]:
    return [{k: list(v) if isinstance(v, list) else v for k, v in r.items()}
            for r in CLUSTER_ROLE_RULES + (WEBHOOK_RULES if webhook else [])]


def cluster_role(name: str = "wmrl-operator", webhook: bool = False) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "wmrl-operator"}},
            "rules": rules(webhook)}


def cluster_role_binding(name: str = "wmrl-operator", namespace: str = "wmrl-system",
                         service_account: str = "wmrl-operator") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "wmrl-operator"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]}


if __name__ == "__main__":
    print(yaml.safe_dump(cluster_role(webhook=True), sort_keys=False), end="")
