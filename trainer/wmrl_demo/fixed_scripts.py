"""``builtin:fixed-scripts``: a smoke-run policy that samples whole scripts from a directory.

For trying a task collection end to end (tasks load, sandboxes run the scripts against the
collection's data, its own grader scores them, held-out evaluation reports) on a CPU, before a
real model is trained on it, and where the demo policy (``builtin:tiny-coder``, whose scripts
read ``id,f0..,target`` CSVs with numpy) cannot write a valid solution. It is NOT a coding model:
every rollout is one of the scripts in ``spec.policy.scripts`` (``*.py``, in name order), written
by a person for the collection at hand.

It is the tiny coder's network (:mod:`wmrl_demo.tiny_coder_model`) with a one-slot grammar,
``prompt -> script -> EOS``: each script is one token of the vocabulary and a stop token, so a
completion is exactly one whole script. The prompt is reduced to the tiny coder's keywords
(:func:`wmrl_demo.demo_policy.build_tokenizer`). The scripts' token embeddings start at zero,
so the first rollouts draw every script with the same probability; GRPO then trains which
script to prefer as it would any policy (a bandit over the scripts, conditioned on the
keywords). Built in memory on load, in well under a second: nothing is cached.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from wmrl_demo import solutions

NAME = "fixed-scripts"
ROLES: tuple[str, ...] = ("prompt", "script", "eos")
NEXT_ROLES: dict[str, tuple[str, ...]] = {"prompt": ("script",), "script": ("eos",), "eos": ("eos",)}
MAX_SCRIPTS = 256


def read_scripts(directory: str | Path) -> list[tuple[str, str]]:
    """(file name, source) of every ``*.py`` in ``directory``, in name order; ValueError naming the field."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"spec.policy.scripts: {directory} is not a directory")
    scripts = []
    for path in sorted(folder.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"spec.policy.scripts: cannot read {path}: {exc}") from exc
        if not source.strip():
            raise ValueError(f"spec.policy.scripts: {path} is empty")
        scripts.append((path.name, source if source.endswith("\n") else source + "\n"))
    if not scripts:
        raise ValueError(f"spec.policy.scripts: no *.py scripts in {directory}")
    if len(scripts) > MAX_SCRIPTS:
        raise ValueError(f"spec.policy.scripts: {len(scripts)} scripts in {directory}; at most {MAX_SCRIPTS}")
    sources = [s for _, s in scripts]
    twins = sorted(name for name, s in scripts if sources.count(s) > 1)
    if twins:
        raise ValueError(f"spec.policy.scripts: {twins} in {directory} are the same script")
    return scripts


def space(scripts: list[tuple[str, str]]) -> Any:
    """The action space: one ``script`` chunk per script (:class:`wmrl_demo.demo_policy.Space`)."""
    from wmrl_demo.demo_policy import Space

    chunks = tuple(solutions.Chunk(name, "script", source) for name, source in scripts)

    def sample(rng: random.Random, _kind: Any = None) -> list[solutions.Chunk]:
        return [rng.choice(chunks)]

    return Space(chunks, ROLES, NEXT_ROLES, "script", sample)


def load_fixed_scripts(directory: str | Path, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) of the policy over the scripts in ``directory`` (uniform over them at first)."""
    import torch

    from wmrl_demo.demo_policy import build_model, build_tokenizer, chunk_ids

    scripts = read_scripts(directory)
    actions = space(scripts)
    tokenizer = build_tokenizer(multiturn=False, space=actions)
    model = build_model(tokenizer, seed=seed, space=actions)
    with torch.no_grad():  # script logits = hidden . embedding: zero rows give each script the same probability
        model.get_input_embeddings().weight[chunk_ids(tokenizer, list(actions.chunks))] = 0.0
    model.eval()
    return model, tokenizer


__all__ = ["MAX_SCRIPTS", "NAME", "load_fixed_scripts", "read_scripts", "space"]
