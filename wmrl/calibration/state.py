"""One calibration, as a value that can be stored, shared and folded into.

A :class:`CalibrationState` holds the debiasing buffer and map, the disagreement
average and frozen constant, counters, a ``version`` (bumped by every applied
batch) and, per trainer, the ids of its most recent applied batches so that a
retried batch is recognised and not counted twice.

Idempotency bound: the last :data:`RECENT_BATCHES` batch ids of each of the
:data:`RECENT_TRAINERS` most recently active trainers are remembered (as 16-hex
digests). A client retries a batch until it is acknowledged before it sends the
next one, so a retry is always among its own recent ids; a trainer silent while
128 others were active is forgotten, and a retry from it after that would count again.

Rewards are rounded to 6 decimals when they are folded in; the JSON form then
stores them exactly and compactly as integers in millionths (two flat arrays, ~8
bytes a number: the default 5000-pair buffer serialises to about 80 KB, far under
the 1 MiB limit of a ConfigMap), and every replica that loads the state computes
the same numbers.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from wmrl.debias import CalibrationMap, OnlineDebiaser, check_rewards
from wmrl.denoise import DisagreementWeighter, disagreements_of_groups

__all__ = ["CalibrationConfig", "CalibrationState", "StateError", "RECENT_BATCHES", "RECENT_TRAINERS", "validate_groups"]

FORMAT = 1
RECENT_BATCHES = 64
RECENT_TRAINERS = 128
MAX_ID_LENGTH = 256
DECIMALS = 6


class StateError(ValueError):
    """Stored calibration state that cannot be read (corrupt, hand-edited, another format)."""


@dataclass(frozen=True)
class CalibrationConfig:
    """The knobs of debiasing and denoising; defaults are the paper's (same as the WMRLRun schema).

    ``debiasing_enabled`` says which world-model rewards the trainers train on (the run's
    ``spec.algorithm.debiasing.enabled``), and so which ones the disagreement ``s^2`` of
    the anchor weight is measured on: calibrated ones (``True``, the paper) or raw ones
    (``False``: the map is still fitted and reported, but trainers do not apply it).
    """

    bins: int = 10
    min_pairs: int = 200
    refit_every: int = 64
    buffer_size: int = 5000
    target_weight: float = 2.0
    max_weight: float = 4.0
    half_life: float = 64.0
    warmup: int = 32
    debiasing_enabled: bool = True

    def __post_init__(self) -> None:
        # Building the two halves validates every field with one message each.
        OnlineDebiaser(self.bins, self.min_pairs, self.refit_every, self.buffer_size)
        DisagreementWeighter(self.target_weight, self.max_weight, self.half_life, self.warmup)
        if not isinstance(self.debiasing_enabled, bool):
            raise ValueError(f"debiasingEnabled must be true or false, got {self.debiasing_enabled!r}")

    @classmethod
    def from_spec(cls, algorithm: Any) -> "CalibrationConfig":
        """From a ``wmrl.api.schema.AlgorithmSpec`` (or anything with its two sub-objects)."""
        d, n = algorithm.debiasing, algorithm.denoising
        return cls(d.bins, d.min_pairs, d.refit_every, d.buffer_size,
                   n.target_weight, n.max_weight, float(n.half_life), n.warmup, bool(d.enabled))

    def to_json(self) -> dict[str, Any]:
        """camelCase JSON; ``debiasingEnabled`` only when false, so that the JSON of a default
        config (the operator's ``$WMRL_CALIBRATION_CONFIG``, stored states) is what older
        services read."""
        out = {_camel(k): v for k, v in asdict(self).items()}
        if out["debiasingEnabled"]:
            del out["debiasingEnabled"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CalibrationConfig":
        names = {_camel(f.name): f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"config: unknown field(s) {unknown}")
        return cls(**{names[k]: v for k, v in data.items()})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _check_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{name} must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    return value


_NUMBER_TYPES = {int, float}


def validate_groups(groups: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(wm, env), ...]`` from ``[{"task"?, "wm": [...], "env": [...]}, ...]``, or ValueError naming the field.

    Rewards come back rounded to 6 decimals. Checks are batched over all groups
    (one array per side) because this runs on every request of the service.
    """
    if not isinstance(groups, list) or not groups:
        raise ValueError("groups must be a non-empty list")
    sides: dict[str, list] = {"wm": [], "env": []}
    sizes = []
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping):
            raise ValueError(f"groups[{i}] must be an object with 'wm' and 'env'")
        if len(group) > 3 or not set(group) <= {"task", "wm", "env"}:
            raise ValueError(f"groups[{i}]: unknown field(s) {sorted(set(group) - {'task', 'wm', 'env'})}")
        if "task" in group and not isinstance(group["task"], str):
            raise ValueError(f"groups[{i}].task must be a string")
        for side in ("wm", "env"):
            values = group.get(side)
            if type(values) is not list or not values:
                raise ValueError(f"groups[{i}].{side} must be a non-empty list of numbers")
            if not set(map(type, values)) <= _NUMBER_TYPES:  # bool, str, None, nested lists: no
                j, v = next((j, v) for j, v in enumerate(values) if type(v) not in _NUMBER_TYPES)
                raise ValueError(f"groups[{i}].{side}[{j}] must be a number, got {type(v).__name__}")
            sides[side].extend(values)
        if len(group["wm"]) != len(group["env"]):
            raise ValueError(f"groups[{i}]: wm and env lengths differ ({len(group['wm'])} != {len(group['env'])})")
        sizes.append(len(group["wm"]))
    bounds = np.cumsum(sizes)[:-1]
    arrays = {}
    for side, values in sides.items():
        arr = np.asarray(values, dtype=float)
        bad = ~((arr >= 0.0) & (arr <= 1.0))  # also catches NaN; JSON has no inf
        if bad.any():
            k = int(np.argmax(bad))
            i = int(np.searchsorted(bounds, k, side="right"))
            j = k - (int(bounds[i - 1]) if i else 0)
            raise ValueError(f"groups[{i}].{side}[{j}] = {float(arr[k])!r}: rewards must be finite numbers in [0, 1]")
        arrays[side] = np.round(arr, DECIMALS)
    ends = np.cumsum(sizes).tolist()
    starts = [0, *ends[:-1]]
    wm, env = arrays["wm"], arrays["env"]
    return [(wm[a:b], env[a:b]) for a, b in zip(starts, ends)]


