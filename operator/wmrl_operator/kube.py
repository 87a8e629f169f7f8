"""A small asyncio Kubernetes client for the handful of calls the operator makes.

kopf watches; this client writes. It speaks plain HTTPS through aiohttp with the credentials
of the kubeconfig (``KUBECONFIG``) or the in-cluster service account, so children are applied
with real server-side apply (``application/apply-patch+yaml``) without blocking the event loop.
"""

from __future__ import annotations

import json
import ssl
from typing import Any, AsyncIterator, Optional
from urllib.parse import quote

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from wmrl.api.schema import API_VERSION, KIND, PLURAL

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
    (API_VERSION, KIND): PLURAL,
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
}


def _decoded(text: str) -> Any:
    """An answer's body: its JSON, else the text itself (None when empty)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {message}")


# Lists and watches of metadata only (name, labels, annotations, versions): no spec, no status.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def path_for(api_version: str, kind: str, namespace: Optional[str], name: Optional[str] = None,
             subresource: str = "") -> str:
    """The object's path; with ``namespace`` None, the kind's collection across every namespace."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{quote(namespace)}" if namespace is not None else ""
    path = f"{prefix}{scope}/{PLURALS[(api_version, kind)]}"
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


def adopted_managed_fields(entries: list[dict[str, Any]], manager: str = FIELD_MANAGER
                           ) -> Optional[list[dict[str, Any]]]:
    """``metadata.managedFields`` with the fields ``manager`` set by plain writes (``Update`` entries,
    as a POST records them) moved into its ``Apply`` entry of the same API version; None when it has
    none to move.

    Server-side apply removes a field that a new manifest leaves out only if the applier owns it
    *as an applier*: a child created by POST and later applied without one of its fields would keep
    it, owned by the ``Update`` entry. This is client-go's ``csaupgrade`` step for the same manager
    name: after it, the next apply owns, and prunes, everything the operator ever wrote.
    """
    def mine(entry: dict[str, Any], operation: str) -> bool:
        return (entry.get("manager") == manager and entry.get("operation") == operation
                and not entry.get("subresource"))

    updates = [e for e in entries if mine(e, "Update")]
    if not updates:
        return None
    kept = [e for e in entries if not mine(e, "Update")]
    for update in updates:
        applied = next((e for e in kept if mine(e, "Apply") and e.get("apiVersion") == update.get("apiVersion")), None)
        if applied is None:
            kept.append({**update, "operation": "Apply"})
        else:
            kept[kept.index(applied)] = {**applied, "fieldsV1": _union(applied.get("fieldsV1") or {},
                                                                        update.get("fieldsV1") or {})}
    return kept


def _union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two ``FieldsV1`` trees (nested maps of field paths) as one: the fields of either."""
    return {key: _union(a.get(key) or {}, b.get(key) or {}) for key in {**a, **b}}


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
        self._ssl, self._base_url = ctx, self.cfg.host.rstrip("/") + "/"
        self._session = aiohttp.ClientSession(
            base_url=self._base_url,
            connector=aiohttp.TCPConnector(ssl=ctx, limit=64),
            # Per-request socket timeouts, not a total one: waiting for a pooled connection is not an error.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),
        )

        self._watch_session: Optional[aiohttp.ClientSession] = None  # watches: their own connections

    async def close(self) -> None:
        await self._session.close()
        if self._watch_session is not None:
            await self._watch_session.close()

    def _watches(self) -> aiohttp.ClientSession:
        """A session for long-lived watches, without a connection limit: 7 watches per namespace must
        never take the connections that applies and status patches need."""
        if self._watch_session is None:
            self._watch_session = aiohttp.ClientSession(base_url=self._base_url,
                                                        connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0))
        return self._watch_session

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        if self.cfg.refresh_api_key_hook is not None:
            self.cfg.refresh_api_key_hook(self.cfg)  # rotates projected service-account tokens
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self.cfg.get_api_key_with_prefix("authorization") or self.cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        return headers

    async def request(self, method: str, path: str, body: Any = None, params: Optional[dict[str, str]] = None,
                      content_type: str = "application/json", accept: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body)
        headers = {**self._headers(content_type), "Accept": accept}
        async with self._session.request(method, path.lstrip("/"), data=data, params=params, headers=headers) as resp:
            payload = _decoded(await resp.text())
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

    async def list(self, api_version: str, kind: str, namespace: str, label_selector: str = "",
                   field_selector: str = "") -> list[dict[str, Any]]:
        params = {**({"labelSelector": label_selector} if label_selector else {}),
                  **({"fieldSelector": field_selector} if field_selector else {})}
        result = await self.request("GET", path_for(api_version, kind, namespace), params=params or None)
        return result.get("items", [])

    async def list_metadata(self, api_version: str, kind: str, namespace: Optional[str], label_selector: str = "",
                            limit: int = 500, continue_token: Optional[str] = None) -> dict[str, Any]:
        """One page of a metadata-only listing (``namespace`` None: every namespace); its
        ``metadata.continue`` names the next page, its ``metadata.resourceVersion`` the list's version."""
        params = {"limit": str(limit), **({"labelSelector": label_selector} if label_selector else {}),
                  **({"continue": continue_token} if continue_token else {})}
        return await self.request("GET", path_for(api_version, kind, namespace), params=params, accept=METADATA_LIST)

    async def watch_metadata(self, api_version: str, kind: str, namespace: Optional[str], label_selector: str = "",
                             resource_version: str = "", timeout_s: int = 300) -> AsyncIterator[dict[str, Any]]:
        """The watch events (``{"type", "object"}``, objects as metadata) from ``resource_version``
        until the apiserver ends the watch (after ``timeout_s``), with bookmarks."""
        params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s),
                  **({"labelSelector": label_selector} if label_selector else {}),
                  **({"resourceVersion": resource_version} if resource_version else {})}
        headers = {**self._headers(), "Accept": METADATA}
        # No read timeout: a quiet watch sends nothing until its next bookmark (about a minute).
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s + 60)
        async with self._watches().get(path_for(api_version, kind, namespace).lstrip("/"), params=params,
                                     headers=headers, timeout=timeout) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, _decoded(await resp.text()))
            buffer = b""
            async for chunk in resp.content.iter_any():  # lines of any length (iter_line has a limit)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    async def create(self, obj: dict[str, Any], field_manager: Optional[str] = None) -> dict[str, Any]:
        """POST one namespaced object (409 when it exists). With ``field_manager`` its fields are
        recorded as that manager's, in an ``Update`` entry (see :func:`adopted_managed_fields`)."""
        meta = obj["metadata"]
        params = {"fieldManager": field_manager} if field_manager else None
        return await self.request("POST", path_for(obj["apiVersion"], obj["kind"], meta["namespace"]), obj, params)

    async def json_patch(self, api_version: str, kind: str, namespace: str, name: str,
                         operations: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.request("PATCH", path_for(api_version, kind, namespace, name), operations,
                                  content_type="application/json-patch+json")

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
