"""World models: grade a rollout without running it (see ``docs/world-model.md``).

Backends share one interface (:class:`WorldModel`) and the compile gate. ``grade`` takes
``(task, code)`` items, or ``(task, code, history)`` for a turn of a multi-turn trajectory
(:func:`item_history`); the prompted backends show the history to the model, the learned
one ignores it.

* ``llm`` (the paper's): an OpenAI-compatible endpoint (vLLM), guided JSON, top-k predictions;
* ``transformers``: the same prompt and parsing, generated in-process (CPU);
* ``learned``: a biased static judge, frozen or (``learnOnline``) corrected online from anchor outcomes.

No backend loads torch on import: the transformers backend loads its model when it is built.
"""

from __future__ import annotations

from typing import Any, Optional

from wmrl_trainer.few_shot import examples_of
from wmrl_trainer.world_model.base import GatedWorldModel, Item, WorldModel, compile_gate, item_history, item_parts
from wmrl_trainer.world_model.learned import LearnedWorldModel
from wmrl_trainer.world_model.llm import LLMWorldModel
from wmrl_trainer.world_model.transformers_backend import TransformersWorldModel

__all__ = ["WorldModel", "GatedWorldModel", "Item", "compile_gate", "item_history", "item_parts", "build_world_model"]


def build_world_model(spec: Any, runtime: Any = None, policy_model: Optional[str] = None, seed: int = 0,
                      **kwargs: Any) -> GatedWorldModel:
    """The backend named by ``spec.backend`` (a :class:`wmrl.api.schema.WorldModelSpec`).

    ``policy_model`` stands in for an empty ``spec.model`` (the paper uses the policy's base
    model); ``kwargs`` go to the backend's constructor. The prompted backends get the examples of
    ``spec.fewShot`` (:func:`wmrl_trainer.few_shot.examples_of`; a bad file is a ValueError naming it).
    """
    if spec.backend in ("llm", "transformers"):
        kwargs.setdefault("few_shot", examples_of(getattr(spec, "few_shot", None)))
    if spec.backend == "llm":
        return LLMWorldModel.from_spec(spec, runtime, policy_model, **kwargs)
    if spec.backend == "transformers":
        return TransformersWorldModel.from_spec(spec, runtime, policy_model, seed=seed, **kwargs)
    if spec.backend == "learned":
        kwargs.setdefault("learn_online", spec.learn_online)
        kwargs.setdefault("optimism", spec.optimism)
        return LearnedWorldModel(seed=seed, **kwargs)
    raise ValueError(f"spec.worldModel.backend: unknown backend {spec.backend!r}")
