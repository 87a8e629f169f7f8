"""A small asyncio Kubernetes client for the handful of calls the operator makes.

kopf watches; this client writes. It speaks plain HTTPS through aiohttp with the credentials
of the kubeconfig (``KUBECONFIG``) or the in-cluster service account, so children are applied
with real server-side apply (``application/apply-patch+yaml``) without blocking the event loop.
"""

from __future__ import annotations

import json
import ssl
from typing import Any, Optional
from urllib.parse import quote

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

FIELD_MANAGER = "wmrl-operator"

# (apiVersion, kind) -> plural; the API prefix follows from apiVersion.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Pod"): "pods",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Secret"): "secrets",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("wmrl.dev/v1alpha1", "WMRLRun"): "wmrlruns",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
}


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {message}")


def path_for(api_version: str, kind: str, namespace: str, name: Optional[str] = None, subresource: str = "") -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{quote(namespace)}/{PLURALS[(api_version, kind)]}"
    if name:
        path += "/" + quote(name)
    if subresource:
        path += "/" + subresource
    return path


def load_configuration() -> k8s_client.Configuration:
    """In-cluster service account if present, else the kubeconfig (``KUBECONFIG`` or ~/.kube/config)."""
    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=cfg)
    return cfg


class Kube:
    """Async JSON calls against one apiserver. Create inside the running event loop."""

    def __init__(self, cfg: Optional[k8s_client.Configuration] = None, timeout: float = 30.0):
        self.cfg = cfg or load_configuration()
        ctx = ssl.create_default_context(cafile=self.cfg.ssl_ca_cert) if self.cfg.ssl_ca_cert else ssl.create_default_context()
        if not self.cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cfg.cert_file:
            ctx.load_cert_chain(self.cfg.cert_file, self.cfg.key_file)
        self._session = aiohttp.ClientSession(
            base_url=self.cfg.host.rstrip("/") + "/",
            connector=aiohttp.TCPConnector(ssl=ctx, limit=64),
            # Per-request socket timeouts, not a total one: waiting for a pooled connection is not an error.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),
        )

    async def close(self) -> None:
        await self._session.close()

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        if self.cfg.refresh_api_key_hook is not None:
            self.cfg.refresh_api_key_hook(self.cfg)  # rotates projected service-account tokens
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self.cfg.get_api_key_with_prefix("authorization") or self.cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        return headers

    async def request(self, method: str, path: str, body: Any = None, params: Optional[dict[str, str]] = None,
                      content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body)
        async with self._session.request(method, path.lstrip("/"), data=data, params=params,
                                         headers=self._headers(content_type)) as resp:
            text = await resp.text()
            try:
                payload = json.loads(text) if text else None
            except ValueError:
                payload = text
            if resp.status >= 400:
                raise ApiError(resp.status, payload)
            return payload

    async def apply(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply (create or converge) one namespaced object; ``force`` takes over fields."""
        meta = obj["metadata"]
        path = path_for(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        return await self.request("PATCH", path, obj, {"fieldManager": field_manager, "force": "true"},
                                  content_type="application/apply-patch+yaml")

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Optional[dict[str, Any]]:
        try:
            return await self.request("GET", path_for(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request("GET", path_for(api_version, kind, namespace), params=params)
        return result.get("items", [])

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self.request("POST", path_for(obj["apiVersion"], obj["kind"], meta["namespace"]), obj)

    async def merge_patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any],
                          subresource: str = "") -> dict[str, Any]:
        return await self.request("PATCH", path_for(api_version, kind, namespace, name, subresource), patch,
                                  content_type="application/merge-patch+json")

    async def delete(self, api_version: str, kind: str, namespace: str, name: str,
                     propagation: str = "Background", uid: Optional[str] = None) -> bool:
        """Delete; False if already gone. With ``uid`` only that incarnation is deleted."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path_for(api_version, kind, namespace, name), body)
            return True
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
