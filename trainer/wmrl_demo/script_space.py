"""The exact distribution of scripts a policy samples for one prompt (for benchmarks: no sampling noise).

Held-out evaluation samples scripts (:func:`wmrl_trainer.sampling.sample_solutions`:
``model.generate(do_sample=True, temperature, top_p, max_new_tokens)`` on the task's
prompt, decoded with ``skip_special_tokens=True``, then ``completion_text`` and
``extract_code``). For a policy whose script space is small -- ``builtin:tiny-coder``'s
grammar allows exactly ``load [preprocess] solve``, 3 x (1 + 4) x 24 = 360 scripts per
prompt -- the expectation of any score over those samples can be computed exactly instead:
:func:`script_distribution` enumerates every completion the sampler can produce, breadth
first over token prefixes (one batched forward pass per depth), with its probability under
the very transform ``generate`` applies to the logits, and :func:`expected_reward` takes the
expectation of a reward over it.

The transform is transformers' own: the generation config is resolved as ``generate``
resolves it (the call's arguments over ``model.generation_config`` over transformers'
global defaults, so e.g. the default ``top_k=50`` applies when nothing sets it) and the
logits processors are the ones ``generate`` builds from it (temperature, top-k, top-p with
its ``min_tokens_to_keep`` and tie handling, and any other warper the config asks for),
applied to float32 logits as in its sampling loop. A branch ends at a stop token of the
generation config (EOS, or any solve chunk for the tiny coder) or at ``max_new_tokens``;
tokens whose processed probability is exactly 0 are never sampled and are dropped.

This is exact enumeration, so it is only for policies whose completions form a small tree;
``max_sequences`` bounds the work (a large LM at temperature 1 would exceed it at once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

from wmrl_trainer.loop import extract_code
from wmrl_trainer.sampling import completion_text

Distribution = list[tuple[str, float]]

PromptLike = Union[str, Sequence[int], Sequence[dict], Any]


def _prompt_ids(tokenizer: Any, prompt: PromptLike) -> list[int]:
    """Token ids of ``prompt`` exactly as ``sample_solutions`` builds them (text, chat messages or ids)."""
    import torch

    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if isinstance(prompt, torch.Tensor):
        ids = prompt.tolist()
        if ids and isinstance(ids[0], list):
            if len(ids) != 1:
                raise ValueError(f"one prompt at a time, got a batch of {len(ids)}")
            ids = ids[0]
        return [int(i) for i in ids]
    prompt = list(prompt)
    if prompt and isinstance(prompt[0], dict):  # chat messages (make_prompt for a tokenizer with a chat template)
        enc = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        return enc["input_ids"][0].tolist()
    return [int(i) for i in prompt]


def _explicit_processors(model: Any, temperature: float, top_p: float) -> tuple[Any, list[int]]:
    """Fallback when transformers' private helpers move: temperature, top-k, top-p from the resolved config."""
    from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    base = getattr(model, "generation_config", None) or GenerationConfig()
    top_k = base.top_k if base.top_k is not None else GenerationConfig._get_default_generation_params().get("top_k", 50)
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k:
        processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    eos = base.eos_token_id
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return processors, eos_ids


def sampling_processors(model: Any, tokenizer: Any, prompt_ids: list[int], *, temperature: float, top_p: float,
                        max_new_tokens: int) -> tuple[Any, list[int]]:
    """(logits processors, stop token ids) that ``model.generate`` uses for the sampling call of ``sample_solutions``.

    Resolved with transformers' own helpers (``_prepare_generation_config``,
    ``_prepare_special_tokens``, ``_get_logits_processor``) from the same arguments, so
    whatever ``generate`` applies -- including defaults such as ``top_k=50`` and any
    processor the model's generation config adds -- is applied here.
    """
    import torch

    kwargs = dict(do_sample=True, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                  pad_token_id=tokenizer.pad_token_id)
    device = model.device
    try:
        own = model.generation_config
        config, model_kwargs = model._prepare_generation_config(None, **kwargs)
        model._prepare_special_tokens(config, True, device=device)
        inputs = torch.tensor([prompt_ids], device=device)
        config = model._prepare_generated_length(  # max/min length as generate sets them (ForcedEOS, MinLength read them)
            generation_config=config, has_default_max_length=own.max_length is None,
            has_default_min_length=own.min_length is None, model_input_name="input_ids",
            input_ids_length=inputs.shape[1], inputs_tensor=inputs,
        )
        model_kwargs = dict(model_kwargs, attention_mask=torch.ones_like(inputs))
        processors = model._get_logits_processor(
            generation_config=config, input_ids_seq_length=inputs.shape[1], encoder_input_ids=inputs,
            prefix_allowed_tokens_fn=None, logits_processor=None, device=device, model_kwargs=model_kwargs,
        )
    except (AttributeError, TypeError):  # pragma: no cover - a transformers release without these private helpers
        return _explicit_processors(model, temperature, top_p)
    eos = config._eos_token_tensor
    eos_ids = [] if eos is None else [int(e) for e in eos.reshape(-1).tolist()]
    return processors, eos_ids


