"""Few-shot examples (spec.worldModel.fewShot): where they go in the prompt, the file format, both prompted
backends get them, bad input is refused naming the field; and their curation from real cases."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fidelity_cases import CASES, TASK, case_lines
from wmrl.api.schema import FewShotExample, WorldModelSpec, parse_spec
from wmrl_trainer.few_shot import FewShotFormatError, examples_of, read_examples, write_examples
from wmrl_trainer.fidelity.cases import parse_case
from wmrl_trainer.fidelity.curate import curate
from wmrl_trainer.prompts import world_model_messages
from wmrl_trainer.world_model import build_world_model
from wmrl_trainer.world_model.transformers_backend import TransformersWorldModel

HISTORY = (("import pandas as pd\nprint(pd.read_csv('train.csv'))\n", "FileNotFoundError: train.csv"),)

EXAMPLES = [
    FewShotExample(task="toy", code="print(undefined)\n", status="runtime_err", error_type="NameError", error_line=1,
                   feedback="NameError: name 'undefined' is not defined"),
    FewShotExample(task="other", code="print(1)\n", status="valid", quality_bucket="high", feedback="ok",
                   reason="It wrote the best submission."),
]


def test_examples_go_in_the_prompt_after_the_task_and_before_the_trajectory():
    code, _, _ = CASES["forest"]
    text = world_model_messages(TASK, code, 2, HISTORY, EXAMPLES)[1]["content"]
    plain = world_model_messages(TASK, code, 2, HISTORY)[1]["content"]
    assert "Example" not in plain
    block = text.index("Example 1 (task 'toy')")
    assert text.index("Reference solutions score") < block < text.index("Attempt 1 script") < text.index(code.splitlines()[0])
    answer = json.loads(text[text.index("Answer: ", block) + 8:].split("\n", 1)[0])
    assert answer == {"predictions": [{"reason": "It raised NameError at line 1 when it ran.", "status": "runtime_err",
                                       "error_type": "NameError", "error_line": 1, "quality_bucket": None,
                                       "env_feedback": "NameError: name 'undefined' is not defined"}]}
    assert "It wrote the best submission." in text and "Example 2 (task 'other')" in text
    assert text.replace(text[text.index("Examples: scripts"):text.index("Earlier attempts")], "") == plain


def test_both_prompted_backends_get_the_specs_examples_from_a_file_or_inline(tmp_path):
    path = write_examples(tmp_path / "few-shot.jsonl", EXAMPLES)
    assert read_examples(path) == EXAMPLES
    from_file = WorldModelSpec.model_validate({"backend": "transformers", "model": "x", "fewShot": {"path": str(path)}})
    inline = WorldModelSpec.model_validate({"backend": "llm", "endpoint": "http://127.0.0.1:9/v1",
                                            "fewShot": {"examples": [e.to_wire() for e in EXAMPLES]}})
    assert examples_of(from_file.few_shot) == examples_of(inline.few_shot) == EXAMPLES
    wm = build_world_model(inline)
    try:
        assert wm.few_shot == tuple(EXAMPLES)
    finally:
        wm.close()
    generated = TransformersWorldModel(generate=lambda prompts: ["{}"] * len(prompts), few_shot=EXAMPLES)
    assert "Example 2 (task 'other')" in generated.render((TASK, "print(2)\n"))


def test_bad_few_shot_input_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValidationError, match="the learned backend has no prompt"):
        parse_spec({"policy": {"model": "m"}, "tasks": {"builtin": "mini-ml"},
                    "worldModel": {"backend": "learned", "fewShot": {"examples": [EXAMPLES[0].to_wire()]}}})
    with pytest.raises(ValidationError, match="set path or examples, not both"):
        WorldModelSpec.model_validate({"fewShot": {"path": "x", "examples": [EXAMPLES[0].to_wire()]}})
    with pytest.raises(ValidationError, match="qualityBucket: a valid example needs"):
        FewShotExample.model_validate({"task": "t", "code": "x", "status": "valid"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(EXAMPLES[0].to_wire()) + "\n" + json.dumps({"task": "t", "code": "x", "status": "ok"}) + "\n")
    with pytest.raises(FewShotFormatError, match=r"bad.jsonl:2: status: Input should be"):
        read_examples(bad)
    spec = WorldModelSpec.model_validate({"backend": "llm", "endpoint": "http://127.0.0.1:9/v1",
                                          "fewShot": {"path": str(tmp_path / "missing.jsonl")}})
    with pytest.raises(FewShotFormatError, match="spec.worldModel.fewShot.path: .*missing.jsonl: cannot read it"):
        build_world_model(spec)


def test_curation_picks_one_example_per_failure_kind_and_the_lowest_and_highest_valid_run():
    cases = [parse_case(line, f"mem:{n}") for n, line in enumerate(case_lines(), start=1)]
    picked = curate(cases)
    assert [e.kind for _, e in picked] == ["ran_no_sub", "runtime_err:KeyError", "runtime_err:NameError", "valid-low",
                                           "valid-high"]
    assert [c.source["name"] for c, _ in picked] == ["nosub", "key", "name", "knn", "forest"]
    assert picked[1][1].feedback == "KeyError: 'f9'" and picked[1][1].error_line == 7
    assert [e.kind for _, e in curate(cases, max_examples=3)] == ["ran_no_sub", "valid-low", "valid-high"]
    # The picks depend on the cases, not their order (kinds by frequency, then name; the shortest script).
    assert sorted(c.source["name"] for c, _ in curate(list(reversed(cases)))) == sorted(c.source["name"] for c, _ in picked)
    with pytest.raises(ValueError):
        curate(cases, max_examples=0)
