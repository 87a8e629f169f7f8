"""``wmrl train --config FILE``: the trainer Job's entry point.

It reads the rendered run config, builds the trainer (:func:`wmrl_trainer.build.build_trainer`,
with the ``--world-model`` factory's world model when given) and trains
(:class:`wmrl_trainer.trainer.WMRLTrainer`), then prints the run summary as one JSON line
(also written to ``--summary``). On SIGTERM it checkpoints after the current step and exits
143, so the Job restarts it and it resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from wmrl.api.runconfig import load_run_config
from wmrl_trainer.build import build_trainer

EXIT_PREEMPTED = 143  # 128 + SIGTERM: the pod failed, so the Job recreates it and training resumes


# ---------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the rendered run config (run.yaml from the ConfigMap)")
    parser.add_argument("--world-model", metavar="MODULE:FACTORY",
                        help="use your own world model: FACTORY(world_model_spec, runtime) -> WorldModel")
    parser.add_argument("--summary", metavar="PATH", help="write the run summary JSON here as well")
    parser.add_argument("--rollouts", metavar="DIR", help="log every step's rollouts (task, scripts, reward, advantage, "
                        "anchor) as JSON lines, one file per training process: DIR/rank-<r>.jsonl")


def _factory(ref: str) -> Callable[..., Any]:
    import importlib

    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"--world-model must be MODULE:FACTORY, got {ref!r}")
    return getattr(importlib.import_module(module), name)


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    logging.basicConfig(level=os.environ.get("WMRL_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_run_config(args.config)
        world_model = _factory(args.world_model)(config.spec.world_model, config.runtime) if args.world_model else None
    except (OSError, ValueError, ValidationError) as exc:
        print(f"wmrl train: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = build_trainer(config, world_model=world_model, rollouts_dir=args.rollouts)
        signal.signal(signal.SIGTERM, trainer.request_stop)
        try:
            summary = trainer.train()
            trainer.world.close()  # only after success: a failed rank never reaches the barrier
        finally:
            trainer.close()
    finally:  # the --world-model factory's object is this function's to close (a multi-process run skips atexit)
        if callable(getattr(world_model, "close", None)):
            world_model.close()
    text = json.dumps({"event": "summary", **summary}, default=float)
    if trainer.world.is_main:
        print(text, flush=True)
        if args.summary:
            Path(args.summary).write_text(text)
    code = 0 if trainer.finished else EXIT_PREEMPTED
    if trainer.world.size > 1:
        _exit_skipping_teardown(code)
    return code


def _exit_skipping_teardown(code: int) -> None:
    """End a training process of a multi-process run without the interpreter's teardown.

    Everything the run owns is written and closed by now. What remains are gloo's C++ worker
    threads, which at interpreter teardown sometimes abort a rank ("terminate called without an
    active exception", SIGABRT) even after ``destroy_process_group``: torchrun then reports a
    finished run as failed and the Job would retry it. ``os._exit`` skips that teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
