"""Atomic checkpoints: ``<root>/step-00000012/`` holds everything needed to resume at step 12.

A checkpoint is written into a temporary sibling directory, a ``COMPLETE`` marker is
written last and fsynced, and only then is the directory renamed into place. A
directory without the marker (a kill -9 mid-write, a full disk) is never loaded and is
removed by the next save. The newest ``keep`` complete checkpoints are kept.

Contents: what transformers' Trainer itself restores on ``train(resume_from_checkpoint=)``
(policy weights, optimizer, scheduler, RNG states, ``trainer_state.json`` with the step)
plus ``wmrl_state.json`` (anchor selector, cumulative counters, in-process calibration)
and ``world_model.pt`` when the world model has a ``state_dict``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from wmrl_trainer.distributed import World

COMPLETE = "COMPLETE"
WMRL_STATE = "wmrl_state.json"
WORLD_MODEL_STATE = "world_model.pt"
_NAME = re.compile(r"^step-(\d{8})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for entry in base.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_dir() and (entry / COMPLETE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Optional[Path]:
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint(root: str | Path, step: int, write: Callable[[Path], None], keep: int = 2,
                     world: World = World()) -> Path:
    """Run ``write(tmp_dir)``, mark it complete and rename it to ``<root>/step-<step>``; prune old ones.

    With several trainer processes every rank runs ``write`` into the same directory (each
    writes its part: transformers' per-rank RNG state, FSDP shards) and rank 0 alone prepares,
    marks and renames it, between barriers; ``root`` must be one volume that all ranks see.
    """
    base = Path(root)
    tmp = base / world.broadcast(f".tmp-{checkpoint_name(step)}-{os.getpid()}")
    if world.is_main:
        base.mkdir(parents=True, exist_ok=True)
        for stale in base.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    world.barrier()
    write(tmp)
    world.barrier()
    final = base / checkpoint_name(step)
    world.share(lambda: _complete(base, tmp, final, step, keep))  # rank 0 completes; all learn how it went
    return final


def _complete(base: Path, tmp: Path, final: Path, step: int, keep: int) -> None:
    marker = tmp / COMPLETE
    with open(marker, "w") as fh:
        json.dump({"step": step}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(base)
    for _, old in complete_checkpoints(base)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for entry in base.iterdir():  # leftovers of interrupted saves that never got their marker
        if _NAME.match(entry.name) and entry.is_dir() and not (entry / COMPLETE).is_file():
            shutil.rmtree(entry, ignore_errors=True)


def save_trainer_state(trainer: Any, directory: Path, main: bool = True) -> None:
    """What ``Trainer.train(resume_from_checkpoint=directory)`` restores (transformers' own file names).

    Called on every rank: transformers writes the model and optimizer from the ranks that
    should (gathering FSDP shards collectively) and one RNG state file per rank."""
    trainer.save_model(str(directory))
    trainer._save_optimizer_and_scheduler(str(directory))
    trainer._save_rng_state(str(directory))
    if main:
        trainer.state.save_to_json(str(directory / "trainer_state.json"))


def save_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, sort_keys=True))


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
