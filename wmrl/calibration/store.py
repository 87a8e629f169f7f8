"""Where a calibration state lives, and how an update becomes durable.

Both stores offer the same two calls:

* ``load() -> CalibrationState``: the current state (a fresh one when none is stored);
* ``transact(fn) -> (result, state)``: apply ``fn`` to the current state and make the
  result durable before returning. ``fn`` must be a pure function of the state it is
  given (it may be applied more than once, to newer states, when writers race).

:class:`ConfigMapStore` uses optimistic concurrency: it writes with the
``resourceVersion`` it read; on 409 Conflict it re-reads, re-applies and retries,
so any number of replicas on one ConfigMap lose no update. :class:`FileStore`
takes an exclusive ``fcntl`` lock on ``<path>.lock`` for the read-modify-write and
replaces the file atomically (temp file, fsync, rename, fsync of the directory),
so a writer killed at any instant leaves either the old or the new state.

Stored state that cannot be read raises :class:`~wmrl.calibration.state.StateError`
with a message saying what to do. It is never overwritten automatically (it may be
a hand edit worth keeping); deleting the ConfigMap (or file), or emptying its
``state.json`` key, re-initialises the calibration cleanly.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from wmrl.calibration.state import CalibrationConfig, CalibrationState, StateError

__all__ = ["ConfigMapStore", "FileStore", "StoreDenied", "StoreError", "open_store"]

T = TypeVar("T")
KEY = "state.json"


class StoreError(RuntimeError):
    """The store could not be reached or kept conflicting (transient: retry later)."""


class StoreDenied(StoreError):
    """The apiserver refused this service the store (HTTP 403): its Role may not be in effect yet."""


class FileStore:
    def __init__(self, path: str | os.PathLike, config: CalibrationConfig = CalibrationConfig()):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.config = config
        self._cache: Optional[tuple[tuple[int, int, int], CalibrationState]] = None
        self._mutex = threading.Lock()
        self._swept = False
        self.conflicts = 0

    def describe(self) -> str:
        return f"file {self.path}"

    def _sweep(self) -> None:
        """Under the exclusive lock: remove temp files left by writers killed mid-write."""
        for leftover in self.path.parent.glob(f".{self.path.name}.*"):
            leftover.unlink(missing_ok=True)
        self._swept = True

    def _lock(self, exclusive: bool):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return fd

    def _read(self) -> CalibrationState:
        """The stored state (cached by inode/mtime/size: a rename always changes the inode)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return CalibrationState(self.config)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1].copy()
        text = self.path.read_text()
        if not text.strip():
            return CalibrationState(self.config)
        try:
            state = CalibrationState.loads(text)
        except StateError as exc:
            raise StateError(f"{self.describe()}: {exc}; fix it, or delete the file to re-initialise") from None
        self._cache = (key, state)
        return state.copy()

    def load(self) -> CalibrationState:
        fd = self._lock(exclusive=False)
        try:
            with self._mutex:
                return self._read()
        finally:
            os.close(fd)

    def transact(self, fn: Callable[[CalibrationState], T]) -> tuple[T, CalibrationState]:
        fd = self._lock(exclusive=True)
        try:
            with self._mutex:
                if not self._swept:
                    self._sweep()
                state = self._read()
                before = state.version
                result = fn(state)
                if state.version != before or not self.path.exists():
                    self._write(state)
                return result, state
        finally:
            os.close(fd)

    def _write(self, state: CalibrationState) -> None:
        text = state.dumps()
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        st = os.stat(self.path)
        self._cache = ((st.st_ino, st.st_mtime_ns, st.st_size), state.copy())


