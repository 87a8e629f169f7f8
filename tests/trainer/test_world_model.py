"""Compile gate, answer parsing, prompts, and the llm backend against a real local HTTP server.

The server is a real aiohttp app on 127.0.0.1 speaking the OpenAI chat-completions protocol
(``/v1/models``, ``/v1/chat/completions``); each test scripts what it answers. It answers the
client's structured-output probe as a constraining server would, under the modes in
``constrains``; tests/vllm_cpu runs the same client against a real vLLM.
"""

import asyncio
import json
import threading

import pytest
from aiohttp import web

from wmrl.api.runconfig import Runtime
from wmrl.api.schema import WorldModelSpec
from wmrl.outcome import BUCKET_RANK_SCORE, QualityBucket, Status
from wmrl.tasks import Task
from wmrl_trainer.prompts import outcome_json_schema, task_prompt, world_model_messages, world_model_prompt
from wmrl_trainer.world_model import build_world_model, compile_gate, item_history, item_parts
from wmrl_trainer.world_model.learned import LearnedWorldModel
from wmrl_trainer.world_model.llm import PROBE_SCHEMA, PROBE_VALUE, LLMWorldModel, UnconstrainedServerError
from wmrl_trainer.world_model.parse import FEEDBACK_CHARS, outcome_from_text, outcomes_from_text

TASK = Task(name="toy", description="Binary classification: toy rows. Metric: accuracy.", kind="classification",
            metric="accuracy", target="target",
            data={"train.csv": b"id,f0,f1,target\n0,1,2,1\n", "test.csv": b"id,f0,f1\n1,3,4\n"},
            hidden_labels=b"id,target\n1,1\n", leaderboard=(0.5, 0.8, 0.9))
GOOD = "import numpy as np\nprint('hello')\n"


def answer(*preds):
    return json.dumps({"predictions": list(preds)})


def pred(status, bucket=None, error_type=None, line=None, feedback="out", reason="because"):
    out = {"reason": reason} if reason is not None else {}
    return {**out, "status": status, "error_type": error_type, "error_line": line, "quality_bucket": bucket,
            "env_feedback": feedback}


HISTORY = (("import numpy as np\nraise ValueError('first try')\n",
            "\n[execution] status=runtime_err error=ValueError where=other quality=none\n<output>\nValueError: first try\n"
            "</output>\n"),
           ("import numpy as np\nprint('second try')\n",
            "\n[execution] status=ran_no_sub error=none where=none quality=none\n<output>\nno submission.csv\n</output>\n"))


def guided_schema(body, modes):
    """The JSON schema a request asks for under one of ``modes`` (None: no such request form)."""
    if "response_format" in modes and "response_format" in body:
        return body["response_format"]["json_schema"]["schema"]
    if "structured_outputs" in modes and "structured_outputs" in body:
        return body["structured_outputs"]["json"]
    return None


