"""``builtin:tiny-coder``: a policy small enough to learn on a CPU, built with no download.

This is a DEMO-SCALE policy. Real runs train real models (Hugging Face ids) on GPUs; the
tiny coder exists so that ``wmrl run examples/quickstart.yaml`` shows WMRL learning on a
laptop in minutes.

* **Tokenizer** (``tokenizers`` wrapped in transformers' fast tokenizer): every code chunk
  of :mod:`wmrl_demo.solutions` (a few whole lines) is ONE token, so a full solution
  script is ~3 tokens. Prompt text is reduced to a handful of keywords: a normalizer
  lower-cases it and deletes every word that is not in :data:`PROMPT_WORDS` (task kind,
  metric, direction, a few generic data words), so whatever the prompt template says, the
  model sees e.g. ``<bos> classification accuracy higher`` -- a few tokens that carry what
  it needs to condition on, and the same words for held-out tasks as for training tasks.
  No chat template on purpose: the trainer then passes prompts as plain text, tokenized
  with the ``<bos>`` the warm start saw.
* **A script follows its grammar**, ``load [preprocess] solve``: the model's logits carry
  it (:mod:`wmrl_demo.tiny_coder_model`, roles from :func:`token_roles`), so no chunk can
  repeat and no script can run into the token limit; and every solve chunk's id is a stop
  token of the generation config (:func:`stop_token_ids`; TRL reads the list and stops and
  masks with it). Without the grammar the policy could chain chunks without end: RL drove
  it into estimator chains (fixed by the stop tokens) and, on other machines, into load
  chunks repeated to the token limit. What RL chooses is which chunk fills each slot.
* **Model**: a 2-layer Qwen2-architecture causal LM (hidden 64) built from a config, with the
  grammar as a fixed logit bias (``TinyCoderForCausalLM``, registered with transformers'
  Auto classes so TRL's KL reference model is built with the same grammar).
* **Warm start**: a short supervised stage on random solution scripts
  (:func:`wmrl_demo.solutions.sample_script`: good and bad choices mixed, the estimator
  leaning only weakly towards the task's kind) for made-up tasks' prompts, so the starting policy writes code that mostly compiles but lands on every
  rung of the reward ladder; RL has to learn which estimator suits which task.
  ``load_builtin(..., warm_start_seed=k)`` gives a family of such policies that differ only
  in the warm start's randomness (init, example draw, training order); 0 is the default.
  The result is cached under ``<cache_dir>/tiny-coder-<content hash>/`` (``-w<k>`` appended
  for warm-start seed ``k`` > 0): the hash covers
  the chunk library, the vocabulary, the model config, the SFT recipe, the library
  versions and the source of the network and of this module, so any change rebuilds it and an unchanged recipe loads in about a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dataclasses import dataclass
from typing import Callable

from wmrl.cache import cache_root
from wmrl.outcome import QualityBucket, Status
from wmrl.tasks import Task
from wmrl_demo import revisions, solutions, wide_space
from wmrl_demo.revisions import REVISE_SHARE, revise, simulated_outcome
from wmrl_demo.suite import describe
from wmrl_trainer import observation as observation_module
from wmrl_trainer.observation import ERROR_TYPES, LINE_KINDS, observation_text
from wmrl_trainer.prompts import task_prompt

RECIPE_VERSION = "4"
BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
PROMPT_WORDS: tuple[str, ...] = (
    "classification", "regression", "class", "binary",
    "accuracy", "f1_macro", "r2", "rmse", "mae", "higher", "lower",
    "linear", "non", "noisy", "noise", "sparse", "synthetic", "images", "scales", "gaussian", "informative",
)
"""The only prompt words the tiny model sees (after lower-casing); every other word is dropped."""

MODEL_SIZES = {"hidden": 64, "layers": 2, "heads": 4}
SFT = {"examples": 4000, "steps": 400, "batch": 64, "lr": 3e-3, "seed": 0}
BUILTINS = ("tiny-coder", "tiny-coder-multiturn", "tiny-coder-wide")
"""``tiny-coder`` writes one script; ``tiny-coder-multiturn`` also reads the observation after a turn
(:func:`feedback_tokens`) and was warm-started on revise-after-feedback examples (:mod:`wmrl_demo.revisions`);
``tiny-coder-wide`` writes scripts of the wide action space (:mod:`wmrl_demo.wide_space`): preprocessing
chains, large models, hyperparameter tokens and wrappers, where a judge's optimism can be exploited."""


