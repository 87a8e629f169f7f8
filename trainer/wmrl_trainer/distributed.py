"""The trainer's processes as one WMRL step: who grades, and how the others get the result.

Under ``wmrl launch`` (torchrun) every GPU runs a training process; TRL and accelerate give
each its slice of the generation batch. The WMRL step needs the whole batch (anchors are
chosen per step, the world model and calibration see every group), so rank 0 owns the
world model, the sandbox dispatcher, the calibration and the anchor selector: every rank
sends it its rows (:meth:`World.gather`), rank 0 grades the batch once, and
:meth:`World.broadcast` gives every rank the same result, so all compute identical
advantages and take their own rows (:meth:`World.rows`).

With one process every collective is the identity, so the single-process path is the same
code. Ranks are read from torchrun's environment (``RANK``, ``WORLD_SIZE``) before
torch.distributed exists (the trainer is built before accelerate starts the process group);
the collectives need the group and run only once training has started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @classmethod
    def from_env(cls) -> "World":
        size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"RANK={rank} WORLD_SIZE={size}: not a rank of the job")
        return cls(rank, size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _group(self) -> Any:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(f"{self.size} trainer processes but torch.distributed is not initialised "
                               "(start them with wmrl launch)")
        return dist

    def gather(self, items: Sequence[T]) -> list[T]:
        """Every rank's ``items``, concatenated in rank order, on every rank (the global batch order)."""
        if self.size == 1:
            return list(items)
        dist = self._group()
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, list(items))
        return [item for part in parts for item in part]

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (what other ranks pass is ignored)."""
        if self.size == 1:
            return value
        dist = self._group()
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def share(self, compute: Callable[[], T]) -> T:
        """Rank 0's ``compute()`` on every rank. When it raises there, every rank raises too (a
        RuntimeError naming it) instead of waiting for a result that never comes."""
        if self.size == 1:
            return compute()
        if self.is_main:
            try:
                value = compute()
            except BaseException as exc:
                self.broadcast(_Failure(f"{type(exc).__name__}: {exc}"))
                raise
            return self.broadcast(value)
        value = self.broadcast(None)
        if isinstance(value, _Failure):
            raise RuntimeError(f"rank 0 failed: {value.message}")
        return value

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any."""
        return any(self.gather([bool(flag)]))

    def close(self) -> None:
        """End the process group once every rank is done (left to interpreter exit, gloo's threads
        sometimes abort the process after training finished: a finished run exiting non-zero)."""
        if self.size > 1:
            dist = self._group()
            dist.barrier()
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.size > 1:
            self._group().barrier()

    def rows(self, local_rows: int) -> slice:
        """This rank's rows of the global batch when every rank holds ``local_rows`` (TRL's split)."""
        return slice(self.rank * local_rows, (self.rank + 1) * local_rows)


@dataclass(frozen=True)
class _Failure:
    message: str