class FakeOpenAI:
    """A real HTTP server; ``respond(body)`` returns ("answer", text) | ("status", code) | ("sleep", s, text).

    Probes (requests for the client's probe schema) are kept apart in ``probes``: answered with the
    one valid JSON under a mode in ``constrains``, HTTP 400 under a mode in ``rejects``, else with
    free text (a server that ignores the field); ``probe_status`` scripts an HTTP status instead."""

    def __init__(self):
        self.requests: list[dict] = []
        self.probes: list[dict] = []
        self.constrains = {"response_format", "structured_outputs"}
        self.rejects: set = set()
        self.probe_status = None
        self.respond = lambda body: ("answer", answer(pred("valid", "mid")))
        self.in_flight = self.max_in_flight = 0
        self.model_listings = 0

    async def _models(self, request):
        self.model_listings += 1
        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    def _reply(self, body, text):
        return web.json_response({
            "id": "cmpl-1", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        })

    async def _chat(self, request):
        body = await request.json()
        if PROBE_SCHEMA in (guided_schema(body, {"response_format", "structured_outputs"}),):
            self.probes.append(body)
            if self.probe_status == "garbage":
                return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
            if self.probe_status:
                return web.json_response({"error": "scripted failure"}, status=self.probe_status)
            if any(mode in body for mode in self.rejects):
                return web.json_response({"error": "unsupported"}, status=400)
            if guided_schema(body, self.constrains) == PROBE_SCHEMA:
                return self._reply(body, json.dumps({"probe": PROBE_VALUE}))
            return self._reply(body, "Hello! How can I help you today?")
        self.requests.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            action = self.respond(body)
            if action[0] == "sleep":
                await asyncio.sleep(action[1])
                action = ("answer", action[2])
            if action[0] == "status":
                return web.json_response({"error": "scripted failure"}, status=action[1])
            return self._reply(body, action[1])
        finally:
            self.in_flight -= 1

    def __enter__(self):
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def wm(server):
    model = LLMWorldModel(server.url, "wm-model", timeout=5, retries=2, backoff=0.01)
    yield model
    model.close()


# ------------------------------------------------------------------ compile gate

@pytest.mark.parametrize("code,status,line", [
    ("", Status.MALFORMED, None),
    ("   \n\t", Status.MALFORMED, None),
    ("Sure! Here is a solution that trains a forest", Status.MALFORMED, None),
    ("import numpy as np\nx = np.array([1,\n", Status.MALFORMED, None),  # cut off mid-expression
    ("x = 1\ny = = 2\nprint(x)\n", Status.SYNTAX_ERR, 2),
    ("def f():\nreturn 1\n", Status.SYNTAX_ERR, 2),
    ("x = 1\x00\n", Status.MALFORMED, None),
    ("import numpy as np\nx = np.array([1,\ny = 2\nz = 3\nw = 4\nprint(w)\n", Status.SYNTAX_ERR, 2),  # not cut off: lines follow
    ('x = 1\n"""a docstring that never ends\n', Status.MALFORMED, None),
    ("'just a docstring'\n", Status.MALFORMED, None),
])
def test_compile_gate_rejects_without_a_model(code, status, line):
    out = compile_gate(code)
    assert out is not None and out.status is status and out.reward == 0.0
    if line is not None:
        assert out.error_line == line and "line" in out.feedback


def test_compile_gate_passes_real_code():
    assert compile_gate(GOOD) is None
    assert compile_gate("def main():\n    return 1\n\nmain()\n") is None


def test_syntax_error_scores_zero_without_a_request(server, wm):
    outs = wm.grade([(TASK, "for i in range(3)\n    print(i)\n"), (TASK, "")])
    assert [o.reward for o in outs] == [0.0, 0.0]
    assert outs[0].status is Status.SYNTAX_ERR and outs[0].error_line == 1
    assert server.requests == []
    assert wm.stats["gated"] == 2


# ------------------------------------------------------------------ parsing

def test_parse_takes_the_top_prediction_and_maps_the_bucket():
    out = outcome_from_text(answer(pred("valid", "high", feedback="accuracy 0.93"), pred("runtime_err", None, "ValueError", 7)))
    assert out.status is Status.VALID and out.quality_bucket is QualityBucket.HIGH
    assert out.rank_score == BUCKET_RANK_SCORE[QualityBucket.HIGH] and out.feedback == "accuracy 0.93"
    assert out.reward == pytest.approx(0.5 + 0.5 * 0.75)


