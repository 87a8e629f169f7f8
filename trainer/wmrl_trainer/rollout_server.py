"""The rollout server of ``vllmMode: server`` must answer before the trainer is built.

TRL's client would wait ``vllm_server_timeout`` and then tell the user to run ``vllm serve``;
this check names what the run configured instead: ``spec.policy.vllmServerUrl``, or the
``<run>-rollout`` Deployment the operator deploys when that field is empty.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import httpx


class RolloutServerUnavailable(RuntimeError):
    pass


def rollout_server_subject(spec_url: Optional[str], run_name: str) -> tuple[str, str]:
    """(what to blame, what to do) when the server does not answer: the spec's field, or the
    operator's Deployment."""
    if spec_url:
        return "spec.policy.vllmServerUrl", "start `trl vllm-serve` there, or fix the URL"
    return (f"the rollout Deployment {run_name}-rollout (spec.policy.vllmMode server without "
            "spec.policy.vllmServerUrl: the operator deploys it)",
            f"see its Pods' status and logs (kubectl logs deployment/{run_name}-rollout)")


def wait_for_rollout_server(url: str, subject: tuple[str, str], timeout: float, interval: float = 1.0,
                            clock: Callable[[], float] = time.monotonic) -> float:
    """Poll ``GET {url}/health`` until it answers 200; seconds waited. Raises
    :class:`RolloutServerUnavailable` naming ``subject`` (:func:`rollout_server_subject`) after ``timeout`` seconds (each request
    is bounded too, so a server that accepts and never answers does not hang the trainer)."""
    start = clock()
    last = "no answer"
    while True:
        left = timeout - (clock() - start)
        try:
            response = httpx.get(f"{url.rstrip('/')}/health", timeout=max(0.5, min(5.0, left)))
            if response.status_code == 200:
                return clock() - start
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if clock() - start + interval > timeout:
            what, hint = subject
            raise RolloutServerUnavailable(
                f"{what}: no rollout server answers at {url} (GET /health: {last}; waited {timeout:.0f} s, "
                f"runtime.rolloutWaitSeconds); {hint}")
        time.sleep(interval)
