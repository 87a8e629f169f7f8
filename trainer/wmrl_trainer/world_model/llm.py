"""The paper's world model: an LLM behind an OpenAI-compatible chat-completions endpoint (vLLM).

One guided-JSON call per rollout returns the top-k outcome predictions
(:func:`wmrl_trainer.prompts.outcome_json_schema`); the prompt holds the trajectory's earlier
turns when the item has them (:func:`wmrl_trainer.world_model.base.item_history`). The
sampling parameters are the spec's (paper: temperature 0.7, top_p 0.8, top_k 20; reference
implementation: presence_penalty 1.0). The chat template's thinking switch is sent only when
``spec.worldModel.enableThinking`` is set, so by default the template's own default applies,
as in the reference implementation. Rollouts of a batch are sent concurrently
from a thread pool. A timeout, connection error, HTTP 429 or 5xx is retried with backoff;
when the retries run out, or the answer is not usable JSON, the rollout is ungraded (None).

Guided decoding is chosen once per client, against the server, before the first rollout is
sent (:meth:`LLMWorldModel.probe`): a tiny request whose schema admits one answer only (an
enum the prompt never names), first with OpenAI's ``response_format`` (json_schema), then with
vLLM's ``structured_outputs`` extra-body field. The first mode whose answer is exactly that
JSON is used for every grading request; an HTTP 400 (or 422) or any other answer moves the
probe on. A server that constrains under neither is an error (:class:`UnconstrainedServerError`),
never a silent switch to unconstrained output: vLLM drops the old ``guided_json`` field with
only a warning, so it is not tried. A server that gives no answer to judge by (unreachable,
timeouts or 5xx past the retries, another HTTP error, a body that is not a chat completion)
leaves the batch ungraded (``probe_failed``) and is probed again with the next batch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import httpx

from wmrl.api.schema import FewShotExample
from wmrl.outcome import Outcome
from wmrl_trainer.prompts import outcome_json_schema, world_model_messages
from wmrl_trainer.world_model.base import GatedWorldModel, Item, item_parts
from wmrl_trainer.world_model.parse import outcome_from_text

log = logging.getLogger(__name__)

GUIDED_MODES = ("response_format", "structured_outputs")
"""Constrained-output request forms, in the order the probe tries them."""
PROBE_VALUE = "wmrl-structured-output-probe"
PROBE_SCHEMA = {"type": "object", "properties": {"probe": {"type": "string", "enum": [PROBE_VALUE]}},
                "required": ["probe"], "additionalProperties": False}
"""The probe's schema: exactly one answer validates, ``{"probe": PROBE_VALUE}``."""
PROBE_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "Say hello."}]
PROBE_MAX_TOKENS = 64
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class UnconstrainedServerError(RuntimeError):
    """The world model server answered, but constrained its output under none of the guided modes."""


