"""The tiny coder's network: a Qwen2 causal LM whose next-token choices follow the script grammar.

A solution script of the demo policy is ``load [preprocess] solve`` (:mod:`wmrl_demo.solutions`).
The grammar is first order, so it is a fixed additive bias on the logits that depends only
on the role of the token just read:

===================  =====================================
after a token of     the next token may be
===================  =====================================
the prompt           a load chunk
a load chunk         a preprocess chunk or a solve chunk
a preprocess chunk   a solve chunk
a solve chunk        EOS (the solve chunk is a stop token)
EOS                  EOS
===================  =====================================

Why inside the network and not as a sampling filter: sampling, the training log-probs, the
KL reference model and the entropy bonus must all see the same distribution. TRL computes
training log-probs and entropies with a fused LM head (``trl.trainer.utils.add_fused_lm_head``:
the backbone's last hidden state times the output embedding's ``weight``, never the
model's logits), so the bias is built into those two pieces: the backbone appends the
one-hot role of each input token to its hidden state (:class:`GrammarBackbone`), and the
output projection appends the fixed ``[V, roles]`` grammar matrix to the (tied) token
embeddings (:class:`GrammarHead`). ``hidden . embedding + role . grammar`` is then the
ordinary logit plus the grammar bias, on every path: ``forward``, generation with a KV
cache, and TRL's fused head. TRL rebuilds the reference model from the saved config
through the Auto classes registered below, so it carries the same grammar.

Without the grammar a load chunk could follow a load chunk, and on some machines RL drove
the policy into scripts that repeat the load chunk up to the token limit: every group then
scored the same, advantages were zero, and nothing pulled the policy back.

The table above is the tiny coder's grammar (:data:`ROLES`, :data:`NEXT_ROLES`); a config may
carry another first-order grammar (``roles``/``next_roles``: ``builtin:tiny-coder-wide``'s, in
:mod:`wmrl_demo.wide_space`).

Blocked tokens get :data:`BLOCKED` (a large finite negative number, not ``-inf``): their
probability is exactly 0 in float32 while ``p * log p`` stays 0 in entropy computations.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2Model

ROLES: tuple[str, ...] = ("prompt", "load", "preprocess", "solve", "eos")
NEXT_ROLES: dict[str, tuple[str, ...]] = {
    "prompt": ("load",),
    "load": ("preprocess", "solve"),
    "preprocess": ("solve",),
    "solve": ("eos",),
    "eos": ("eos",),
}
BLOCKED = -1.0e4


def grammar_matrix(token_roles: Sequence[str], roles: Sequence[str] = ROLES,
                   next_roles: Optional[dict[str, Sequence[str]]] = None) -> torch.Tensor:
    """``[V, len(roles)]``: entry (v, r) is the logit bias of token v right after a token of role ``roles[r]``."""
    next_roles = NEXT_ROLES if next_roles is None else next_roles
    unknown = sorted(set(token_roles) - set(roles))
    if unknown:
        raise ValueError(f"unknown token roles {unknown}; known: {list(roles)}")
    matrix = torch.full((len(token_roles), len(roles)), BLOCKED)
    for r, role in enumerate(roles):
        allowed = [v for v, next_role in enumerate(token_roles) if next_role in next_roles[role]]
        matrix[allowed, r] = 0.0
    return matrix


class TinyCoderConfig(Qwen2Config):
    """Qwen2's config plus ``token_roles`` (the grammar role of every vocabulary entry) and the grammar
    itself (``roles``, ``next_roles``; the tiny coder's when not given)."""

    model_type = "wmrl-tiny-coder"

    def __init__(self, token_roles: Optional[list[str]] = None, roles: Optional[list[str]] = None,
                 next_roles: Optional[dict[str, list[str]]] = None, **kwargs: Any):
        self.token_roles = list(token_roles or [])
        self.roles = list(roles or ROLES)
        self.next_roles = {k: list(v) for k, v in (next_roles or NEXT_ROLES).items()}
        kwargs["tie_word_embeddings"] = False  # the head reads the embeddings itself (GrammarHead)
        super().__init__(**kwargs)
        if not hasattr(self, "auto_map"):
            # TRL builds the KL reference model from the saved config and reads ``auto_map`` to pick an Auto
            # class; empty means "no remote code", so it falls back to AutoModelForCausalLM (registered below).
            self.auto_map = {}


class GrammarBackbone(Qwen2Model):
    """Qwen2's decoder whose last hidden state ends with the one-hot grammar role of each input token."""

    def __init__(self, config: TinyCoderConfig):
        super().__init__(config)
        self._role_ids: Optional[torch.Tensor] = None  # built on first use: from_pretrained builds on the meta device

    def role_ids(self, device: torch.device) -> torch.Tensor:
        if self._role_ids is None or self._role_ids.device != device:
            self._role_ids = torch.tensor([self.config.roles.index(r) for r in self.config.token_roles],
                                          device=device)
        return self._role_ids

    def forward(self, input_ids: Optional[torch.LongTensor] = None, **kwargs: Any) -> Any:
        if input_ids is None:
            raise ValueError("the tiny coder's grammar needs input_ids (inputs_embeds alone cannot be constrained)")
        out = super().forward(input_ids=input_ids, **kwargs)
        hidden = out.last_hidden_state
        roles = F.one_hot(self.role_ids(input_ids.device)[input_ids], len(self.config.roles)).to(hidden.dtype)
        out.last_hidden_state = torch.cat([hidden, roles], dim=-1)
        return out


class GrammarHead:
    """The output projection ``[token embeddings | grammar matrix]`` (no parameters of its own).

    ``weight`` is what TRL's fused LM head multiplies the hidden state by; gradients reach
    the token embeddings through it, while the grammar part is a constant.
    """

    bias = None

    def __init__(self, backbone: GrammarBackbone):
        self._backbone = backbone
        self._grammar: Optional[torch.Tensor] = None

    @property
    def weight(self) -> torch.Tensor:
        embedding = self._backbone.embed_tokens.weight
        if self._grammar is None or self._grammar.device != embedding.device:
            config = self._backbone.config
            self._grammar = grammar_matrix(config.token_roles, config.roles, config.next_roles).to(embedding.device)
        return torch.cat([embedding, self._grammar.to(embedding.dtype)], dim=1)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class TinyCoderForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM with the script grammar in its backbone output and its head (see the module docstring)."""

    config_class = TinyCoderConfig
    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: TinyCoderConfig):
        super().__init__(config)
        if len(config.token_roles) != config.vocab_size:
            raise ValueError(f"token_roles has {len(config.token_roles)} entries for a vocabulary of {config.vocab_size}")
        self.model = GrammarBackbone(config)
        del self.lm_head
        self.lm_head = GrammarHead(self.model)
        self.post_init()

    def get_output_embeddings(self) -> GrammarHead:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: Any) -> None:
        raise NotImplementedError("the tiny coder's output projection is its token embeddings plus the grammar")


AutoConfig.register(TinyCoderConfig.model_type, TinyCoderConfig)
AutoModelForCausalLM.register(TinyCoderConfig, TinyCoderForCausalLM)
