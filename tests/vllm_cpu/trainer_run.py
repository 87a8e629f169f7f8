"""The project's trainer in the vLLM venv (tests/vllm_cpu/harness.py), driven by the tier's tests.

Run by the venv's python with the project on PYTHONPATH (``harness.project_env``), since vLLM must
be importable in the trainer's process (colocate mode runs the engine there; TRL refuses server
mode without it too). Writes what it saw as JSON to OUT::

    trainer_run.py train CONFIG.yaml OUT.json   # build_trainer(CONFIG) and train it
    trainer_run.py sync CONFIG.yaml OUT.json    # train, then compare served log-probs with the policy's

``sync``: the log-probs vLLM serves for a fixed token sequence against the policy's own (the
transformers model the trainer updates), at three points: before training (both hold the initial
weights), after the run's last optimizer step (vLLM still holds the weights of that step's
generation) and after ``vllm_generation.sync_weights()``, the method TRL calls before generating.
Then it tries TRL's own sync (:func:`trl_sync`), for the record.
A build or training error is written to OUT as ``{"error": ...}`` and exits 3.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import httpx
import torch

from wmrl.api.runconfig import load_run_config
from wmrl_trainer.build import build_trainer

PROBE_TEXT = "import pandas as pd\nprint(1)\nsubmission.to_csv('submission.csv', index=False)"


def policy_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under the transformers model."""
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:], device=model.device)[:, None])[:, 0].tolist()


def served_logprobs(generation, ids: list[int]) -> list[float]:
    """The same, as vLLM computes them (prompt log-probs), in TRL's colocated engine or the server."""
    if generation.mode == "colocate":
        from vllm import SamplingParams

        out = generation.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                                      use_tqdm=False)[0]
        return [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], ids[1:])]
    client = generation.vllm_client
    body = {"model": client.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    choice = httpx.post(f"{client.base_url}/v1/completions", json=body, timeout=300).json()["choices"][0]
    return [entry[str(token)]["logprob"] for entry, token in zip(choice["prompt_logprobs"][1:], ids[1:])]


def gap(a: list[float], b: list[float]) -> dict:
    """Largest and mean per-token difference of two log-prob sequences."""
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "tokens": len(diffs)}


def trl_sync(generation, grpo, ids: list[int]) -> dict:
    """What TRL's own weight sync does here (a diagnostic; the trainer does not use it on CPU). Server
    mode: opening its NCCL group. Colocate: after moving the policy's weights (noise, seeded), TRL's
    ``sync_weights`` (``load_weights`` into vLLM's model), and the gaps before and after it."""
    from trl.generation.vllm_generation import VLLMGeneration

    out = {"trl_sync_error": ""}
    try:
        if generation.mode == "server":
            generation.vllm_client.init_communicator(device=grpo.accelerator.device)
            return out
        torch.manual_seed(0)
        with torch.no_grad():
            for param in grpo.model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        policy = policy_logprobs(grpo.model, ids)
        out["gap_before_trl_sync"] = gap(policy, served_logprobs(generation, ids))
        VLLMGeneration.sync_weights(generation)
        out["gap_after_trl_sync"] = gap(policy, served_logprobs(generation, ids))
    except Exception as exc:
        out["trl_sync_error"] = f"{type(exc).__name__}: {exc}"
    return out


def rollouts(directory: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("rank-*.jsonl")) for line in f.read_text().splitlines()]


def main(argv: list[str]) -> int:
    what, config_path, out_path = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_run_config(config_path)
    rollouts_dir = Path(config.runtime.checkpoint_dir) / "rollouts"
    out: dict = {}
    records: list = []
    try:
        trainer = build_trainer(config, callbacks=[records.append], rollouts_dir=str(rollouts_dir))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        Path(out_path).write_text(json.dumps(out, indent=1))
        return 3
    grpo = trainer.grpo
    try:
        generation = grpo.vllm_generation
        out.update(use_vllm=grpo.use_vllm, vllm_mode=grpo.vllm_mode, weight_sync=grpo.weight_sync,
                   backend=type(generation).__name__, device=str(grpo.accelerator.device))
        ids = grpo.processing_class(PROBE_TEXT)["input_ids"]
        if what == "sync":
            out["gap_initial"] = gap(policy_logprobs(grpo.model, ids), served_logprobs(generation, ids))
        out["summary"] = trainer.train()
        out["records"] = [r.to_json() for r in records]
        out["log_history"] = grpo.state.log_history
        out["rollouts"] = rollouts(rollouts_dir)
        if what == "sync":
            policy = policy_logprobs(grpo.model, ids)
            out["gap_before_sync"] = gap(policy, served_logprobs(generation, ids))
            generation.sync_weights()
            out["gap_after_sync"] = gap(policy, served_logprobs(generation, ids))
            out.update(trl_sync(generation, grpo, ids))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    finally:
        out["syncs"] = list(getattr(getattr(grpo, "vllm_generation", None), "syncs", []))
        trainer.close()
        Path(out_path).write_text(json.dumps(out, indent=1, default=str))
    return 3 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