class LLMWorldModel(GatedWorldModel):
    """Grades rollouts with an OpenAI-compatible server at ``base_url`` (ending in ``/v1``).

    ``enable_thinking``: None sends no ``chat_template_kwargs`` (the template's default);
    True/False sends ``{"enable_thinking": value}`` (Qwen3-style templates; others ignore it).
    """

    uses_history = True

    def __init__(self, base_url: str, model: Optional[str] = None, *, temperature: float = 0.7, top_p: float = 0.8,
                 top_k: int = 20, max_tokens: int = 1024, predictions: int = 2, presence_penalty: float = 1.0,
                 timeout: float = 60.0, retries: int = 2, backoff: float = 0.5, concurrency: int = 16,
                 guided: str = "auto", enable_thinking: Optional[bool] = None,
                 api_key: Optional[str] = None, few_shot: Sequence[FewShotExample] = ()):
        super().__init__()
        if not base_url:
            raise ValueError("spec.worldModel.endpoint: the llm backend needs an OpenAI-compatible base URL")
        if guided != "auto" and guided not in GUIDED_MODES:
            raise ValueError(f"guided must be 'auto' or one of {GUIDED_MODES}, got {guided!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "max_tokens": max_tokens,
                         "presence_penalty": presence_penalty}
        self.predictions = predictions
        self.schema = outcome_json_schema(predictions)
        self.retries, self.backoff = retries, backoff
        self.candidates = GUIDED_MODES if guided == "auto" else (guided,)
        self.guided: Optional[str] = None  # set by probe(): the mode every grading request uses
        self.probe_answers: dict[str, str] = {}  # mode -> what the probe got back (for the error message)
        self._probe_lock = threading.Lock()
        self.enable_thinking = enable_thinking
        self.few_shot = tuple(few_shot)  # spec.worldModel.fewShot: real outcomes shown in every prompt
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers,
                                    limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency))
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="wm-llm")
        self._model_lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: Any, runtime: Any = None, policy_model: Optional[str] = None, **kwargs: Any) -> "LLMWorldModel":
        base_url = spec.endpoint or getattr(runtime, "world_model_url", None)
        if not base_url:
            raise ValueError("spec.worldModel.endpoint: empty, and runtime.worldModelUrl is not set either")
        s = spec.sampling
        kwargs.setdefault("enable_thinking", spec.enable_thinking)
        return cls(base_url, spec.model or policy_model, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                   max_tokens=s.max_tokens, predictions=s.predictions, presence_penalty=s.presence_penalty,
                   timeout=spec.timeout_seconds, **kwargs)

    # -------------------------------------------------------------- requests

    def _model_name(self) -> str:
        """The configured model, else the first model the server lists (vLLM serves one)."""
        with self._model_lock:
            if self.model is None:
                response = self._client.get(f"{self.base_url}/models")
                response.raise_for_status()
                self.model = response.json()["data"][0]["id"]
            return self.model

    def request_body(self, messages: list[dict], guided: Optional[str] = None,
                     schema: Optional[dict] = None) -> dict[str, Any]:
        """The chat-completions request for one rollout (public so tests and docs can show it).

        ``guided``: the mode (default: the probed one); ``schema``: default the outcome schema."""
        body: dict[str, Any] = {"model": self._model_name(), "messages": messages, "n": 1, **self.sampling}
        mode = guided or self.guided
        schema = self.schema if schema is None else schema
        if mode == "response_format":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "outcome_predictions", "schema": schema, "strict": True}}
        elif mode == "structured_outputs":
            body["structured_outputs"] = {"json": schema}
        else:
            raise RuntimeError("no guided mode chosen yet: call probe() first")
        if self.enable_thinking is not None:  # Qwen3-style templates (ignored by others); None: the template's default
            body["chat_template_kwargs"] = {"enable_thinking": bool(self.enable_thinking)}
        return body

    def _complete(self, messages: list[dict]) -> Optional[str]:
        """The answer text, or None once retries are exhausted or the server refuses the request."""
        url = f"{self.base_url}/chat/completions"
        attempt = 0
        while True:
            try:
                response = self._client.post(url, json=self.request_body(messages))
                if response.status_code == 200:
                    return response.json()["choices"][0]["message"]["content"] or ""
                if response.status_code not in _RETRY_STATUS:
                    self.count("http_error")
                    log.warning("world model answered HTTP %s: %s", response.status_code, response.text[:300])
                    return None
                reason = f"HTTP {response.status_code}"
            except (httpx.TimeoutException, httpx.TransportError, httpx.HTTPStatusError) as exc:
                reason = type(exc).__name__
            except (KeyError, IndexError, TypeError, ValueError) as exc:  # 200 with a body that is not chat-completions
                self.count("bad_response")
                log.warning("world model response is not a chat completion: %s", exc)
                return None
            attempt += 1
            self.count("retries")
            if attempt > self.retries:
                self.count("failed")
                log.warning("world model request failed after %d attempts (%s): ungraded", attempt, reason)
                return None
            time.sleep(self.backoff * 2 ** (attempt - 1))

    def _one(self, item: Item) -> Optional[Outcome]:
        task, code, history = item_parts(item)
        text = self._complete(world_model_messages(task, code, self.predictions, history, self.few_shot))
        if text is None:
            return None
        outcome = outcome_from_text(text)
        if outcome is None:
            self.count("unparsable")
        return outcome

    def _probe_mode(self, mode: str) -> Optional[bool]:
        """True: the server constrained the probe under ``mode``; False: it refused the mode (HTTP 400
        or 422) or answered something else; None: no answer to judge by (unreachable, timeouts or 5xx
        past the retries, another HTTP error, a body that is not a chat completion)."""
        body = self.request_body(PROBE_MESSAGES, mode, PROBE_SCHEMA)
        body["max_tokens"] = PROBE_MAX_TOKENS
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._client.post(f"{self.base_url}/chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                self.probe_answers[mode] = type(exc).__name__
                continue
            if response.status_code != 200:
                self.probe_answers[mode] = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code in _RETRY_STATUS:
                    continue
                return False if response.status_code in (400, 422) else None
            try:
                text = response.json()["choices"][0]["message"]["content"] or ""
            except (KeyError, IndexError, TypeError, ValueError):
                self.probe_answers[mode] = f"not a chat completion: {response.text[:200]}"
                return None
            self.probe_answers[mode] = text[:200]
            try:
                return json.loads(text) == {"probe": PROBE_VALUE}
            except ValueError:
                return False
        return None

    def probe(self) -> Optional[str]:
        """Choose the guided mode once (see the module docstring); the mode, or None when the server
        could not be reached (asked again next time). Raises :class:`UnconstrainedServerError` when
        the server answered under every candidate mode and constrained none of them."""
        with self._probe_lock:
            if self.guided is not None:
                return self.guided
            try:
                self._model_name()
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                log.warning("world model at %s: cannot list its models (%s)", self.base_url, exc)
                return None
            for mode in self.candidates:
                result = self._probe_mode(mode)
                if result is None:  # not an answer: ask again later rather than settle for a later mode
                    log.warning("world model at %s could not be probed with %s (%s)", self.base_url, mode,
                                self.probe_answers[mode])
                    return None
                if result:
                    self.guided = mode
                    log.info("world model at %s constrains its output with %s", self.base_url, mode)
                    return mode
            tried = "; ".join(f"{m}: {a!r}" for m, a in self.probe_answers.items())
            raise UnconstrainedServerError(
                f"the world model server at {self.base_url} (spec.worldModel.endpoint, or the operator's vLLM "
                f"Deployment) does not constrain its output to a JSON schema under any of {list(self.candidates)} "
                f"(answers to a one-answer schema: {tried}). Serve the world model with vLLM and structured outputs "
                "(the operator renders --structured-outputs-config for its Deployment), or point "
                "spec.worldModel.endpoint at a server that supports response_format json_schema.")

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        if self.probe() is None:
            self.count("probe_failed", len(items))
            return [None] * len(items)
        return list(self._pool.map(self._one, items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