def test_parse_takes_the_first_well_formed_prediction_and_drops_repeated_statuses():
    text = answer(pred("valid", None), pred("ran_no_sub"), pred("runtime_err", None, "KeyError", 3),
                  pred("runtime_err", None, "IndexError", 9), pred("ran_no_sub", feedback="again"), pred("exploded"))
    # 'valid' has no bucket (ill-formed), 'exploded' is no status; the second runtime_err and ran_no_sub repeat
    # a status (the prompt asks for distinct alternatives): dropped, so they cannot outvote the first prediction.
    out = outcome_from_text(text)
    assert out.status is Status.RAN_NO_SUB and out.feedback == "out"
    assert [(o.status, o.error_type) for o in outcomes_from_text(text)] == [(Status.RAN_NO_SUB, None),
                                                                          (Status.RUNTIME_ERR, "KeyError")]
    # An ill-formed prediction does not block a later well-formed one with its status.
    assert outcome_from_text(answer(pred("valid", None), pred("valid", "mid"))).quality_bucket is QualityBucket.MID


def test_parse_accepts_answers_with_or_without_a_reason_and_caps_the_feedback():
    with_reason = outcome_from_text(answer(pred("runtime_err", None, "KeyError", 2, reason="target is not a column")))
    without = outcome_from_text(answer(pred("runtime_err", None, "KeyError", 2, reason=None)))
    assert with_reason == without and with_reason.error_type == "KeyError"
    assert outcome_from_text(answer(pred("valid", "mid", reason=None))).status is Status.VALID
    long = outcome_from_text(answer(pred("ran_no_sub", feedback="x" * 5000)))
    assert FEEDBACK_CHARS == 420 and long.feedback == "x" * 420


def test_parse_skips_a_reasoning_models_thoughts():
    text = 'Let me think: {"status": "valid"} is wrong here.</think>\n' + answer(pred("runtime_err", None, "OSError", 4))
    assert outcome_from_text(text).status is Status.RUNTIME_ERR


@pytest.mark.parametrize("text", [
    "I think it will run fine.", "{not json", '{"predictions": []}', '{"predictions": [{"status": "valid"}]}',
    '{"predictions": "valid"}', "",
])
def test_unusable_answers_are_ungraded(text):
    assert outcome_from_text(text) is None


def test_parse_finds_json_inside_prose_and_fences():
    text = "Here you go:\n```json\n" + answer(pred("ran_no_sub", feedback="no submission.csv")) + "\n```"
    out = outcome_from_text(text)
    assert out.status is Status.RAN_NO_SUB and out.reward == 0.2


# ------------------------------------------------------------------ prompts

def test_task_prompt_states_the_contract():
    text = task_prompt(TASK)
    for part in ("data/train.csv", "id,f0,f1,target", "data/test.csv", "submission.csv", "id,target", "accuracy",
                 "```python", TASK.description):
        assert part in text


def test_world_model_prompt_holds_task_code_and_schema_fields():
    messages = world_model_messages(TASK, GOOD, predictions=2)
    user = messages[-1]["content"]
    assert messages[0]["role"] == "system"
    assert "1 | import numpy as np" in user and "2 | print('hello')" in user
    for field in ("reason", "status", "error_type", "error_line", "quality_bucket", "env_feedback", "2 most likely",
                  "Prediction 2 must have a different status from prediction 1", "420 characters"):
        assert field in user
    assert "Earlier attempts" not in user
    assert "different status from every prediction" in world_model_messages(TASK, GOOD, predictions=3)[-1]["content"]
    assert "different status" not in world_model_messages(TASK, GOOD, predictions=1)[-1]["content"]


def test_outcome_schema_asks_for_a_short_reason_first_and_caps_the_feedback():
    schema = outcome_json_schema(2)
    assert schema["properties"]["predictions"]["maxItems"] == 2
    item = schema["properties"]["predictions"]["items"]
    assert list(item["properties"])[0] == "reason" and item["required"][0] == "reason"
    assert set(item["required"]) == set(item["properties"])
    assert item["properties"]["reason"] == {"type": "string", "maxLength": 300}
    assert item["properties"]["env_feedback"] == {"type": "string", "maxLength": 420}