def script_distribution(model: Any, tokenizer: Any, prompt_text_or_ids: PromptLike, *, temperature: float,
                        top_p: float, max_new_tokens: int, max_sequences: int = 100_000,
                        batch_rows: int = 512) -> Distribution:
    """Every script the policy can sample for one prompt, with its exact probability, most likely first.

    ``prompt_text_or_ids``: the prompt text (``make_prompt``'s string, tokenized like
    ``sample_solutions`` does), chat messages, or token ids. The sampling settings are those
    of ``spec.policy.sampling``. Each script is ``extract_code(completion_text(decoded))`` of
    its tokens, decoded with ``skip_special_tokens=True``; completions that yield the same
    script are merged (probabilities summed). Probabilities sum to 1 (up to float rounding).

    The model's train/eval mode is restored and no random number is drawn. Raises
    ``ValueError`` if the tree of completions grows past ``max_sequences`` nodes at a depth.
    """
    import torch

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt_ids = _prompt_ids(tokenizer, prompt_text_or_ids)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            processors, eos_ids = sampling_processors(model, tokenizer, prompt_ids, temperature=temperature,
                                                      top_p=top_p, max_new_tokens=max_new_tokens)
            stop = set(eos_ids)
            leaves: list[tuple[tuple[int, ...], float]] = []
            frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
            for depth in range(max_new_tokens):
                children: list[tuple[tuple[int, ...], float]] = []
                for start in range(0, len(frontier), batch_rows):
                    part = frontier[start:start + batch_rows]
                    ids = torch.tensor([prompt_ids + list(prefix) for prefix, _ in part], device=model.device)
                    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]
                    scores = processors(ids, logits.to(dtype=torch.float32))
                    probs = torch.softmax(scores, dim=-1).to(torch.float64).cpu()  # as generate, then exact in float64
                    probs = probs / probs.sum(dim=-1, keepdim=True)  # multinomial draws proportionally to these weights
                    for (prefix, mass), row in zip(part, probs):
                        for token in torch.nonzero(row > 0).reshape(-1).tolist():
                            children.append((prefix + (token,), mass * float(row[token])))
                last = depth + 1 == max_new_tokens
                frontier = []
                for node in children:
                    (leaves if last or node[0][-1] in stop else frontier).append(node)
                if len(frontier) + len(leaves) > max_sequences:
                    raise ValueError(f"more than {max_sequences} completions by depth {depth + 1}: "
                                     "this policy's script space is too large to enumerate")
                if not frontier:
                    break
    finally:
        model.train(was_training)

    merged: dict[str, float] = {}
    texts = tokenizer.batch_decode([list(tokens) for tokens, _ in leaves], skip_special_tokens=True)
    for text, (_, mass) in zip(texts, leaves):
        script = extract_code(completion_text(text))
        merged[script] = merged.get(script, 0.0) + mass
    return sorted(merged.items(), key=lambda item: (-item[1], item[0]))


def expected_reward(distribution: Distribution,
                    reward_of: Callable[[str], Optional[float]]) -> tuple[Optional[float], float]:
    """(expected reward over the graded scripts, graded probability mass) of a script distribution.

    ``reward_of`` returns a script's reward, or ``None`` (or NaN) when it has none; the
    expectation is renormalised over the graded mass, and is ``None`` when nothing is graded.
    """
    graded = 0.0
    total = 0.0
    for script, mass in distribution:
        if mass <= 0.0:
            continue
        reward = reward_of(script)
        if reward is None or math.isnan(float(reward)):
            continue
        graded += mass
        total += mass * float(reward)
    return (total / graded if graded > 0.0 else None), graded
