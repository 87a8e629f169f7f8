"""The exact permissions the operator needs: the Helm chart and ``manifests/install.yaml`` render
these rules (``python -m wmrl_operator.rbac`` prints the ClusterRole YAML).

Least privilege, and why each rule is there:

- WMRLRuns: watch them, patch kopf's annotations, delete on ``ttlSecondsAfterFinished``;
  ``/status`` for phase/conditions; ``/finalizers`` because owner references set
  ``blockOwnerDeletion`` (OwnerReferencesPermissionEnforcement);
- the children it creates (ConfigMaps, Services, ServiceAccounts, Roles, RoleBindings, Jobs,
  Deployments, NetworkPolicies): create/patch (server-side apply), get/list/watch, delete
  (trainer restarts);
- PersistentVolumeClaims get: a spec naming a missing claim is reported as InvalidSpec;
- EndpointSlices get/list/watch: the trainer's Role grants it, and RBAC only lets a subject grant
  what it holds itself (no ``escalate``/``bind`` needed);
- Events: transitions are posted as Events;
- CRDs list/watch: kopf's resource discovery;
- ValidatingWebhookConfigurations: only with ``--webhook`` (kopf manages its own configuration).
"""

from __future__ import annotations

from typing import Any

import yaml

CHILD_VERBS = ["get", "list", "watch", "create", "patch", "update", "delete"]

CLUSTER_ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["wmrl.dev"], "resources": ["wmrlruns"], "verbs": ["get", "list", "watch", "patch", "update", "delete"]},
    {"apiGroups": ["wmrl.dev"], "resources": ["wmrlruns/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["wmrl.dev"], "resources": ["wmrlruns/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "serviceaccounts"], "verbs": CHILD_VERBS},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": CHILD_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": CHILD_VERBS},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": CHILD_VERBS},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": CHILD_VERBS},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
]

WEBHOOK_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
     "verbs": ["get", "list", "watch", "create", "patch", "update"]},
]


def rules(webhook: bool = False) -> list[dict[str, Any]]:
    return [dict(r) for r in CLUSTER_ROLE_RULES + (WEBHOOK_RULES if webhook else [])]


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