def test_world_model_prompt_shows_the_trajectory_so_far_before_the_current_script():
    user = world_model_messages(TASK, GOOD, 2, HISTORY)[-1]["content"]
    first, second, current = (user.index("raise ValueError('first try')"), user.index("print('second try')"),
                              user.index("2 | print('hello')"))
    assert user.index("Earlier attempts in this trajectory") < first < second < current
    assert user.index("ValueError: first try") < second and user.index("no submission.csv") < current
    assert "Attempt 1 script" in user and "What the agent saw after attempt 2" in user and "attempt 3" in user
    assert "1 | import numpy as np\n2 | raise" not in user  # earlier scripts are not line-numbered
    plain = world_model_prompt(TASK, GOOD, 2, HISTORY)
    assert "print('second try')" in plain and plain.endswith("JSON answer:\n")
    assert world_model_messages(TASK, GOOD, 2, []) == world_model_messages(TASK, GOOD, 2)


def test_items_with_and_without_history():
    assert item_history((TASK, GOOD)) == () and item_history((TASK, GOOD, [])) == ()
    assert item_history((TASK, GOOD, list(map(list, HISTORY)))) == HISTORY
    assert item_parts((TASK, GOOD, HISTORY)) == (TASK, GOOD, HISTORY)
    with pytest.raises(ValueError, match="task, code"):
        item_history((TASK,))


def test_the_learned_backend_grades_items_with_history_like_plain_ones():
    wm = LearnedWorldModel(seed=0)
    plain = wm.grade([(TASK, GOOD), (TASK, "")])
    assert wm.grade([(TASK, GOOD, HISTORY), (TASK, "", HISTORY)]) == plain


# ------------------------------------------------------------------ llm backend

def test_valid_answer_and_the_request_carries_schema_and_sampling(server, wm):
    server.respond = lambda body: ("answer", answer(pred("valid", "high", feedback="wrote submission.csv"),
                                                    pred("runtime_err", None, "MemoryError", 4)))
    [out] = wm.grade([(TASK, GOOD)])
    assert out.status is Status.VALID and out.reward == pytest.approx(0.875) and out.feedback == "wrote submission.csv"
    [body] = server.requests
    assert body["model"] == "wm-model"
    assert (body["temperature"], body["top_p"], body["top_k"], body["presence_penalty"]) == (0.7, 0.8, 20, 1.0)
    assert "chat_template_kwargs" not in body  # the chat template's own thinking default
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == outcome_json_schema(2)
    assert "print('hello')" in body["messages"][-1]["content"]


@pytest.mark.parametrize("enable", [True, False])
def test_thinking_is_sent_only_when_the_spec_sets_it(server, enable):
    model = build_world_model(WorldModelSpec(backend="llm", endpoint=server.url, enableThinking=enable), None)
    try:
        model.grade([(TASK, GOOD)])
    finally:
        model.close()
    assert server.requests[-1]["chat_template_kwargs"] == {"enable_thinking": enable}


def test_the_request_carries_the_trajectory_so_far(server, wm):
    outs = wm.grade([(TASK, GOOD, HISTORY), (TASK, GOOD)])
    assert [o.status for o in outs] == [Status.VALID, Status.VALID]
    with_history, without = sorted((r["messages"][-1]["content"] for r in server.requests), key=len, reverse=True)
    assert "print('second try')" in with_history and "ValueError: first try" in with_history
    assert "Earlier attempts" not in without


def test_runtime_error_prediction_keeps_type_line_and_feedback(server, wm):
    tb = "Traceback (most recent call last):\n  File \"main.py\", line 2\nKeyError: 'target'"
    server.respond = lambda body: ("answer", answer(pred("runtime_err", None, "KeyError", 2, tb), pred("valid", "low")))
    [out] = wm.grade([(TASK, GOOD)])
    assert (out.status, out.error_type, out.error_line, out.feedback, out.reward) == (Status.RUNTIME_ERR, "KeyError", 2, tb, 0.1)


