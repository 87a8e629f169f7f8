"""The two prompts of a WMRL run: the policy's task prompt and the world model's outcome prompt.

The world-model prompt shows the trajectory so far (earlier scripts and what the agent
saw after each) and the current script, and asks for the top-k outcome predictions of the
current script, each with a different status, as JSON matching :func:`outcome_json_schema`
(the shared outcome schema of :mod:`wmrl.outcome`): a short reason first, then a status on
the reward ladder, the error type and line for failures, a quality bucket for valid runs
(never a numeric score) and an imitation of the sandbox's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from wmrl import competition_text, data_overview
from wmrl.api.schema import FewShotExample
from wmrl.collection_tasks import CollectionTask
from wmrl.outcome import QualityBucket, Status
from wmrl.tasks import Task
from wmrl_sandbox import libraries
from wmrl_trainer.observation import REVISE_REQUEST

SANDBOX_LIMITS = f"Python 3 with {libraries.prompt_line()} (no internet), one CPU core, a few minutes"
"""What a script may use: the libraries the sandbox image really installs (its pinned requirements)."""

_OVERVIEWS: dict[str, str] = {}


@dataclass(frozen=True)
class PromptTask(Task):
    """A task as the prompts show it, without its data: rebuilt from :func:`task_context` (a fidelity case
    carries one), it gives the same world-model prompt as the task it was taken from, collection tasks
    included (their contract and metric text are kept as rendered)."""

    contract: str = ""
    metric_text: str = ""
    lower_is_better: bool = False

    @property
    def higher_is_better(self) -> bool:
        return not self.lower_is_better


def task_context(task: Task) -> dict[str, Any]:
    """What the prompts need of ``task``, JSON-able (:func:`context_task` is the inverse)."""
    return {"name": task.name, "kind": task.kind, "metric": task.metric, "metric_text": _metric(task),
            "description": _description(task), "contract": _contract(task), "target": task.target,
            "id_column": task.id_column, "submission": task.submission, "leaderboard": list(task.leaderboard),
            "higher_is_better": bool(task.higher_is_better)}


CONTEXT_FIELDS = {"name": str, "kind": str, "metric": str, "metric_text": str, "description": str, "contract": str,
                  "target": str, "id_column": str, "submission": str, "leaderboard": list, "higher_is_better": bool}
"""The keys of :func:`task_context` and their JSON types."""


def context_task(context: dict[str, Any]) -> PromptTask:
    """The :class:`PromptTask` of a :func:`task_context` (its keys checked by the caller)."""
    return PromptTask(name=context["name"], description=context["description"], kind=context["kind"],
                      metric=context["metric"], target=context["target"], id_column=context["id_column"],
                      submission=context["submission"], leaderboard=tuple(float(x) for x in context["leaderboard"]),
                      contract=context["contract"], metric_text=context["metric_text"],
                      lower_is_better=not context["higher_is_better"])


def data_overview_text(task: CollectionTask) -> str:
    """The overview of a collection task's public data (:mod:`wmrl.data_overview`), built once per directory."""
    key = str(task.public_dir)
    if key not in _OVERVIEWS:
        _OVERVIEWS[key] = data_overview.overview(task.public_dir, task.sample_submission_path)
    return _OVERVIEWS[key]


def _description(task: Task) -> str:
    """A collection task's description without what no script needs, its Evaluation section whole."""
    return competition_text.condense(task.description) if isinstance(task, CollectionTask) else task.description


def _metric(task: Task) -> str:
    if isinstance(task, PromptTask):
        return task.metric_text
    if isinstance(task, CollectionTask):
        name = task.metric if task.grader.kind == "builtin" else "the competition's metric (see its evaluation)"
        return f"{name}, {'higher' if task.higher_is_better else 'lower'} is better"
    return task.metric


def _collection_contract(task: CollectionTask) -> str:
    columns = ",".join((task.id_column, *task.submission_columns))
    return (f"The competition's public files are in data/ (relative to the working directory, read-only):\n"
            f"{data_overview_text(task)}\n"
            f"Write `{task.submission}` in the working directory in the sample submission's format: header "
            f"`{columns}` and one row per test id.")


def _columns(task: Task) -> tuple[str, str]:
    """The header lines of train.csv and test.csv, for the prompt (empty if the files are not CSV)."""
    def header(name: str) -> str:
        content = task.data.get(name, b"")
        return content.split(b"\n", 1)[0].decode("utf-8", "replace").strip() if content else ""
    return header("train.csv"), header("test.csv")


