"""The llm backend's prompt and parsing, with generation in-process by a transformers model (CPU).

No guided decoding here: the model is asked for the same JSON (with the trajectory's earlier
turns in the prompt when the item has them) and the answer is parsed the same way
(:mod:`wmrl_trainer.world_model.parse`); text that holds no usable prediction is ungraded,
so a small or untrained model yields ungraded rollouts, never zeros.

Sampling follows ``spec.worldModel.sampling`` except ``presencePenalty``: transformers'
``generate`` has no presence penalty (its ``repetition_penalty`` is a multiplicative
penalty of a different kind), so none is applied. ``enableThinking`` is passed to the chat
template only when set, as the llm backend sends it only when set.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

from wmrl.api.schema import FewShotExample
from wmrl.outcome import Outcome
from wmrl_trainer.policy import load_policy
from wmrl_trainer.prompts import world_model_messages, world_model_prompt
from wmrl_trainer.world_model.base import GatedWorldModel, Item, item_parts
from wmrl_trainer.world_model.parse import outcome_from_text

Generate = Callable[[list[str]], list[str]]


class TransformersWorldModel(GatedWorldModel):
    """``model``/``tokenizer``: a causal LM and its tokenizer. ``generate`` (prompts -> answer texts)
    replaces the model's sampling, e.g. to script answers in tests. ``enable_thinking``: passed to
    the chat template when not None (else the template's default)."""

    uses_history = True

    def __init__(self, model: Any = None, tokenizer: Any = None, *, temperature: float = 0.7, top_p: float = 0.8,
                 top_k: int = 20, max_new_tokens: int = 1024, predictions: int = 2, batch_size: int = 4,
                 seed: int = 0, generate: Optional[Generate] = None, enable_thinking: Optional[bool] = None,
                 few_shot: Sequence[FewShotExample] = ()):
        super().__init__()
        if generate is None and (model is None or tokenizer is None):
            raise ValueError("the transformers world model needs a model and a tokenizer (or a generate function)")
        self.model, self.tokenizer = model, tokenizer
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "max_new_tokens": max_new_tokens}
        self.predictions, self.batch_size, self.seed = predictions, batch_size, seed
        self.enable_thinking = enable_thinking
        self.few_shot = tuple(few_shot)  # spec.worldModel.fewShot: real outcomes shown in every prompt
        self._generate_fn = generate or self._sample
        self._lock = threading.Lock()  # one generation at a time on a shared model

    @classmethod
    def from_spec(cls, spec: Any, runtime: Any = None, policy_model: Optional[str] = None, **kwargs: Any) -> "TransformersWorldModel":
        name = spec.model or policy_model
        if not name:
            raise ValueError("spec.worldModel.model: the transformers backend needs a model (or the policy's)")
        model, tokenizer = load_policy(name)
        model.eval()
        s = spec.sampling
        kwargs.setdefault("enable_thinking", spec.enable_thinking)
        return cls(model, tokenizer, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                   max_new_tokens=s.max_tokens, predictions=s.predictions, **kwargs)

    def render(self, item: Item) -> str:
        """The prompt text: the chat template when the tokenizer has one, else the plain prompt."""
        task, code, history = item_parts(item)
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            extra = {} if self.enable_thinking is None else {"enable_thinking": bool(self.enable_thinking)}
            messages = world_model_messages(task, code, self.predictions, history, self.few_shot)
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
        return world_model_prompt(task, code, self.predictions, history, self.few_shot)

    def _sample(self, prompts: list[str]) -> list[str]:
        import torch

        tok = self.tokenizer
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {k: v.to(self.model.device) for k, v in batch.items()}
        torch.manual_seed(self.seed)
        self.seed += 1
        with torch.no_grad():
            out = self.model.generate(**batch, do_sample=True, pad_token_id=tok.pad_token_id, **self.sampling)
        return tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        texts: list[str] = []
        with self._lock:
            for start in range(0, len(items), self.batch_size):
                prompts = [self.render(item) for item in items[start:start + self.batch_size]]
                answers = self._generate_fn(prompts)
                if len(answers) != len(prompts):
                    raise RuntimeError(f"generate returned {len(answers)} answers for {len(prompts)} prompts")
                texts += answers
        outcomes = [outcome_from_text(t) for t in texts]
        self.count("unparsable", sum(o is None for o in outcomes))
        return outcomes