class ConfigMapStore:
    """State in key ``state.json`` of a ConfigMap (created when missing; other keys and metadata kept)."""

    def __init__(self, namespace: str, name: str, config: CalibrationConfig = CalibrationConfig(),
                 api: Any = None, kubeconfig: Optional[str] = None, max_attempts: int = 64, timeout: float = 10.0):
        self.namespace, self.name, self.config = namespace, name, config
        self.api = api if api is not None else _core_api(kubeconfig)
        self.max_attempts, self.timeout = max_attempts, timeout
        # (object as read, its state): only the single transacting thread touches it
        self._cache: Optional[tuple[dict, CalibrationState]] = None
        self._mutex = threading.Lock()
        self.conflicts = 0

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    # ---- raw API: JSON bytes in and out. The typed client validates and converts a 100 KB
    # object through pydantic models on every call, which costs more than the request itself.
    def _request(self, method: str, path: str, body: Optional[dict] = None) -> tuple[int, Optional[dict]]:
        client = self.api.api_client
        _, url, headers, _, _ = client.param_serialize(
            method=method, resource_path=path, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": "application/json"})
        try:
            response = client.rest_client.pool_manager.request(
                method, url, body=None if body is None else json.dumps(body, separators=(",", ":")).encode(),
                headers=headers, timeout=self.timeout)
        except Exception as exc:  # connection refused, timeouts, TLS: all transient for us
            raise StoreError(f"{self.describe()}: {method} failed: {exc}") from None
        data = json.loads(response.data) if response.data else None
        if response.status in (200, 201, 404, 409) or (response.status == 403 and method == "POST"):
            return response.status, data
        message = (data or {}).get("message", "") if isinstance(data, dict) else ""
        error = StoreDenied if response.status == 403 else StoreError
        raise error(f"{self.describe()}: {method} failed: HTTP {response.status} {message}".rstrip())

    def _path(self, named: bool = True) -> str:
        base = f"/api/v1/namespaces/{self.namespace}/configmaps"
        return f"{base}/{self.name}" if named else base

    def _read_object(self) -> Optional[dict]:
        status, data = self._request("GET", self._path())
        if status == 409:
            raise StoreError(f"{self.describe()}: unexpected 409 on read")
        return data if status == 200 else None

    def _parse(self, obj: Optional[dict]) -> CalibrationState:
        text = ((obj or {}).get("data") or {}).get(KEY, "")
        if not text.strip():
            return CalibrationState(self.config)
        try:
            return CalibrationState.loads(text)
        except StateError as exc:
            raise StateError(
                f"{self.describe()} key {KEY}: {exc}; fix it, delete the ConfigMap or empty the key to re-initialise"
            ) from None

    def load(self) -> CalibrationState:
        return self._parse(self._read_object())

    def transact(self, fn: Callable[[CalibrationState], T]) -> tuple[T, CalibrationState]:
        with self._mutex:
            for _ in range(self.max_attempts):
                if self._cache is None:
                    obj = self._read_object()
                    if obj is None:  # missing: create it (409 if another writer was first)
                        state = CalibrationState(self.config)
                        result = fn(state)
                        status, created = self._request("POST", self._path(named=False), self._body(None, state))
                        if status in (200, 201):
                            self._cache = (created, state.copy())
                            return result, state
                        if status == 403:
                            raise StoreError(f"{self.describe()} is missing and this service may not create it "
                                             "(HTTP 403): the operator recreates it, or grant 'create' on configmaps")
                        self.conflicts += 1
                        if status == 404:
                            raise StoreError(f"{self.describe()}: namespace {self.namespace} not found")
                        continue
                    self._cache = (obj, self._parse(obj))
                obj, cached = self._cache
                state = cached.copy()
                result = fn(state)
                if state.version == cached.version and (obj.get("data") or {}).get(KEY):
                    return result, state
                status, written = self._request("PUT", self._path(), self._body(obj, state))
                if status in (200, 201):
                    self._cache = (written, state.copy())
                    return result, state
                # 409: our resourceVersion is stale; 404: deleted meanwhile. Re-read and re-apply.
                self.conflicts += 1
                self._cache = None
            raise StoreError(f"{self.describe()}: still conflicting after {self.max_attempts} attempts")

    def _body(self, obj: Optional[dict], state: CalibrationState) -> dict:
        if obj is None:
            metadata = {"name": self.name, "namespace": self.namespace,
                        "labels": {"app.kubernetes.io/component": "calibration"}}
            data = {}
        else:
            metadata = obj["metadata"]  # carries resourceVersion: the optimistic lock
            data = dict(obj.get("data") or {})
        data[KEY] = state.dumps()
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _core_api(kubeconfig: Optional[str]) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CoreV1Api()


def open_store(configmap: Optional[str], state_file: Optional[str], config: CalibrationConfig,
               kubeconfig: Optional[str] = None) -> FileStore | ConfigMapStore:
    """``--configmap NAMESPACE/NAME`` or ``--state-file PATH`` (exactly one) -> a store."""
    if bool(configmap) == bool(state_file):
        raise ValueError("give exactly one of --configmap NAMESPACE/NAME and --state-file PATH")
    if state_file:
        return FileStore(state_file, config)
    namespace, _, name = configmap.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"--configmap must be NAMESPACE/NAME, got {configmap!r}")
    return ConfigMapStore(namespace, name, config, kubeconfig=kubeconfig)