def test_malformed_answer_is_ungraded_not_zero(server, wm):
    server.respond = lambda body: ("answer", '{"predictions": [{"status": "valid", "quality_bu')
    assert wm.grade([(TASK, GOOD)]) == [None]
    assert wm.stats["unparsable"] == 1 and wm.stats["ungraded"] == 1


def test_server_errors_are_retried_then_succeed(server, wm):
    calls = []

    def respond(body):
        calls.append(1)
        return ("status", 503) if len(calls) <= 2 else ("answer", answer(pred("ran_no_sub")))
    server.respond = respond
    [out] = wm.grade([(TASK, GOOD)])
    assert out.status is Status.RAN_NO_SUB and len(server.requests) == 3 and wm.stats["retries"] == 2


def test_repeated_failure_is_ungraded(server, wm):
    server.respond = lambda body: ("status", 500)
    assert wm.grade([(TASK, GOOD)]) == [None]
    assert len(server.requests) == 3  # 1 + 2 retries
    assert wm.stats["failed"] == 1


def test_timeouts_are_retried_then_ungraded(server):
    model = LLMWorldModel(server.url, "m", timeout=0.2, retries=1, backoff=0.01)
    server.respond = lambda body: ("sleep", 1.0, answer(pred("valid", "mid")))
    try:
        assert model.grade([(TASK, GOOD)]) == [None]
    finally:
        model.close()
    assert len(server.requests) == 2 and model.stats["failed"] == 1


def test_client_errors_are_not_retried(server, wm):
    server.respond = lambda body: ("status", 404)
    assert wm.grade([(TASK, GOOD)]) == [None]
    assert len(server.requests) == 1 and wm.stats["http_error"] == 1


def test_guided_mode_is_probed_once_and_response_format_comes_first(server, wm):
    wm.grade([(TASK, GOOD)])
    wm.grade([(TASK, GOOD), (TASK, "print(1)\n")])
    assert len(server.probes) == 1 and "response_format" in server.probes[0]
    assert server.probes[0]["max_tokens"] == 64 and wm.guided == "response_format"
    assert all(r["response_format"]["json_schema"]["schema"] == outcome_json_schema(2) for r in server.requests)


def test_probe_moves_on_when_the_server_rejects_response_format(server, wm):
    server.rejects = {"response_format"}
    [out] = wm.grade([(TASK, GOOD)])
    assert out.status is Status.VALID and wm.guided == "structured_outputs"
    assert ["response_format" in p for p in server.probes] == [True, False]
    assert server.requests[0]["structured_outputs"] == {"json": outcome_json_schema(2)}
    assert "response_format" not in server.requests[0] and "guided_json" not in server.requests[0]


def test_a_mode_the_server_ignores_is_not_used(server, wm):
    """A server that accepts response_format but does not enforce it (answers free text) is probed on."""
    server.constrains = {"structured_outputs"}
    wm.grade([(TASK, GOOD)])
    assert wm.guided == "structured_outputs" and len(server.probes) == 2


def test_a_server_that_constrains_under_no_mode_is_an_error_that_names_the_setting(server, wm):
    server.constrains = set()
    with pytest.raises(UnconstrainedServerError, match=r"spec\.worldModel\.endpoint.*structured-outputs-config"):
        wm.grade([(TASK, GOOD)])
    assert server.requests == [] and len(server.probes) == 2  # no rollout was sent unconstrained


def test_grading_errors_after_the_probe_do_not_change_the_mode(server, wm):
    wm.grade([(TASK, GOOD)])
    server.respond = lambda body: ("status", 400)
    assert wm.grade([(TASK, GOOD)]) == [None]
    assert wm.guided == "response_format" and wm.stats["http_error"] == 1 and len(server.probes) == 1