@dataclass(frozen=True)
class Space:
    """An action space of the tiny coder: its chunks, its grammar, which slot ends a script, its warm-start sampler."""

    chunks: tuple[solutions.Chunk, ...]
    roles: tuple[str, ...]
    next_roles: dict[str, tuple[str, ...]]
    stop_slot: str
    sample: Callable[[random.Random, str | None], list[solutions.Chunk]]


def space_of(name: str = "tiny-coder") -> Space:
    """The action space of builtin ``name`` (the tiny coder's for every builtin but ``tiny-coder-wide``)."""
    if name == "tiny-coder-wide":
        return Space(wide_space.CHUNKS, wide_space.ROLES, wide_space.NEXT_ROLES, "end", wide_space.sample_script)
    from wmrl_demo.tiny_coder_model import NEXT_ROLES, ROLES  # torch: imported when a policy is built, not before

    return Space(solutions.CHUNKS, ROLES, NEXT_ROLES, "solve", solutions.sample_script)
OUTPUT_BLOCK = r"<output>[\s\S]*?</output>"
"""The raw output part of an observation: the multi-turn tiny coder reads only the observation's header."""


def feedback_tokens() -> list[str]:
    """The observation header's ``key=value`` words (:func:`wmrl_trainer.observation.header`), one token each."""
    return ([f"status={s.value}" for s in Status] + [f"error={e}" for e in (*ERROR_TYPES, "other", "none")]
            + [f"where={k}" for k in (*LINE_KINDS, "none")] + [f"quality={b.value}" for b in (*QualityBucket,)]
            + ["quality=none"])


def default_cache_dir() -> Path:
    """``$WMRL_CACHE/policies`` or ``~/.cache/wmrl/policies``."""
    return cache_root() / "policies"


# ---------------------------------------------------------------- tokenizer

def _keyword_filter() -> str:
    """An Oniguruma pattern matching every word that is NOT a prompt keyword (to delete it)."""
    words = "|".join(sorted(PROMPT_WORDS, key=len, reverse=True))
    return rf"\b(?!(?:{words})\b)\w+\b|[^\w\s]"


def build_tokenizer(multiturn: bool = False, space: Space | None = None) -> Any:
    """The tiny coder's tokenizer: code chunks (of ``space``) as whole tokens, prompts reduced to keywords.

    ``multiturn`` adds the observation header's words as tokens (matched in the raw text) and
    drops the observation's ``<output>`` block.
    """
    space = space or space_of()
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, UNK, BOS, EOS]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for word in PROMPT_WORDS:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    steps = [normalizers.Lowercase(), normalizers.Replace(Regex(_keyword_filter()), " ")]
    if multiturn:
        steps.insert(0, normalizers.Replace(Regex(OUTPUT_BLOCK), " "))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Fuse()  # chunks carry their own newlines: concatenate them as they are
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(c.code, normalized=False, special=False) for c in space.chunks])
    if multiturn:
        tok.add_tokens([AddedToken(word, normalized=False, special=False) for word in feedback_tokens()])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side="left",
    )
    return fast


def chunk_ids(tokenizer: Any, chunks: list[solutions.Chunk]) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(c.code) for c in chunks]


def stop_token_ids(tokenizer: Any, space: Space | None = None) -> list[int]:
    """Generation stops at EOS or after any chunk that ends a script (a solve chunk fits and writes: the script
    is done; an end chunk in the wide space)."""
    space = space or space_of()
    return [tokenizer.eos_token_id] + chunk_ids(tokenizer, [c for c in space.chunks if c.slot == space.stop_slot])


