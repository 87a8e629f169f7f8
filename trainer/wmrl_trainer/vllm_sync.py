"""Weight sync to vLLM where TRL's own cannot run: a trainer without CUDA, or vLLM on CPU.

TRL 1.16 pushes the policy's weights into vLLM after every optimizer step
(``VLLMGeneration.sync_weights``) in two ways:

* server mode streams them over an NCCL group (``VLLMClient.init_communicator``), which needs a
  CUDA device on the trainer's side: on CPU, TRL raises ``NotImplementedError`` while the trainer
  is being built;
* colocate mode calls ``model.load_weights`` on vLLM's model, which writes into the layers vLLM
  has already processed; vLLM's CPU build repacks its linear layers for oneDNN, and on one stack
  (torch 2.15, transformers 5.24) that failed (``'Parameter' object has no attribute
  'weight_loader'``), while under the project's pins it worked (docs/trainer.md).

vLLM's own ``reload_weights`` (a worker method, reached through ``collective_rpc``) loads
checkpoint-format weights and processes (repacks) them again, which is what it is for, so
wherever TRL's cannot be relied on:

* colocate with vLLM on CPU: ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``
  with the policy's tensors, in process;
* server mode without CUDA: the policy's tensors are written as ``model.safetensors`` into a
  directory the server can read, and the server reloads them on ``POST /collective_rpc``
  (``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``; vLLM's development
  endpoints, which ``trl vllm-serve`` turns on with ``VLLM_SERVER_DEV_MODE=1``). The server must
  see the trainer's directory: the same machine (``wmrl run``) or the same volume. Where it
  cannot, the first sync (before the first generation) fails with :class:`WeightSyncError`
  naming ``spec.policy.vllmMode``.

With tied input and output embeddings the trainer's parameter walk yields the matrix once
(``model.embed_tokens.weight``); ``lm_head.weight`` is sent too (:func:`vllm_named_weights`):
vLLM's CPU build packs the output layer's matmul separately, and the field notes found the
sync incomplete without it.

Everything else (generation, prefix-cache resets, TRL's checks) stays TRL's:
:class:`CPUWeightSyncGeneration` is TRL's ``VLLMGeneration`` with ``_init_vllm`` (server mode: no
NCCL group) and ``sync_weights`` replaced, and :func:`generation_backend` installs it for the
duration of ``GRPOTrainer.__init__``, which builds its backend from the module-level name
``trl.trainer.grpo_trainer.VLLMGeneration``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import torch
from trl.generation.vllm_generation import VLLMGeneration

log = logging.getLogger("wmrl.trainer")

TRL = "trl"                     # TRL's own sync (CUDA: NCCL in server mode, load_weights in colocate)
RELOAD = "reload"               # colocate, vLLM on CPU: reload_weights in process
RELOAD_FILES = "reload-files"   # server mode without CUDA: reload_weights from files, over HTTP
WEIGHTS_FILE = "model.safetensors"


class WeightSyncError(RuntimeError):
    pass


def weight_sync(mode: str, trainer_device: str, vllm_on_cpu: bool) -> str:
    """How the policy's weights reach vLLM: :data:`TRL`, :data:`RELOAD` or :data:`RELOAD_FILES`.

    ``trainer_device`` is the training process's device type (``cuda``, ``cpu``, ...);
    ``vllm_on_cpu`` whether the vLLM importable here is a CPU build (it is the engine in colocate mode).
    """
    if mode == "colocate":
        return RELOAD if vllm_on_cpu else TRL
    if mode == "server":
        return TRL if trainer_device == "cuda" else RELOAD_FILES
    raise ValueError(f"spec.policy.vllmMode: unknown mode {mode!r}")


def vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def vllm_named_weights(named: Iterable[tuple[str, torch.Tensor]], model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` (TRL's parameter walk, one tensor per parameter), then ``lm_head.weight`` when the
    model ties it to the input embeddings (the walk yields a tied matrix once, under its input name)."""
    yield from named
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False) and model.get_output_embeddings() is not None:
        yield "lm_head.weight", model.get_output_embeddings().weight.data


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], directory: Path) -> Path:
    """``directory``/model.safetensors holding ``weights`` (written to a temporary name, then renamed)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.untyped_storage().data_ptr() in storages:  # a tied matrix: safetensors stores no shared tensors
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    target = directory / WEIGHTS_FILE
    partial = directory / f".{WEIGHTS_FILE}.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, target)
    return target


class CPUWeightSyncGeneration(VLLMGeneration):
    """TRL's vLLM backend with the weight sync of this module (:data:`RELOAD` or :data:`RELOAD_FILES`).

    ``weights_dir`` is where :data:`RELOAD_FILES` writes the weights; ``syncs`` holds the seconds of
    every sync done so far."""

    def __init__(self, *args: Any, sync: str, weights_dir: Optional[Path] = None, **kwargs: Any):
        if sync not in (RELOAD, RELOAD_FILES):
            raise ValueError(f"CPUWeightSyncGeneration syncs with {RELOAD} or {RELOAD_FILES}, not {sync!r}")
        if sync == RELOAD_FILES and weights_dir is None:
            raise ValueError("reload-files sync needs weights_dir")
        self.sync = sync
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.syncs: list[float] = []
        super().__init__(*args, **kwargs)

    @property
    def base_url(self) -> str:
        return self.server_base_url or f"http://{self.server_host}:{self.server_port}"

    def _init_vllm(self) -> None:
        if self.sync == RELOAD:  # colocate: TRL builds the in-process engine as usual
            return super()._init_vllm()
        from trl.generation.vllm_client import VLLMClient

        if self.accelerator.is_main_process:  # TRL's client, without the NCCL group it cannot open here
            self.vllm_client = VLLMClient(base_url=self.base_url, group_port=self.group_port,
                                          connection_timeout=self.server_timeout)
        self.accelerator.wait_for_everyone()

    def sync_weights(self) -> None:
        started = time.perf_counter()
        weights = vllm_named_weights(self._iter_named_params(), self.model)
        if self.sync == RELOAD:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.llm.reset_prefix_cache()
        elif self.accelerator.is_main_process:
            self._reload_from_files(weights)
        else:
            for _ in weights:  # every process walks the parameters (gathering is collective)
                pass
        self.accelerator.wait_for_everyone()
        self.syncs.append(time.perf_counter() - started)
        log.info("weights synced to vLLM (%s) in %.2f s", self.sync, self.syncs[-1])

    def _reload_from_files(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        write_weights(weights, self.weights_dir)
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir)}}
        try:
            response = self.vllm_client.session.post(f"{self.base_url}/collective_rpc", json=body,
                                                     timeout=self.server_timeout)
        except Exception as exc:  # requests' errors: the server went away
            raise WeightSyncError(self._explain(f"the request failed: {exc}")) from exc
        if response.status_code != 200:
            raise WeightSyncError(self._explain(f"HTTP {response.status_code}: {response.text[:2000]}"))
        self.vllm_client.reset_prefix_cache()

    def _explain(self, what: str) -> str:
        return (f"spec.policy.vllmMode server: a trainer without CUDA cannot open TRL's NCCL weight-sync group, so "
                f"it writes the policy's weights to {self.weights_dir} and asks the rollout server at "
                f"{self.base_url} to load them (POST /collective_rpc reload_weights, vLLM's development endpoints, "
                f"on with VLLM_SERVER_DEV_MODE=1 as `trl vllm-serve` sets); {what}. The server must read that "
                f"directory (the same machine or volume); otherwise set spec.policy.vllmMode: colocate.")


@contextlib.contextmanager
def generation_backend(sync: Optional[str], weights_dir: Optional[Path]) -> Iterator[None]:
    """While open, ``GRPOTrainer.__init__`` builds :class:`CPUWeightSyncGeneration` (with ``sync``) in place
    of TRL's ``VLLMGeneration``; with :data:`TRL` (or None: no vLLM), TRL's own, untouched."""
    if sync in (None, TRL):
        yield
        return
    from trl.trainer import grpo_trainer

    original = grpo_trainer.VLLMGeneration

    def build(*args: Any, **kwargs: Any) -> CPUWeightSyncGeneration:
        return CPUWeightSyncGeneration(*args, sync=sync, weights_dir=weights_dir, **kwargs)

    grpo_trainer.VLLMGeneration = build
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = original