def test_a_server_that_cannot_be_probed_leaves_the_batch_ungraded_and_is_probed_again(server, wm):
    server.probe_status = 503
    assert wm.grade([(TASK, GOOD), (TASK, "print(1)\n")]) == [None, None]
    assert wm.stats["probe_failed"] == 2 and wm.stats["ungraded"] == 2 and server.requests == []
    assert wm.guided is None and len(server.probes) == 3  # 1 + 2 retries, never the next mode
    server.probe_status = None
    [out] = wm.grade([(TASK, GOOD)])
    assert out.status is Status.VALID and wm.guided == "response_format"


@pytest.mark.parametrize("answer_to_probe", [404, "garbage"])
def test_a_probe_answer_that_says_nothing_about_constraints_is_not_a_verdict(server, wm, answer_to_probe):
    """A wrong path or a proxy's error page leaves the batch ungraded; it is no reason to give up a mode."""
    server.probe_status = answer_to_probe
    assert wm.grade([(TASK, GOOD)]) == [None]
    assert wm.stats["probe_failed"] == 1 and wm.guided is None and len(server.probes) == 1


def test_a_batch_is_sent_concurrently_and_answers_keep_their_order(server, wm):
    def respond(body):
        code = body["messages"][-1]["content"]
        status = "valid" if "print(0)" in code or "print(2)" in code else "ran_no_sub"
        return ("sleep", 0.2, answer(pred(status, "mid" if status == "valid" else None)))
    server.respond = respond
    outs = wm.grade([(TASK, f"print({i})\n") for i in range(6)])
    assert [o.status for o in outs] == [Status.VALID, Status.RAN_NO_SUB, Status.VALID] + [Status.RAN_NO_SUB] * 3
    assert server.max_in_flight > 1


def test_model_name_is_discovered_when_not_configured(server):
    model = LLMWorldModel(server.url, None, timeout=5)
    try:
        model.grade([(TASK, GOOD), (TASK, GOOD)])
    finally:
        model.close()
    assert {r["model"] for r in server.requests} == {"served-model"} and server.model_listings == 1


def test_build_world_model_from_spec_and_runtime(server):
    spec = WorldModelSpec(backend="llm", sampling={"temperature": 0.3, "topP": 0.9, "topK": 5, "predictions": 3,
                                                   "presencePenalty": 0.5})
    model = build_world_model(spec, Runtime(world_model_url=server.url), policy_model="policy-base")
    try:
        model.grade([(TASK, GOOD)])
    finally:
        model.close()
    body = server.requests[-1]
    assert (body["model"], body["temperature"], body["top_p"], body["top_k"]) == ("policy-base", 0.3, 0.9, 5)
    assert body["presence_penalty"] == 0.5 and "chat_template_kwargs" not in body
    assert body["response_format"]["json_schema"]["schema"]["properties"]["predictions"]["maxItems"] == 3
    with pytest.raises(ValueError, match="spec.worldModel.endpoint"):
        build_world_model(WorldModelSpec(backend="llm"), Runtime())


def test_unreachable_server_is_ungraded():
    model = LLMWorldModel("http://127.0.0.1:9/v1", "m", timeout=1, retries=1, backoff=0.01)
    try:
        assert model.grade([(TASK, GOOD)]) == [None]
    finally:
        model.close()


def test_the_world_model_reads_earlier_observations_without_the_request_for_the_next_turn():
    from wmrl.outcome import Outcome, Status
    from wmrl_trainer.observation import REVISE_REQUEST, observation_text
    from wmrl_trainer.prompts import world_model_messages

    crash = Outcome(status=Status.RUNTIME_ERR, error_type="ValueError", error_line=1, feedback="ValueError: bad")
    observation = observation_text(crash, GOOD)
    assert REVISE_REQUEST in observation  # the agent is asked for a revision...
    prompt = world_model_messages(TASK, GOOD, history=[(GOOD, observation)])[-1]["content"]
    assert "status=runtime_err" in prompt and "ValueError: bad" in prompt
    assert REVISE_REQUEST not in prompt  # ...the world model only reads what happened