def _contract(task: Task) -> str:
    if isinstance(task, PromptTask):
        return task.contract
    if isinstance(task, CollectionTask):
        return _collection_contract(task)
    train, test = _columns(task)
    files = "\n".join(f"- data/{name}" + (f" (columns: {h})" if h else "")
                      for name, h in (("train.csv", train), ("test.csv", test)) if name in task.data)
    others = sorted(set(task.data) - {"train.csv", "test.csv"})
    files += "".join(f"\n- data/{name}" for name in others)
    return (f"Files (relative to the working directory):\n{files}\n"
            f"Write `{task.submission}` in the working directory with header `{task.id_column},{task.target}` "
            f"and one row per test id.")


def task_prompt(task: Task) -> str:
    """The policy's prompt: the task, its data contract, and a request for one complete script.

    A collection task's (MLE-bench, MLE-Dojo, DSBench) holds its description (Evaluation kept), an
    overview of its public data (files, columns and types, rows, the sample submission; capped at
    :data:`wmrl.data_overview.MAX_TOKENS`) and its paths; every prompt names the libraries the
    sandbox image installs."""
    if isinstance(task, CollectionTask):
        return (
            f"You are competing in the machine-learning competition '{task.name}'.\n"
            f"{_description(task)}\n\n"
            f"{_contract(task)}\n"
            f"Your script runs in a sandbox: {SANDBOX_LIMITS}.\n"
            f"The score is {_metric(task)}, on the hidden test answers; a better score ranks higher on the "
            "leaderboard.\n\n"
            "Reply with one complete Python script in a single ```python code block."
        )
    return (
        f"You are competing in the machine-learning task '{task.name}' ({task.kind}).\n"
        f"{task.description}\n\n"
        f"{_contract(task)}\n"
        f"Your script runs in a sandbox: {SANDBOX_LIMITS}. Read the CSV files with pandas or numpy.\n"
        f"The score is {task.metric} on the hidden test labels; a better score ranks higher on the leaderboard.\n\n"
        "Reply with one complete Python script in a single ```python code block."
    )


REASON_CHARS = 300
"""Cap on a prediction's ``reason`` (guided decoding enforces it; the reason is never used as feedback)."""
ENV_FEEDBACK_CHARS = 420
"""Cap on a prediction's ``env_feedback`` (guided decoding enforces it, parsing truncates unguided answers)."""


def outcome_json_schema(predictions: int = 2) -> dict[str, Any]:
    """JSON schema of the world model's answer: 1..``predictions`` outcome predictions, most likely first.

    Each prediction opens with a short ``reason`` (as in the reference implementation: the
    model states why before it commits to a status), then the outcome fields.
    """
    nullable = lambda schema: {"anyOf": [schema, {"type": "null"}]}  # noqa: E731
    item = {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": REASON_CHARS},
            "status": {"type": "string", "enum": [s.value for s in Status]},
            "error_type": nullable({"type": "string"}),
            "error_line": nullable({"type": "integer", "minimum": 0}),
            "quality_bucket": nullable({"type": "string", "enum": [b.value for b in QualityBucket]}),
            "env_feedback": {"type": "string", "maxLength": ENV_FEEDBACK_CHARS},
        },
        "required": ["reason", "status", "error_type", "error_line", "quality_bucket", "env_feedback"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"predictions": {"type": "array", "items": item, "minItems": 1, "maxItems": predictions}},
        "required": ["predictions"],
        "additionalProperties": False,
    }


_WM_SYSTEM = (
    "You simulate the execution environment of machine-learning competitions. Given a task and a "
    "candidate solution script, predict what happens when the script runs in the sandbox and is graded. "
    "Answer with JSON only."
)

_STATUS_GUIDE = f"""Statuses:
- malformed: not a Python program, or cut off mid-way
- syntax_err: Python cannot compile it (give error_type and error_line)
- runtime_err: it starts but raises, or exceeds the limits (give error_type and error_line)
- ran_no_sub: it finishes but writes no valid submission (missing file, wrong header, wrong ids)
- valid: it writes a valid submission; give quality_bucket
Quality buckets, relative to the reference leaderboard of the task:
- low: no better than a trivial baseline
- fair: works but below most reference solutions
- mid: around the median reference solution
- high: among the best reference solutions
reason: first, in one or two short sentences (at most {REASON_CHARS} characters), why the script ends that way.
env_feedback imitates what the sandbox would print (stdout, a traceback, or the grader's note), \
at most {ENV_FEEDBACK_CHARS} characters."""

History = Sequence[tuple[str, str]]
"""A trajectory's earlier turns, oldest first: (script, observation) pairs, where the observation is the
text the agent was shown after that turn (:func:`wmrl_trainer.observation.observation_text`)."""


def _numbered(code: str) -> str:
    lines = code.splitlines() or [""]
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, start=1))


def _seen(observation: str) -> str:
    """An earlier observation as the world model reads it: without its request for the next turn."""
    return observation.replace(REVISE_REQUEST, "").strip()


