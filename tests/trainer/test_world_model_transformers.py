"""The transformers backend: a tiny random model built from a config (its answers are garbage ->
ungraded), and scripted generation to exercise the parsing path with the real prompt rendering.
"""

import json

import pytest

from wmrl.api.schema import WorldModelSpec
from wmrl.outcome import QualityBucket, Status
from wmrl.tasks import Task
from wmrl_trainer.policy import build_tiny_model, build_tiny_tokenizer, save_tiny_model
from wmrl_trainer.world_model import build_world_model
from wmrl_trainer.world_model.transformers_backend import TransformersWorldModel

TASK = Task(name="toy", description="Regression: toy rows. Metric: rmse.", kind="regression", metric="rmse",
            target="target", data={"train.csv": b"id,f0,target\n0,1,2.5\n", "test.csv": b"id,f0\n1,3\n"},
            hidden_labels=b"id,target\n1,2\n", leaderboard=(1.0, 2.0))
CODE = "import numpy as np\nx = np.zeros(3)\nprint(x.sum())\n"


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, seed=0), tokenizer


def test_random_tiny_model_answers_garbage_which_is_ungraded(tiny):
    model, tokenizer = tiny
    wm = TransformersWorldModel(model, tokenizer, max_new_tokens=12, batch_size=2)
    outs = wm.grade([(TASK, CODE), (TASK, CODE + "print(1)\n"), (TASK, "def broken(:\n    pass\n")])
    assert outs[:2] == [None, None]  # never a silent zero
    assert outs[2].status is Status.SYNTAX_ERR and outs[2].reward == 0.0
    assert wm.stats["ungraded"] == 2 and wm.stats["unparsable"] == 2 and wm.stats["gated"] == 1


def test_scripted_generation_goes_through_rendering_and_parsing(tiny):
    _, tokenizer = tiny
    seen = []

    def generate(prompts):  # stands in for model.generate only: prompts are the real rendered ones
        seen.extend(prompts)
        return ["Sure.\n" + json.dumps({"predictions": [
            {"status": "valid", "error_type": None, "error_line": None, "quality_bucket": "mid",
             "env_feedback": "rmse 1.4"},
            {"status": "runtime_err", "error_type": "ValueError", "error_line": 2, "quality_bucket": None,
             "env_feedback": "ValueError"}]}) if "x.sum()" in p else "no idea" for p in prompts]

    wm = TransformersWorldModel(tokenizer=tokenizer, generate=generate, batch_size=2)
    outs = wm.grade([(TASK, CODE), (TASK, "print('other')\n"), (TASK, CODE)])
    assert outs[0].status is Status.VALID and outs[0].quality_bucket is QualityBucket.MID
    assert outs[0].feedback == "rmse 1.4" and outs[0].reward == pytest.approx(0.725)
    assert outs[1] is None and outs[2] == outs[0]
    assert len(seen) == 3 and all(p.startswith("<|system|>") and p.endswith("<|assistant|>\n") for p in seen)
    assert "3 | print(x.sum())" in seen[0]


def test_build_from_spec_loads_a_saved_model(tmp_path):
    path = save_tiny_model(tmp_path / "wm")
    spec = WorldModelSpec(backend="transformers", model=str(path), sampling={"maxTokens": 8})
    wm = build_world_model(spec, None)
    assert isinstance(wm, TransformersWorldModel) and wm.sampling["max_new_tokens"] == 8
    assert wm.grade([(TASK, CODE)]) == [None]
    with pytest.raises(ValueError, match="spec.worldModel.model"):
        build_world_model(WorldModelSpec(backend="transformers"), None)


def test_needs_a_model_or_a_generate_function():
    with pytest.raises(ValueError, match="model and a tokenizer"):
        TransformersWorldModel()


class RecordingTokenizer:
    """A tokenizer with a chat template that records what it is asked to render."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        return messages[-1]["content"]


@pytest.mark.parametrize("enable", [None, True, False])
def test_thinking_reaches_the_chat_template_only_when_set(enable):
    tok = RecordingTokenizer()
    wm = TransformersWorldModel(tokenizer=tok, generate=lambda prompts: ["{}"] * len(prompts), enable_thinking=enable)
    assert wm.grade([(TASK, CODE)]) == [None]
    [(_, kwargs)] = tok.calls
    assert kwargs.get("enable_thinking", "unset") == ("unset" if enable is None else enable)
    assert kwargs["add_generation_prompt"] is True


def test_the_prompt_carries_the_trajectory_so_far(tiny):
    _, tokenizer = tiny
    seen = []
    wm = TransformersWorldModel(tokenizer=tokenizer, generate=lambda prompts: seen.extend(prompts) or ["no"] * len(prompts))
    history = (("import numpy as np\nraise KeyError('y')\n", "[execution] status=runtime_err error=KeyError"),)
    wm.grade([(TASK, CODE, history), (TASK, CODE)])
    assert "raise KeyError('y')" in seen[0] and "status=runtime_err error=KeyError" in seen[0]
    assert seen[0].index("raise KeyError('y')") < seen[0].index("3 | print(x.sum())")
    assert "Earlier attempts" not in seen[1]
    plain = TransformersWorldModel(generate=lambda prompts: seen.extend(prompts) or ["no"] * len(prompts))
    plain.grade([(TASK, CODE, history)])
    assert "raise KeyError('y')" in seen[-1] and seen[-1].endswith("JSON answer:\n")


def test_spec_sets_thinking_and_presence_penalty_is_not_sampled(tmp_path):
    path = save_tiny_model(tmp_path / "wm")
    spec = WorldModelSpec(backend="transformers", model=str(path), enableThinking=False,
                          sampling={"maxTokens": 8, "presencePenalty": 1.5})
    wm = build_world_model(spec, None)
    assert wm.enable_thinking is False and "presence_penalty" not in wm.sampling  # generate() has no such knob