# ---------------------------------------------------------------- model

def token_roles(tokenizer: Any, space: Space | None = None) -> list[str]:
    """The grammar role of every token id (:mod:`wmrl_demo.tiny_coder_model`): a chunk's slot, ``eos``, or ``prompt``."""
    space = space or space_of()
    roles = ["prompt"] * len(tokenizer)
    for chunk in space.chunks:
        roles[tokenizer.convert_tokens_to_ids(chunk.code)] = chunk.slot
    roles[tokenizer.eos_token_id] = "eos"
    return roles


def build_model(tokenizer: Any, seed: int = 0, space: Space | None = None) -> Any:
    """The tiny coder's network, randomly initialised, with the script grammar of ``space`` built in."""
    space = space or space_of()
    import torch

    from wmrl_demo.tiny_coder_model import TinyCoderConfig, TinyCoderForCausalLM  # torch: loaded with the policy

    h = MODEL_SIZES["hidden"]
    config = TinyCoderConfig(
        token_roles=token_roles(tokenizer, space), roles=list(space.roles),
        next_roles={k: list(v) for k, v in space.next_roles.items()},
        vocab_size=len(tokenizer), hidden_size=h, intermediate_size=2 * h, num_hidden_layers=MODEL_SIZES["layers"],
        num_attention_heads=MODEL_SIZES["heads"], num_key_value_heads=MODEL_SIZES["heads"], max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = TinyCoderForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = stop_token_ids(tokenizer, space)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ---------------------------------------------------------------- warm start

_KINDS = {"classification": ("accuracy", "f1_macro"), "regression": ("r2", "rmse", "mae")}
_EXTRA_WORDS = ("linear", "non-linear", "noisy", "sparse", "synthetic", "images", "scales", "gaussian", "informative", "binary")


def synthetic_task(rng: random.Random) -> Any:
    """A made-up task for the warm start; its prompt is the real prompt template (``task_prompt``).

    It goes through :func:`wmrl_trainer.prompts.task_prompt` and the mini-ml description, so
    the keywords the model sees come in the same order and number as for real tasks (an
    earlier, shorter template left the policy fragile on real prompts: the first RL update
    broke it). The warm start pairs such prompts with random scripts that lean only weakly
    towards the task's kind of estimator (:data:`wmrl_demo.solutions.KIND_MATCH`): RL has to learn the
    rest. No real task (held out or not) is used.
    """
    kind = rng.choice(sorted(_KINDS))
    metric = rng.choice(_KINDS[kind])
    source = " ".join(["a"] + rng.sample(_EXTRA_WORDS, rng.randint(0, 3)) + ["dataset"])
    n_features = rng.randint(2, 64)
    description = describe(kind, metric, source, n_features, rng.randint(100, 2000), rng.randint(50, 600),
                           rng.randint(2, 10))
    features = ",".join(f"f{i}" for i in range(n_features)).encode()
    return Task(name=f"task-{rng.randrange(10**6)}", description=description, kind=kind, metric=metric, target="target",
                data={"train.csv": b"id," + features + b",target\n", "test.csv": b"id," + features + b"\n"})


def sft_examples(tokenizer: Any, n: int, seed: int, space: Space | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) pairs: made-up tasks' prompts, random mixed-quality scripts of ``space``.

    No EOS: every script ends in a solve (end) chunk, which is a stop token itself.
    """
    space = space or space_of()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = synthetic_task(rng)
        prompt = tokenizer(task_prompt(task))["input_ids"]
        out.append((prompt, chunk_ids(tokenizer, space.sample(rng, task.kind))))
    return out


def revision_examples(tokenizer: Any, n: int, seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, completion ids, loss mask) of the multi-turn warm start: a share
    :data:`~wmrl_demo.revisions.REVISE_SHARE` are ``script 1, observation, script 2`` (the
    observation masked out of the loss, as in RL), the rest single scripts."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = synthetic_task(rng)
        prompt = tokenizer(task_prompt(task))["input_ids"]
        first = solutions.sample_script(rng, task.kind)
        ids = chunk_ids(tokenizer, first)
        mask = [1] * len(ids)
        if rng.random() < REVISE_SHARE:
            outcome, blamed = simulated_outcome(first, task.kind, rng)
            observation = tokenizer(observation_text(outcome, solutions.render(first)), add_special_tokens=False)["input_ids"]
            second = chunk_ids(tokenizer, revise(first, blamed, task.kind, rng))
            ids, mask = ids + observation + second, mask + [0] * len(observation) + [1] * len(second)
        out.append((prompt, ids, mask))
    return out


def warm_start(model: Any, tokenizer: Any, examples: list[tuple], steps: int, batch: int,
               lr: float, seed: int) -> list[float]:
    """Supervised next-token training on the completions (prompt tokens masked, and the completion
    tokens a third item's loss mask zeroes, if the example has one). Returns losses."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small is slower on several threads, and far slower on a busy machine
    try:
        return _warm_start(model, tokenizer, examples, steps, batch, lr, seed)
    finally:
        torch.set_num_threads(threads)


def _warm_start(model: Any, tokenizer: Any, examples: list[tuple], steps: int, batch: int,
                lr: float, seed: int) -> list[float]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(examples), (batch,), generator=gen).tolist()
        seqs = [examples[i][0] + examples[i][1] for i in idx]
        width = max(len(s) for s in seqs)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        labels = torch.full((batch, width), -100)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, i in enumerate(idx):
            prompt, completion = examples[i][:2]
            seq = prompt + completion
            start = width - len(seq)  # left padding, as at generation time
            ids[row, start:] = torch.tensor(seq)
            mask[row, start:] = 1
            targets = torch.tensor(completion)
            if len(examples[i]) > 2:  # a loss mask over the completion (observations are not learned)
                targets = torch.where(torch.tensor(examples[i][2]) == 1, targets, -100)
            labels[row, start + len(prompt):] = targets
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


# ---------------------------------------------------------------- cache + entry point

def recipe_hash(name: str = "tiny-coder") -> str:
    """Content hash of everything that determines the warm-started weights.

    Besides the recipe's data, the source of the network and of this module (tokenizer,
    warm start): a cache built by an edited network must never be reused for another
    (it happened once: a policy built mid-change kept loading under an unchanged hash).
    """
    import tokenizers
    import torch
    import transformers

    from wmrl_demo import tiny_coder_model  # torch: loaded with the policy
    from wmrl_demo.tiny_coder_model import NEXT_ROLES

    files = [Path(tiny_coder_model.__file__), Path(__file__)]
    multiturn = {}
    if name == "tiny-coder-multiturn":
        files += [Path(revisions.__file__), Path(observation_module.__file__)]
        multiturn = {"name": name, "repair": revisions.REPAIR_PROBABILITY, "revise": revisions.REVISE_SHARE}
    wide = {}
    if name == "tiny-coder-wide":
        files.append(Path(wide_space.__file__))
        wide = {"chunks": [(c.name, c.slot, c.code) for c in wide_space.CHUNKS], "grammar": wide_space.NEXT_ROLES,
                "chain": wide_space.CHAIN_PROBABILITY, "max_chain": wide_space.MAX_CHAIN,
                "bad": wide_space.BAD_PROBABILITY, "kind_match": wide_space.KIND_MATCH}
    sources = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()

    blob = json.dumps({
        "recipe": RECIPE_VERSION, "chunks": [(c.name, c.slot, c.code) for c in solutions.CHUNKS],
        "skip": solutions.SKIP_PROBABILITY, "bad": solutions.BAD_PROBABILITY, "words": PROMPT_WORDS,
        "extra": _EXTRA_WORDS, "model": MODEL_SIZES, "sft": SFT,
        "kind_match": solutions.KIND_MATCH, "grammar": NEXT_ROLES, "task": repr(synthetic_task(random.Random(0))),
        "versions": [torch.__version__, transformers.__version__, tokenizers.__version__], "sources": sources,
        **({"multiturn": multiturn} if multiturn else {}), **({"wide": wide} if wide else {}),
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_seed(warm_start_seed: int = 0) -> int:
    """The seed of one warm start: the recipe's ``SFT["seed"]`` for ``warm_start_seed`` 0, shifted by it otherwise.

    It seeds everything random in the warm start: the model's initialisation, the draw of
    the supervised examples and their training order.
    """
    if isinstance(warm_start_seed, bool) or not isinstance(warm_start_seed, int) or warm_start_seed < 0:
        raise ValueError(f"warm_start_seed must be a non-negative integer, got {warm_start_seed!r}")
    return SFT["seed"] + warm_start_seed


def build_tiny_coder(directory: Path, warm_start_seed: int = 0, name: str = "tiny-coder") -> None:
    """Build, warm-start and save builtin ``name`` into ``directory`` (seed: :func:`sft_seed`)."""
    seed = sft_seed(warm_start_seed)
    multiturn = name == "tiny-coder-multiturn"
    space = space_of(name)
    tokenizer = build_tokenizer(multiturn, space)
    model = build_model(tokenizer, seed=seed, space=space)
    if multiturn:
        examples = revision_examples(tokenizer, SFT["examples"], seed)
    else:
        examples = sft_examples(tokenizer, SFT["examples"], seed, space)
    losses = warm_start(model, tokenizer, examples, SFT["steps"], SFT["batch"], SFT["lr"], seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "warm_start.json").write_text(json.dumps({"final_loss": sum(losses[-20:]) / 20, "steps": len(losses)}))


def cache_name(name: str, warm_start_seed: int = 0) -> str:
    """The cache directory name of builtin ``name``: ``<name>-<recipe hash>``, plus ``-w<seed>`` for other warm starts.

    Warm-start seed 0 is the recipe itself (the directory name and the weights this code
    built before warm-start seeds existed); each other seed is its own policy in its own directory.
    """
    sft_seed(warm_start_seed)  # validates
    suffix = f"-w{warm_start_seed}" if warm_start_seed else ""
    return f"{name}-{recipe_hash(name)}{suffix}"


def builtin_path(name: str, cache_dir: str | Path | None = None, warm_start_seed: int = 0) -> Path:
    """The directory holding builtin policy ``name`` (warm start ``warm_start_seed``), built (atomically) on first use."""
    if name not in BUILTINS:
        raise ValueError(f"spec.policy.model: unknown builtin policy 'builtin:{name}'; builtins: {list(BUILTINS)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / cache_name(name, warm_start_seed)
    if (target / "warm_start.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-building-", dir=root))
    try:
        build_tiny_coder(staging, warm_start_seed, name)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "warm_start.json").is_file():  # not a lost race with a finished builder
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_builtin(name: str, cache_dir: str | Path | None = None, warm_start_seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) of builtin policy ``name`` (``tiny-coder``), warm-started and cached.

    ``warm_start_seed`` picks one of a family of warm starts that differ only in their
    randomness (:func:`sft_seed`); 0 is the default policy.
    """
    from transformers import PreTrainedTokenizerFast

    from wmrl_demo.tiny_coder_model import TinyCoderForCausalLM  # torch: loaded with the policy

    path = builtin_path(name, cache_dir, warm_start_seed)
    # Not AutoTokenizer: for a directory whose config.json says qwen2, transformers 5 builds a
    # Qwen2Tokenizer and swaps in Qwen2's normalizer and pre-tokenizer, which silently deleted
    # every prompt word (the policy saw only <bos> and could not tell tasks apart).
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    tokenizer.padding_side = "left"
    return TinyCoderForCausalLM.from_pretrained(path), tokenizer
