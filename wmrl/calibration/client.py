"""What a trainer uses: :class:`CalibrationClient` (a shared service) or :class:`LocalCalibration`.

Both offer the same interface:

* ``observe(groups)``: anchor groups ``[{"task": str, "wm": [...], "env": [...]}]``; pairs in
  which either reward is ``None`` or NaN (ungraded) are dropped, a group left empty is
  dropped; anything else invalid raises ``ValueError`` here, in the caller's thread.
  Non-blocking for the client (batched in a background thread).
* ``calibrate(values) -> np.ndarray``: the current map (identity until fitted; NaN passes).
* ``weight``: the current anchor weight; ``view()``: a dict like ``GET /v1/calibration``.
* ``stale_seconds``: seconds since the map was last confirmed by the service (0 locally,
  ``None`` before the first contact).
* ``flush(timeout)``: wait until every observed group is acknowledged; ``close()``.

The client sends one batch at a time and retries it, with the same batch id and
exponential backoff, until the service acknowledges it (the service then counts it
exactly once); groups observed meanwhile wait for the next batch (at most
``max_pending_groups``; beyond that the oldest are dropped and counted in
``dropped_groups``). Training never waits on the service: the last view received
is kept and used.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from typing import Any, Optional

import numpy as np

from wmrl.calibration import TOKEN_ENV
from wmrl.calibration.state import CalibrationConfig, CalibrationState, validate_groups
from wmrl.debias import CalibrationMap, apply_map

__all__ = ["CalibrationClient", "LocalCalibration", "prepare_groups"]

log = logging.getLogger("wmrl.calibration.client")


def _graded(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _numbers(values: Any, name: str) -> list[Optional[float]]:
    """Python floats (``None`` kept: ungraded) from a list or array; ``ValueError`` on anything else."""
    out = []
    for j, v in enumerate(np.asarray(values, dtype=object).reshape(-1).tolist()):
        if v is None:
            out.append(None)
        elif isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"observe: {name}[{j}] must be a number, got {type(v).__name__}")
        else:
            out.append(float(v))
    return out


def prepare_groups(groups: Any) -> list[dict]:
    """Validated wire-form groups, ungraded pairs dropped (``ValueError`` on anything else)."""
    if not isinstance(groups, (list, tuple)):
        raise ValueError("groups must be a list of {'task', 'wm', 'env'} objects")
    out = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or "wm" not in group or "env" not in group:
            raise ValueError(f"groups[{i}] must be an object with 'wm' and 'env'")
        wm, env = (_numbers(group[side], f"groups[{i}].{side}") for side in ("wm", "env"))
        if len(wm) != len(env):
            raise ValueError(f"groups[{i}]: wm and env lengths differ ({len(wm)} != {len(env)})")
        kept = [(w, e) for w, e in zip(wm, env) if _graded(w) and _graded(e)]
        if not kept:
            continue
        item = {"wm": [w for w, _ in kept], "env": [e for _, e in kept]}
        if group.get("task") is not None:
            item["task"] = str(group["task"])
        out.append(item)
    if out:
        try:
            validate_groups(out)
        except ValueError as exc:
            raise ValueError(f"observe: {exc}") from None
    return out


def _identity_view() -> dict:
    return CalibrationState().view()


class LocalCalibration:
    """The same interface, backed by an in-process :class:`CalibrationState` (no service)."""

    def __init__(self, config: CalibrationConfig = CalibrationConfig(), trainer_id: str = "local"):
        self.state = CalibrationState(config)
        self.trainer_id = trainer_id
        self._batches = 0
        self._lock = threading.Lock()

    def observe(self, groups: Any) -> None:
        prepared = prepare_groups(groups)
        if prepared:
            with self._lock:
                self._batches += 1
                self.state.observe(self.trainer_id, str(self._batches), prepared)

    def calibrate(self, values: Any) -> np.ndarray:
        with self._lock:
            return self.state.calibrate(values)

    @property
    def weight(self) -> float:
        return self.state.weight

    def view(self) -> dict:
        with self._lock:
            return self.state.view()

    @property
    def stale_seconds(self) -> float:
        return 0.0

    def flush(self, timeout: Optional[float] = None) -> bool:
        return True

    def close(self) -> None:
        pass


class CalibrationClient:
    def __init__(self, url: str, trainer_id: str, *, batch_groups: int = 256, flush_interval: float = 0.25,
                 refresh_interval: float = 2.0, timeout: float = 10.0, backoff_initial: float = 0.05,
                 backoff_max: float = 5.0, max_pending_groups: int = 100_000, token: Optional[str] = None):
        """``token``: the calibration's token (default ``$WMRL_CALIBRATION_TOKEN``), sent with observations."""
        import httpx


        if not trainer_id:
            raise ValueError("trainer_id must be a non-empty string")
        self.url = url.rstrip("/")
        self.trainer_id = trainer_id
        self.batch_groups, self.flush_interval, self.refresh_interval = batch_groups, flush_interval, refresh_interval
        self.backoff_initial, self.backoff_max = backoff_initial, backoff_max
        self.max_pending_groups = max_pending_groups
        self.dropped_groups = 0
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._http = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {token}"} if token else None)
        self._session = secrets.token_hex(4)  # a restarted trainer sends new data under new ids
        self._seq = 0
        self._queue: list[dict] = []
        self._queued_at: Optional[float] = None
        self._inflight: Optional[tuple[str, list[dict]]] = None
        self._view = _identity_view()
        self._map: Optional[CalibrationMap] = None
        self._contact: Optional[float] = None
        self.last_error: Optional[str] = None
        self.acknowledged_batches = 0
        self.dropped_batches = 0
        self._cond = threading.Condition()
        self._flush_requested = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"calibration-client-{trainer_id}", daemon=True)
        self._thread.start()

    # ---- the trainer's side
    def observe(self, groups: Any) -> None:
        prepared = prepare_groups(groups)
        if not prepared:
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("CalibrationClient is closed")
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue.extend(prepared)
            overflow = len(self._queue) - self.max_pending_groups
            if overflow > 0:  # the service has been away for long: keep the newest groups
                del self._queue[:overflow]
                self.dropped_groups += overflow
                log.warning("calibration service unreachable: dropped %d oldest queued groups", overflow)
            self._cond.notify_all()

    def calibrate(self, values: Any) -> np.ndarray:
        with self._cond:
            current = self._map
        return apply_map(current, values)

    @property
    def weight(self) -> float:
        with self._cond:
            return float(self._view["weight"])

    def view(self) -> dict:
        with self._cond:
            return dict(self._view)

    @property
    def stale_seconds(self) -> Optional[float]:
        with self._cond:
            return None if self._contact is None else time.monotonic() - self._contact

    @property
    def pending_groups(self) -> int:
        with self._cond:
            return len(self._queue) + (len(self._inflight[1]) if self._inflight else 0)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Block until every observed group is acknowledged (``False`` on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            while self._queue or self._inflight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._flush_requested = False
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (for up to ``timeout`` seconds), then stop; what is left is abandoned."""
        flushed = self.flush(timeout)
        if not flushed:
            log.warning("closing with %d groups not acknowledged", self.pending_groups)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=max(1.0, timeout))
        self._http.close()

    # ---- the background thread
    def _next_batch(self) -> Optional[tuple[str, list[dict]]]:
        """Under the lock: the in-flight batch, or a new one when one is due."""
        if self._inflight is not None:
            return self._inflight
        if not self._queue:
            return None
        due = (len(self._queue) >= self.batch_groups or self._flush_requested
               or time.monotonic() - (self._queued_at or 0.0) >= self.flush_interval)
        if not due:
            return None
        groups, self._queue = self._queue[: self.batch_groups], self._queue[self.batch_groups:]
        self._queued_at = time.monotonic() if self._queue else None
        self._seq += 1
        self._inflight = (f"{self._session}-{self._seq}", groups)
        return self._inflight

    def _run(self) -> None:
        backoff = self.backoff_initial
        while True:
            with self._cond:
                if self._closing:  # close() has already flushed for as long as it was allowed to
                    return
                batch = self._next_batch()
                refresh = (self._contact is None or time.monotonic() - self._contact >= self.refresh_interval)
                if batch is None and not refresh:
                    wait = self.flush_interval if self._queue else self.refresh_interval
                    self._cond.wait(wait)
                    continue
            ok = self._send(batch) if batch is not None else self._refresh()
            if ok:
                backoff = self.backoff_initial
                continue
            with self._cond:
                if self._closing:
                    return
                self._cond.wait(backoff)  # woken early only by observe/flush/close; retry then is fine
            backoff = min(self.backoff_max, backoff * 2)

    def _accept(self, view: dict) -> None:
        view = {k: v for k, v in view.items() if k != "applied"}
        with self._cond:
            self._view = view
            self._map = CalibrationMap.from_json(view.get("map"))
            self._contact = time.monotonic()
            self.last_error = None

    def _send(self, batch: tuple[str, list[dict]]) -> bool:
        batch_id, groups = batch
        try:
            response = self._http.post(f"{self.url}/v1/observations",
                                       json={"trainer": self.trainer_id, "batch": batch_id, "groups": groups})
        except Exception as exc:  # connection refused, timeout: the service is away, retry
            self.last_error = f"POST /v1/observations: {exc}"
            return False
        if response.status_code == 200:
            self._accept(response.json())
            with self._cond:
                self._inflight = None
                self.acknowledged_batches += 1
                self._cond.notify_all()
            return True
        message = _error_text(response)
        self.last_error = f"POST /v1/observations: HTTP {response.status_code}: {message}"
        if 400 <= response.status_code < 500 and response.status_code not in (401, 403, 408, 429):
            # cannot succeed by retrying (validated locally, so this is a version mismatch): drop it.
            # A refused token (401/403) is kept and retried: the data is good, the configuration is not.
            log.error("calibration service rejected batch %s: %s", batch_id, message)
            with self._cond:
                self._inflight = None
                self.dropped_batches += 1
                self._cond.notify_all()
            return True
        return False

    def _refresh(self) -> bool:
        try:
            response = self._http.get(f"{self.url}/v1/calibration")
        except Exception as exc:
            self.last_error = f"GET /v1/calibration: {exc}"
            return False
        if response.status_code != 200:
            self.last_error = f"GET /v1/calibration: HTTP {response.status_code}: {_error_text(response)}"
            return False
        self._accept(response.json())
        return True


def _error_text(response: Any) -> str:
    try:
        return str(response.json().get("error", response.text))
    except Exception:
        return response.text[:200]