def _history_block(history: History) -> str:
    """The trajectory so far, compactly: each earlier script (no line numbers) and what the agent saw after it."""
    if not history:
        return ""
    parts = ["Earlier attempts in this trajectory, oldest first (the agent saw each attempt's result before "
             "writing the next one):"]
    for n, (code, observation) in enumerate(history, start=1):
        parts.append(f"Attempt {n} script:\n```\n{code.rstrip()}\n```\n"
                     f"What the agent saw after attempt {n}:\n{_seen(observation) or '(nothing)'}")
    return "\n\n".join(parts) + "\n\n"


def example_reason(example: FewShotExample) -> str:
    """The example answer's reason: the example's own, else one written from its outcome."""
    if example.reason:
        return example.reason
    where = f" at line {example.error_line}" if example.error_line else ""
    return {
        "malformed": "The text is not a complete Python program.",
        "syntax_err": f"Python cannot compile it: {example.error_type or 'SyntaxError'}{where}.",
        "runtime_err": f"It raised {example.error_type or 'an exception'}{where} when it ran.",
        "ran_no_sub": "It ran to the end but wrote no valid submission.",
        "valid": f"It wrote a valid submission of {example.quality_bucket} quality against the reference solutions.",
    }[example.status]


def example_answer(example: FewShotExample) -> str:
    """The JSON answer a world model should have given for ``example``: its real outcome as one prediction."""
    return json.dumps({"predictions": [{
        "reason": example_reason(example), "status": example.status,
        "error_type": example.error_type if example.status != "valid" else None,
        "error_line": example.error_line if example.status != "valid" else None,
        "quality_bucket": example.quality_bucket, "env_feedback": example.feedback[:ENV_FEEDBACK_CHARS]}]})


def _examples_block(examples: Sequence[FewShotExample]) -> str:
    """Real outcomes of earlier scripts in this sandbox (few-shot), each with the answer it called for."""
    if not examples:
        return ""
    parts = ["Examples: scripts that really ran in this sandbox (on this or other tasks) and the answer each called "
             "for, given as one prediction of its real outcome:"]
    for n, example in enumerate(examples, start=1):
        parts.append(f"Example {n} (task '{example.task}'):\n```\n{example.code.rstrip()}\n```\n"
                     f"Answer: {example_answer(example)}")
    return "\n\n".join(parts) + "\n\n"


def _request(predictions: int) -> str:
    if predictions == 2:
        distinct = " Prediction 2 must have a different status from prediction 1: the most likely alternative."
    elif predictions > 2:
        distinct = (" Each prediction must have a different status from every prediction before it: the most likely "
                    "alternatives.")
    else:
        distinct = ""
    return (f"Give your {predictions} most likely outcomes, most likely first, as JSON.{distinct} "
            'Format: {"predictions": [{"reason": ..., "status": ..., "error_type": ... or null, '
            '"error_line": ... or null, "quality_bucket": ... or null, "env_feedback": ...}]}')


def world_model_messages(task: Task, code: str, predictions: int = 2, history: History = (),
                         examples: Sequence[FewShotExample] = ()) -> list[dict[str, str]]:
    """Chat messages asking for the top-``predictions`` outcome predictions of ``code`` on ``task``.

    ``history``: the trajectory's earlier turns (see :data:`History`), shown before the current
    script, which comes last and is the one to predict; empty for a first turn. ``examples``:
    real outcomes (``spec.worldModel.fewShot``), shown after the task and before the trajectory.
    """
    board = sorted(task.leaderboard)
    board_line = (f"Reference solutions score {_metric(task).split(',')[0]} from {board[0]:.4g} to {board[-1]:.4g} "
                  f"({'higher' if task.higher_is_better else 'lower'} is better).\n") if board else ""
    history = tuple(history)
    current = (f"Current script, attempt {len(history) + 1}: predict its outcome (line numbers added for reference)"
               if history else "Solution script (line numbers added for reference)")
    user = (
        f"Task '{task.name}' ({task.kind}): {_description(task)}\n"
        f"{_contract(task)}\n"
        f"Sandbox: {SANDBOX_LIMITS}.\n{board_line}\n"
        f"{_examples_block(examples)}"
        f"{_history_block(history)}"
        f"{current}:\n```\n{_numbered(code)}\n```\n\n"
        f"{_STATUS_GUIDE}\n\n"
        f"{_request(predictions)}"
    )
    return [{"role": "system", "content": _WM_SYSTEM}, {"role": "user", "content": user}]


def world_model_prompt(task: Task, code: str, predictions: int = 2, history: History = (),
                       examples: Sequence[FewShotExample] = ()) -> str:
    """The same request as one plain-text prompt, for models without a chat template."""
    messages = world_model_messages(task, code, predictions, history, examples)
    return "\n\n".join(m["content"] for m in messages) + "\n\nJSON answer:\n"