def batch_digest(trainer: str, batch: str) -> str:
    return hashlib.blake2b(f"{trainer}\0{batch}".encode(), digest_size=8).hexdigest()


class CalibrationState:
    """The shared calibration. Not thread-safe: a store serialises access to it."""

    def __init__(self, config: CalibrationConfig = CalibrationConfig()):
        self.config = config
        self.debiaser = OnlineDebiaser(config.bins, config.min_pairs, config.refit_every, config.buffer_size)
        self.weighter = DisagreementWeighter(config.target_weight, config.max_weight, config.half_life, config.warmup)
        self.version = 0
        self.pairs_seen = 0
        self.pairs_evicted = 0
        self.groups_seen = 0
        self.groups_skipped = 0
        self.batches = 0
        self.recent: dict[str, list[str]] = {}

    # ---- folding observations
    def seen(self, trainer: str, batch: str) -> bool:
        return batch_digest(trainer, batch) in self.recent.get(trainer, ())

    def observe(self, trainer: str, batch: str, groups: Any) -> bool:
        """Fold one batch of anchor groups in. ``False`` (state unchanged) when it was already applied.

        Everything is validated before anything changes: on ``ValueError`` the state is untouched.
        """
        _check_id(trainer, "trainer")
        _check_id(batch, "batch")
        return self.observe_validated(trainer, batch, validate_groups(groups))

    def observe_validated(self, trainer: str, batch: str, pairs: list[tuple[np.ndarray, np.ndarray]]) -> bool:
        """:meth:`observe` for ids and ``validate_groups`` output already checked (the service's path)."""
        if self.seen(trainer, batch):
            self._touch(trainer)
            return False
        sizes = [len(wm) for wm, _ in pairs]
        self._fold(np.concatenate([wm for wm, _ in pairs]), np.concatenate([env for _, env in pairs]), sizes)
        self.batches += 1
        self.version += 1
        self._remember(trainer, batch_digest(trainer, batch))
        return True

    def _fold(self, wm: np.ndarray, env: np.ndarray, sizes: list[int]) -> None:
        """Fold consecutive groups in, exactly as one ``observe_group`` + disagreement after another.

        The disagreement is measured on the world-model rewards the trainers use: calibrated
        (``config.debiasing_enabled``) or raw.

        Vectorised between refits: the map only changes at the group boundary where a
        refit falls due, so the groups before it are pushed in one go and measured with
        the map they saw; the group that triggered the refit is measured with the new map.
        """
        deb, offsets = self.debiaser, np.concatenate([[0], np.cumsum(sizes)])
        i = 0
        while i < len(sizes):
            since, length, j = deb.since_fit, len(deb), i
            while True:  # the first group whose push makes a refit due (or the last one)
                since += sizes[j]
                length = min(length + sizes[j], deb.buffer_size)
                due = length >= deb.min_pairs and since >= deb.refit_every
                if due or j == len(sizes) - 1:
                    break
                j += 1
            a, b = int(offsets[i]), int(offsets[j + 1])
            self.pairs_evicted += deb.append_groups(wm[a:b], env[a:b], sizes[i:j + 1])
            before = deb.map
            refitted = due and deb.refit()
            if not self.config.debiasing_enabled:  # trainers train on raw WM rewards: measure those
                used = wm[a:b]
            else:  # trainers train on calibrated WM rewards: measure those, with the map each group saw
                used = wm[a:b].copy() if before is None else np.interp(wm[a:b], before.x, before.y)
                if refitted:
                    last = int(offsets[j])
                    used[last - a:] = np.interp(wm[last:b], deb.map.x, deb.map.y)
            s2 = disagreements_of_groups(used, env[a:b], np.asarray(sizes[i:j + 1]))
            for value in s2.tolist():
                if value != value:  # NaN: degenerate group, skipped
                    self.groups_skipped += 1
                else:
                    self.weighter.push(value)
            self.pairs_seen += b - a
            self.groups_seen += j + 1 - i
            i = j + 1

    def _touch(self, trainer: str) -> None:
        self.recent[trainer] = self.recent.pop(trainer)

    def _remember(self, trainer: str, digest: str) -> None:
        ids = self.recent.pop(trainer, [])
        ids.append(digest)
        self.recent[trainer] = ids[-RECENT_BATCHES:]
        while len(self.recent) > RECENT_TRAINERS:
            del self.recent[next(iter(self.recent))]

    # ---- reading
    @property
    def map(self) -> Optional[CalibrationMap]:
        return self.debiaser.map

    @property
    def weight(self) -> float:
        return self.weighter.weight

    def calibrate(self, values: Any) -> np.ndarray:
        return self.debiaser.calibrate(values)

    def view(self) -> dict[str, Any]:
        """What ``GET /v1/calibration`` returns."""
        bias = self.debiaser.bias
        return {
            "version": self.version,
            "pairs": len(self.debiaser),
            "pairsSeen": self.pairs_seen,
            "pairsEvicted": self.pairs_evicted,
            "groupsSeen": self.groups_seen,
            "groupsSkipped": self.groups_skipped,
            "batches": self.batches,
            "fits": self.debiaser.fits,
            "map": None if self.map is None else self.map.to_json(),
            "disagreement": self.weighter.disagreement,
            "constant": self.weighter.constant,
            "weight": self.weight,
            "bias": None if bias is None else dict(zip(("before", "after", "reduction"), bias)),
            "config": self.config.to_json(),
        }

    # ---- persistence
    def copy(self) -> "CalibrationState":
        other = copy.copy(self)
        other.debiaser = self.debiaser.copy()
        other.weighter = copy.copy(self.weighter)
        other.recent = {k: list(v) for k, v in self.recent.items()}
        return other

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "config": self.config.to_json(),
            "version": self.version,
            "counters": {"pairsSeen": self.pairs_seen, "pairsEvicted": self.pairs_evicted,
                         "groupsSeen": self.groups_seen, "groupsSkipped": self.groups_skipped,
                         "batches": self.batches},
            "debiasing": _micro_buffer(self.debiaser.state_dict()),
            "denoising": self.weighter.state_dict(),
            "recentBatches": self.recent,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, data: Any) -> "CalibrationState":
        """Rebuild from :meth:`to_json`; ``StateError`` saying what is wrong otherwise."""
        try:
            if not isinstance(data, Mapping) or data.get("format") != FORMAT:
                raise ValueError(f"not a calibration state of format {FORMAT}")
            state = cls(CalibrationConfig.from_json(data["config"]))
            state.version = int(data["version"])
            counters = data["counters"]
            state.pairs_seen, state.pairs_evicted = int(counters["pairsSeen"]), int(counters["pairsEvicted"])
            state.groups_seen, state.groups_skipped = int(counters["groupsSeen"]), int(counters["groupsSkipped"])
            state.batches = int(counters["batches"])
            state.debiaser.load_state_dict(_float_buffer(data["debiasing"]))
            state.weighter.load_state_dict(data["denoising"])
            recent = data["recentBatches"]
            if not isinstance(recent, Mapping) or not all(
                isinstance(v, list) and all(isinstance(d, str) for d in v) for v in recent.values()
            ):
                raise ValueError("recentBatches must map trainer ids to lists of digests")
            state.recent = {str(k): list(v) for k, v in recent.items()}
            return state
        except StateError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise StateError(f"invalid calibration state: {what}") from None

    @classmethod
    def loads(cls, text: str) -> "CalibrationState":
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise StateError(f"invalid calibration state: not JSON ({exc})") from None
        return cls.from_json(data)


def _micro_buffer(debiasing: dict) -> dict:
    """Buffer rewards as integers in millionths: exact (they are rounded on the way in) and fast to (de)serialise."""
    out = dict(debiasing)
    for side in ("wm", "env"):
        out[side] = np.rint(np.asarray(debiasing[side]) * 10**DECIMALS).astype(np.int64).tolist()
    return out


def _float_buffer(debiasing: Any) -> dict:
    out = dict(debiasing)
    for side in ("wm", "env"):
        values = debiasing[side]
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(f"debiasing.{side} must be a list of integers (millionths)")
        out[side] = np.asarray(values, dtype=np.int64) / 10**DECIMALS
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")

