"""Few-shot files: real outcomes a prompted world model is shown (``spec.worldModel.fewShot``).

A few-shot file is JSON lines, one :class:`wmrl.api.schema.FewShotExample` a line in its
camelCase wire form (the same objects ``spec.worldModel.fewShot.examples`` holds inline), as
``wmrl eval world-model --few-shot`` writes it. :func:`read_examples` refuses a bad line naming
the file, the line and the field; :func:`examples_of` gives the examples of a spec, read from its
file or inline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from wmrl.api.schema import FEW_SHOT_MAX_EXAMPLES, FewShotExample, field_errors
from wmrl_trainer.json_lines import json_lines


class FewShotFormatError(ValueError):
    """A few-shot file that cannot be used; the message names the file, line and field."""


def read_examples(path: str | Path, where: str = "") -> list[FewShotExample]:
    """The examples of a few-shot file (``where``: the setting that named it, for messages)."""
    label = f"{where}: {path}" if where else str(path)
    examples = []
    for n, data in json_lines(path, label, FewShotFormatError):
        if not isinstance(data, dict):
            raise FewShotFormatError(f"{label}:{n}: an example is a JSON object, got {type(data).__name__}")
        try:
            examples.append(FewShotExample.model_validate(data))
        except ValidationError as exc:
            raise FewShotFormatError(f"{label}:{n}: " + "; ".join(_messages(exc))) from exc
    if not examples:
        raise FewShotFormatError(f"{label}: no examples in it")
    if len(examples) > FEW_SHOT_MAX_EXAMPLES:
        raise FewShotFormatError(f"{label}: {len(examples)} examples, at most {FEW_SHOT_MAX_EXAMPLES}")
    return examples


def _messages(exc: ValidationError) -> list[str]:
    return [line.removeprefix("spec.") for line in field_errors(exc)]


def write_examples(path: str | Path, examples: Sequence[FewShotExample]) -> Path:
    """Write ``examples`` as a few-shot file (one camelCase JSON object a line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e.to_wire(), ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
    return path


def examples_of(few_shot: Any) -> list[FewShotExample]:
    """The examples ``spec.worldModel.fewShot`` names: its file's, or its inline ones ([] when neither is set)."""
    if few_shot is None:
        return []
    if few_shot.path:
        return read_examples(few_shot.path, "spec.worldModel.fewShot.path")
    return list(few_shot.examples)
