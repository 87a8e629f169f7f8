"""Load the policy (model + tokenizer) named by ``spec.policy.model``, and build tiny ones offline.

``spec.policy.model`` is a Hugging Face model id, a local directory, or ``builtin:<name>``
(the CPU demo policies, delegated to :func:`wmrl_demo.demo_policy.load_builtin`, and the
smoke-run policy ``builtin:fixed-scripts``, :mod:`wmrl_demo.fixed_scripts`).

:func:`save_tiny_model` writes a randomly initialised Qwen2-architecture model and a
byte-level BPE tokenizer trained on a few lines of Python to a directory, with no
download: tests, the trainer benchmark and the GPU smoke test (vLLM loads it like any
checkpoint) all use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"
# A chat template so that chat-completions servers (vLLM's OpenAI server) accept the tiny model.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = [
    "import numpy as np\nfrom sklearn.linear_model import LogisticRegression, Ridge\n",
    "train = np.genfromtxt('train.csv', delimiter=',', names=True)\n",
    "test = np.genfromtxt('test.csv', delimiter=',', names=True)\n",
    "model = LogisticRegression(max_iter=200).fit(X, y)\npred = model.predict(X_test)\n",
    "np.savetxt('submission.csv', np.c_[ids, pred], delimiter=',', header='id,target', comments='')\n",
    "def main():\n    for i in range(10):\n        print(i)\n\nif __name__ == '__main__':\n    main()\n",
    "```python\n# solution\n```\nWrite a Python script that trains a model and writes submission.csv.\n",
]


def load_policy(model: str, cache_dir: str | None = None, dtype: Any = None,
                scripts: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a Hugging Face id, a local path or ``builtin:<name>``.

    ``builtin:fixed-scripts`` samples from the scripts in the directory ``scripts``
    (``spec.policy.scripts``; :mod:`wmrl_demo.fixed_scripts`). The tokenizer gets a pad token
    (its EOS) when it has none, since GRPO pads batches.
    """
    if not model:
        raise ValueError("spec.policy.model: must not be empty")
    if model == "builtin:fixed-scripts":
        if not scripts:
            raise ValueError("spec.policy.scripts: builtin:fixed-scripts needs a directory of *.py scripts")
        from wmrl_demo.fixed_scripts import load_fixed_scripts  # smoke-run policy, imported only when named

        return load_fixed_scripts(scripts)
    if model.startswith("builtin:"):
        from wmrl_demo.demo_policy import load_builtin  # demo code, imported only when a spec names it

        return load_builtin(model[len("builtin:"):], cache_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model, cache_dir=cache_dir)
        net = AutoModelForCausalLM.from_pretrained(model, cache_dir=cache_dir, dtype=dtype or "auto")
    except OSError as exc:
        raise ValueError(f"spec.policy.model: cannot load {model!r}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # GRPOTrainer requires left padding
    return net, tokenizer


def build_tiny_tokenizer(vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer trained on a few lines of Python (every byte is representable)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(tokenizer: Any, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                     context: int = 2048) -> Any:
    """A randomly initialised Qwen2-architecture causal LM sized for CPU tests (deterministic in ``seed``);
    ``context``: its max_position_embeddings (what vLLM takes as the longest prompt plus answer)."""
    import torch  # torch and transformers load here, not on import: build and local import load_policy
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=context,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def save_tiny_model(directory: str | Path, seed: int = 0, **sizes: int) -> Path:
    """Write a tiny model + tokenizer (loadable by :func:`load_policy` and by vLLM) to ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **sizes)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
