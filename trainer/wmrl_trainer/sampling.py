"""What the policy reads and writes, and sampling from it outside TRL's training rollouts.

:func:`make_prompt` and :func:`prompt_ids` give a task's prompt as the policy sees it (chat
messages when the tokenizer has a chat template, else plain text), the same prompt the
training dataset holds; :func:`completion_text` is the text of a completion and
:func:`observation_ids` the tokens of an observation placed after a turn. The GRPO trainer
(:mod:`wmrl_trainer.grpo`) uses these for its rollouts, so training and evaluation read and
write the same way.

:func:`sample_solutions` samples scripts per task and :func:`sample_trajectories`
multi-turn trajectories, each turn graded and its observation shown to the next, with the
stop rules of training. Both run in eval mode with no gradients and fork torch's RNG
streams, so evaluating never changes what training draws. Used by
:meth:`wmrl_trainer.trainer.WMRLTrainer.evaluate`, the local runner's held-out evaluation
and the benchmarks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, Sequence

from wmrl.tasks import Task
from wmrl_trainer.distributed import World
from wmrl_trainer.loop import extract_code
from wmrl_trainer.prompts import task_prompt
from wmrl_trainer.turns import Trajectory


def completion_text(completion: Any) -> str:
    """The text of one TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    raise TypeError(f"unexpected completion type {type(completion).__name__}")


OBSERVATION_TOKENS = 512
"""What the default trajectory budget allows per observation (its output part is cut to
:data:`wmrl_trainer.observation.OUTPUT_CHARS` characters, a few hundred tokens)."""


def default_trajectory_tokens(max_turns: int, max_new_tokens: int) -> int:
    """``spec.algorithm.maxTrajectoryTokens`` when empty: every turn at full length, and its observations."""
    return max_turns * max_new_tokens + (max_turns - 1) * OBSERVATION_TOKENS


def observation_ids(tokenizer: Any, text: str, chat_template: Optional[str] = None,
                    chat_template_kwargs: Optional[dict] = None) -> list[int]:
    """The tokens of an observation: for a policy with a chat template, a user message and the
    next assistant header, exactly as the template renders them after an assistant turn that
    ended in EOS (what generation produced); else the plain text.

    The suffix starts right after the assistant turn's EOS: found as TRL finds a tool result's
    (the prefix conversation cut at its last EOS), or, for templates that render an earlier
    assistant turn differently from the last one (Qwen3 drops the empty think block once a
    user turn follows), as the EOS before the observation's own turn. A template whose turns
    do not end in EOS must at least render the conversation so far as a prefix of the longer one.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    kwargs = {"chat_template": chat_template, **(chat_template_kwargs or {})}
    before = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "script"}]
    after = before + [{"role": "user", "content": text}]
    prefix = list(tokenizer.apply_chat_template(before, tokenize=True, return_dict=False, **kwargs))
    full = list(tokenizer.apply_chat_template(after, tokenize=True, add_generation_prompt=True, return_dict=False,
                                              **kwargs))
    eos = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(prefix) if t == eos]
    full_ends = [i for i, t in enumerate(full) if t == eos]
    if ends and full[:ends[-1] + 1] == prefix[:ends[-1] + 1]:
        return full[ends[-1] + 1:]
    if len(full_ends) >= 3:  # user, assistant and observation turns each end in EOS
        return full[full_ends[-2] + 1:]
    head = tokenizer.apply_chat_template(before, tokenize=False, **kwargs)
    whole = tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True, **kwargs)
    if not ends and whole.startswith(head):
        return list(tokenizer(whole[len(head):], add_special_tokens=False)["input_ids"])
    raise ValueError("the policy's chat template renders an assistant turn differently once a user turn follows, "
                     "and its turns do not end in EOS: an observation cannot be placed after a turn "
                     "(use spec.algorithm.maxTurns: 1 with this policy)")


def make_prompt(task: Task, tokenizer: Any) -> Any:
    """The prompt of ``task`` as the policy sees it: one user message when the tokenizer has a chat
    template, else the plain text."""
    text = task_prompt(task)
    return [{"role": "user", "content": text}] if getattr(tokenizer, "chat_template", None) else text


def sample_solutions(model: Any, tokenizer: Any, tasks: Sequence[Task], sampling: Any, samples_per_task: int,
                     seed: Optional[int] = None) -> Iterator[tuple[Task, list[str]]]:
    """Yield each task with ``samples_per_task`` scripts sampled from the current policy.

    Sampling uses the run's settings and forks the torch RNG streams (seeded with ``seed``
    when given), so evaluating never changes what training draws; the model's train/eval
    mode is restored afterwards.
    """
    with sampling_mode(model, seed):
        for task in tasks:
            prompt = make_prompt(task, tokenizer)
            if isinstance(prompt, list):
                ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
            else:
                ids = tokenizer(prompt, return_tensors="pt")
            ids = {k: v.to(model.device) for k, v in ids.items()}
            out = model.generate(**ids, do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_new_tokens=sampling.max_new_tokens, num_return_sequences=samples_per_task,
                                 pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            yield task, [extract_code(completion_text(t)) for t in texts]


@contextlib.contextmanager
def sampling_mode(model: Any, seed: Optional[int]) -> Iterator[None]:
    """Eval mode, no gradients and forked torch RNG streams (seeded with ``seed`` when given), so
    sampling never changes what training draws; the model's train/eval mode is restored."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            yield
    finally:
        model.train(was_training)


