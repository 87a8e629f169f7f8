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

Guided decoding: OpenAI's ``response_format`` (json_schema) by default, which vLLM
implements; if the server rejects it with HTTP 400, the client falls back to vLLM's own
``structured_outputs`` extra-body field and then to the older ``guided_json`` one, and
remembers what worked.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import httpx

from wmrl.outcome import Outcome
from wmrl_trainer.prompts import outcome_json_schema, world_model_messages
from wmrl_trainer.world_model.base import GatedWorldModel, Item, item_parts
from wmrl_trainer.world_model.parse import outcome_from_text

log = logging.getLogger(__name__)

GUIDED_MODES = ("response_format", "structured_outputs", "guided_json")
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class LLMWorldModel(GatedWorldModel):
    """Grades rollouts with an OpenAI-compatible server at ``base_url`` (ending in ``/v1``).

    ``enable_thinking``: None sends no ``chat_template_kwargs`` (the template's default);
    True/False sends ``{"enable_thinking": value}`` (Qwen3-style templates; others ignore it).
    """

    uses_history = True

    def __init__(self, base_url: str, model: Optional[str] = None, *, temperature: float = 0.7, top_p: float = 0.8,
                 top_k: int = 20, max_tokens: int = 1024, predictions: int = 2, presence_penalty: float = 1.0,
                 timeout: float = 60.0, retries: int = 2, backoff: float = 0.5, concurrency: int = 16,
                 guided: str = "response_format", enable_thinking: Optional[bool] = None,
                 api_key: Optional[str] = None):
        super().__init__()
        if not base_url:
            raise ValueError("spec.worldModel.endpoint: the llm backend needs an OpenAI-compatible base URL")
        if guided not in GUIDED_MODES:
            raise ValueError(f"guided must be one of {GUIDED_MODES}, got {guided!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "max_tokens": max_tokens,
                         "presence_penalty": presence_penalty}
        self.predictions = predictions
        self.schema = outcome_json_schema(predictions)
        self.retries, self.backoff = retries, backoff
        self.guided = guided
        self.enable_thinking = enable_thinking
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

    def request_body(self, messages: list[dict], guided: Optional[str] = None) -> dict[str, Any]:
        """The chat-completions request for one rollout (public so tests and docs can show it)."""
        body: dict[str, Any] = {"model": self._model_name(), "messages": messages, "n": 1, **self.sampling}
        mode = guided or self.guided
        if mode == "response_format":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "outcome_predictions", "schema": self.schema, "strict": True}}
        elif mode == "structured_outputs":
            body["structured_outputs"] = {"json": self.schema}
        else:
            body["guided_json"] = self.schema
        if self.enable_thinking is not None:  # Qwen3-style templates (ignored by others); None: the template's default
            body["chat_template_kwargs"] = {"enable_thinking": bool(self.enable_thinking)}
        return body

    def _complete(self, messages: list[dict]) -> Optional[str]:
        """The answer text, or None once retries are exhausted or the server refuses the request."""
        url = f"{self.base_url}/chat/completions"
        attempt = 0
        while True:
            mode = self.guided
            try:
                response = self._client.post(url, json=self.request_body(messages, mode))
                if response.status_code == 200:
                    return response.json()["choices"][0]["message"]["content"] or ""
                if response.status_code == 400 and mode != GUIDED_MODES[-1]:
                    following = GUIDED_MODES[GUIDED_MODES.index(mode) + 1]
                    log.warning("world model rejected %s guided decoding (%s); trying %s",
                                mode, response.text[:200], following)
                    self.guided = following
                    continue
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
        text = self._complete(world_model_messages(task, code, self.predictions, history))
        if text is None:
            return None
        outcome = outcome_from_text(text)
        if outcome is None:
            self.count("unparsable")
        return outcome

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        return list(self._pool.map(self._one, items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