def prompt_ids(task: Task, tokenizer: Any) -> list[int]:
    """The token ids of ``task``'s prompt, as generation sees them (chat template or plain text)."""
    prompt = make_prompt(task, tokenizer)
    if isinstance(prompt, list):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def _stop_ids(model: Any, tokenizer: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    eos = [tokenizer.eos_token_id] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return {int(e) for e in eos if e is not None}


def _generate_batch(model: Any, tokenizer: Any, inputs: list[list[int]], sampling: Any,
                    synced: bool = False) -> list[list[int]]:
    """One sampled continuation per input (left-padded batch, as TRL's transformers path generates),
    up to and including its first stop token, as TRL keeps completions (the padding after it dropped;
    a pad token that is also the EOS is kept where it ends the turn). ``synced``: every process
    generates in lockstep until all are done (transformers' ``synced_gpus``, which a sharded model
    needs: each forward pass gathers its parameters from every process)."""
    import torch

    width = max(len(ids) for ids in inputs)
    ids = torch.full((len(inputs), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    for row, seq in enumerate(inputs):
        ids[row, width - len(seq):] = torch.tensor(seq)
        mask[row, width - len(seq):] = 1
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=True,
                         temperature=sampling.temperature, top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id, synced_gpus=synced)
    stops = _stop_ids(model, tokenizer)
    rows = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        rows.append(row[:end] if end is not None else row)
    return rows


def sample_trajectories(model: Any, tokenizer: Any, tasks: Sequence[Task], sampling: Any, samples_per_task: int,
                        max_turns: int, grade: Callable[[list[tuple[Task, str]]], list[Any]],
                        seed: Optional[int] = None, max_tokens: Optional[int] = None) -> list[Any]:
    """Multi-turn counterpart of :func:`sample_solutions`: ``samples_per_task`` trajectories per task,
    each turn graded by ``grade`` (real outcomes, or None when ungraded) and shown to the next.

    The same stop rules as training: the top outcome, a turn cut off at ``maxNewTokens``, the
    token budget ``max_tokens`` (default as in training), ``max_turns``. Returns
    :class:`wmrl_trainer.turns.Trajectory` objects (graded as anchors: what they saw is
    ``grade``'s). Same RNG and train/eval-mode hygiene as :func:`sample_solutions`.
    """
    rows = [task for task in tasks for _ in range(samples_per_task)]
    return sample_rows(model, tokenizer, rows, sampling, max_turns, grade, seed=seed, max_tokens=max_tokens)


def sample_rows(model: Any, tokenizer: Any, rows: Sequence[Task], sampling: Any, max_turns: int,
                grade: Callable[[list[tuple[Task, str]]], list[Any]], *, seed: Optional[int] = None,
                max_tokens: Optional[int] = None, world: Optional[World] = None, synced: bool = False,
                stand_in: Optional[list[int]] = None) -> list[Any]:
    """One trajectory per entry of ``rows`` (a task), as :func:`sample_trajectories` samples them.

    With ``world`` (several processes, each sampling its own rows), every process takes the same
    number of turns, each a generation and a ``grade`` call, until no process has a running
    trajectory: ``grade`` may then be collective, and with ``synced`` so may generation (a sharded
    model). A process whose trajectories have all ended generates from ``stand_in`` (token ids) in
    their place and throws the result away.
    """
    prompts = {name: prompt_ids(task, tokenizer) for name, task in {t.name: t for t in rows}.items()}
    trajectories = [Trajectory(task, anchor=True) for task in rows]
    history: list[list[int]] = [[] for _ in rows]
    budget = max_tokens or default_trajectory_tokens(max_turns, sampling.max_new_tokens)
    stops = _stop_ids(model, tokenizer)
    lockstep = world is not None and world.size > 1
    if lockstep and stand_in is None:
        raise ValueError("sampling in lockstep needs stand_in token ids for a process with no running trajectory")
    with sampling_mode(model, seed):
        for turn in range(max_turns):
            active = [r for r, t in enumerate(trajectories) if not t.done]
            if not (world.any(bool(active)) if lockstep else active):
                break
            inputs = [prompts[rows[r].name] + history[r] for r in active] or [list(stand_in or [])]
            new = _generate_batch(model, tokenizer, inputs, sampling, synced=synced)[:len(active)]
            new = [ids[:max(0, budget - len(history[r]))] for ids, r in zip(new, active)]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            codes = [extract_code(completion_text(t)) for t in texts]
            outcomes = grade([(rows[r], code) for r, code in zip(active, codes)])
            for j, r in enumerate(active):
                trajectory = trajectories[r]
                trajectory.add_turn(codes[j], world_model=None, real=outcomes[j], anchor=True)
                if trajectory.done:
                    continue
                history[r] += new[j]
                if len(history[r]) >= budget:  # in the order the training rollout applies them
                    trajectory.end("budget")
                elif not new[j] or new[j][-1] not in stops:
                    trajectory.end("truncated")
                elif turn == max_turns - 1:
                    trajectory.end("turns")
                else:
                    observation = observation_ids(tokenizer, trajectory.turns[-1].observation)
                    if len(history[r]) + len(observation) >= budget:
                        trajectory.end("budget")
                    else:
                        history[r] += observation
    return trajectories
