"""`wmrl eval world-model`, as a real subprocess: the learned judge against a hand computation, the llm
backend with and without few-shot examples, bad input.

The llm tests talk to a small stdlib HTTP server on loopback that serves the OpenAI chat API with
scripted, deterministic answers. It STANDS IN for vLLM, which this tier does not start (it is the
CPU vLLM tier's: tests/vllm_cpu/test_vllm_world_model.py::test_the_fidelity_command_measures_real_vllm_with_and_without_few_shot
runs the same command against a real vLLM); a scripted server is what lets these tests know every
answer, and so compute the figures by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fidelity_cases import CASES, TASK, case_lines, write_cases
from wmrl_trainer.few_shot import read_examples
from wmrl_trainer.world_model.learned import LearnedWorldModel
from wmrl_trainer.world_model.llm import PROBE_SCHEMA, PROBE_VALUE


def wmrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wmrl.cli", "eval", "world-model", *args], capture_output=True,
                          text=True, timeout=timeout)


def report(out) -> dict:
    return json.loads((out / "fidelity.json").read_text())


# ---------------------------------------------------------------- the learned judge, by hand

def test_the_learned_judge_still_predicts_what_the_hand_computation_assumes():
    wm = LearnedWorldModel(seed=0, learn_online=False)
    outcomes = wm.grade([(TASK, code) for code, _, _ in CASES.values()])
    assert [(o.status.value, o.error_type, o.reward) for o in outcomes] == [p for _, _, p in CASES.values()]


def test_the_learned_judge_on_a_small_case_file_matches_a_hand_computation(tmp_path):
    cases = write_cases(tmp_path / "cases.jsonl")
    proc = wmrl("--cases", str(cases), "--world-model", "learned", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    arm = report(tmp_path / "out")["arms"][0]
    s = arm["summary"]
    # Cases (real -> predicted by the judge, reward error):
    #   syntax  syntax_err -> syntax_err (compile gate)  0
    #   name    runtime_err NameError -> runtime_err NameError  0
    #   key     runtime_err KeyError -> runtime_err NameError  0 (status right, class wrong)
    #   nosub   ran_no_sub -> ran_no_sub  0
    #   forest  valid 0.95 -> valid 0.6   -0.35
    #   linear  ran_no_sub 0.2 -> valid 0.525   +0.325
    #   knn     valid 0.6 -> valid 0.525   -0.075
    assert s["cases"] == 7 and s["graded"] == 7 and s["ungraded"] == 0 and s["gated"] == 1
    assert s["status_at_1"] == pytest.approx(6 / 7)
    assert s["status_at_2"] == pytest.approx(6 / 7)  # one prediction per case: status@2 = status@1
    assert s["reward"]["all"] == {"cases": 7, "mae": pytest.approx(0.75 / 7), "bias": pytest.approx(-0.1 / 7)}
    assert s["reward"]["ran_no_sub"] == {"cases": 2, "mae": pytest.approx(0.1625), "bias": pytest.approx(0.1625)}
    assert s["reward"]["valid:high"] == {"cases": 1, "mae": pytest.approx(0.35), "bias": pytest.approx(-0.35)}
    assert s["reward"]["valid:fair"] == {"cases": 1, "mae": pytest.approx(0.075), "bias": pytest.approx(-0.075)}
    assert s["reward"]["runtime_err"] == {"cases": 2, "mae": 0.0, "bias": 0.0}
    assert s["exception_match"] == {"cases": 2, "matched": 1, "rate": 0.5}
    assert s["confusion"]["counts"] == [[0, 0, 0, 0, 0, 0],   # malformed
                                        [0, 1, 0, 0, 0, 0],   # syntax_err
                                        [0, 0, 2, 0, 0, 0],   # runtime_err
                                        [0, 0, 0, 1, 1, 0],   # ran_no_sub
                                        [0, 0, 0, 0, 2, 0]]   # valid
    points = [(p["predicted"], p["real"], p["cases"]) for p in s["reliability"]]
    assert points == [(0.0, 0.0, 1), (0.1, pytest.approx(0.1), 2), (0.2, 0.2, 1), (0.525, pytest.approx(0.4), 2),
                      (0.6, 0.95, 1)]
    assert s["latency"]["cases"] == 6 and s["latency"]["p50"] > 0
    rows = [json.loads(line) for line in (tmp_path / "out" / arm["predictions"]).read_text().splitlines()]
    assert [r["source"]["name"] for r in rows] == list(CASES)
    assert [r["predictions"][0]["status"] for r in rows] == [p[0] for _, _, p in CASES.values()]
    for name in ("fidelity.md", "confusion.png", "reliability.png"):
        assert (tmp_path / "out" / name).stat().st_size > 500
    markdown = (tmp_path / "out" / "fidelity.md").read_text()
    assert "| as specified | 7 | 7 | 0 | 1 | 0.857 | 0.857 | 0.107 | -0.014 | 1/2 (0.500) |" in markdown
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["arms"]["as specified"]["status_at_1"] == pytest.approx(6 / 7)


def test_few_shot_with_the_learned_judge_curates_the_file_and_says_it_is_ignored(tmp_path):
    cases = write_cases(tmp_path / "cases.jsonl")
    few_shot = tmp_path / "few-shot.jsonl"
    proc = wmrl("--cases", str(cases), "--world-model", "learned", "--out", str(tmp_path / "out"),
                "--few-shot", str(few_shot))
    assert proc.returncode == 0, proc.stderr
    examples = read_examples(few_shot)
    # One per failure kind the model is asked about (syntax_err is the compile gate's), then valid low and high:
    # ran_no_sub has two cases (the shorter script wins), each exception class one.
    assert [e.kind for e in examples] == ["ran_no_sub", "runtime_err:KeyError", "runtime_err:NameError", "valid-low",
                                          "valid-high"]
    assert examples[0].code == min(CASES["nosub"][0], CASES["linear"][0], key=len)
    assert [e.quality_bucket for e in examples[3:]] == ["fair", "high"]  # real positions 0.2 and 0.9
    assert examples[2].error_type == "NameError" and examples[2].error_line == 5
    data = report(tmp_path / "out")
    assert [a["name"] for a in data["arms"]] == ["without few-shot"]
    assert data["excluded"] == 5 and data["cases"] == 2  # the scripts shown as examples are not measured
    assert any("learned judge has no prompt" in note for note in data["notes"])
    assert "learned judge has no prompt" in (tmp_path / "out" / "fidelity.md").read_text()


# ---------------------------------------------------------------- bad input

def _case_file_with(tmp_path, n: int, text: str):
    lines = [json.dumps(line) for line in case_lines()]
    lines[n - 1] = text
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda d: "{not json", ":3: not JSON"),
    (lambda d: json.dumps({**d, "real": {k: v for k, v in d["real"].items() if k != "status"}}), ":3: real.status: missing"),
    (lambda d: json.dumps({**d, "real": {**d["real"], "status": "crashed"}}), ":3: real.status: 'crashed' is not one of"),
    (lambda d: json.dumps({**d, "real": {**d["real"], "reward": 0.7}}), ":3: real.reward: 0.7 does not match"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "code"}), ":3: code: missing"),
    (lambda d: json.dumps({**d, "task_context": {**d["task_context"], "kind": "ranking"}}), ":3: task_context.kind"),
    (lambda d: json.dumps({**d, "history": [["only one"]]}), ":3: history[0]"),
])
def test_a_malformed_case_line_exits_2_naming_the_line_and_field(tmp_path, edit, message):
    path = _case_file_with(tmp_path, 3, edit(case_lines()[2]))
    proc = wmrl("--cases", str(path), "--world-model", "learned", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert f"{path}{message}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "fidelity.json").exists()


@pytest.mark.parametrize("spec,message", [
    ("oracle", "--world-model: 'oracle' is none of: a backend (learned, llm, transformers)"),
    ("{backend: oracle}", "--world-model: backend 'oracle' is not one of learned, llm, transformers"),
    ("{backend: learned, fewShot: {path: x.jsonl}}", "spec.worldModel.fewShot: the learned backend has no prompt"),
    ("{backend: llm, sampling: {temperature: -1}}", "--world-model: spec.worldModel.sampling.temperature"),
    ("llm", "spec.worldModel.endpoint"),
])
def test_a_bad_world_model_spec_exits_2_naming_the_field(tmp_path, spec, message):
    proc = wmrl("--cases", str(write_cases(tmp_path / "cases.jsonl")), "--world-model", spec,
                "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_case_file_and_a_bad_option_exit_2(tmp_path):
    proc = wmrl("--cases", str(tmp_path / "nope.jsonl"), "--world-model", "learned")
    assert proc.returncode == 2 and "nope.jsonl: cannot read it" in proc.stderr
    proc = wmrl("--cases", str(write_cases(tmp_path / "c.jsonl")), "--world-model", "learned", "--limit", "0")
    assert proc.returncode == 2 and "--limit: must be >= 1" in proc.stderr


# ---------------------------------------------------------------- the llm backend (stand-in server)

class _StandIn(BaseHTTPRequestHandler):
    """OpenAI chat API, deterministic (see the module docstring): answers the client's structured-output
    probe as a constraining server would; then, per rollout: prose (unparsable) for a script that prints
    a score, else two predictions whose order says whether the prompt held few-shot examples."""

    def log_message(self, *args):
        pass

    def _json(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
        if schema == PROBE_SCHEMA:
            content = json.dumps({"probe": PROBE_VALUE})
        else:
            prompt = body["messages"][-1]["content"]
            self.server.prompts.append(prompt)
            current = prompt.rsplit("```", 2)[-2]  # the script to predict comes last
            valid = {"reason": "r", "status": "valid", "error_type": None, "error_line": None,
                     "quality_bucket": "high", "env_feedback": "ok"}
            error = {"reason": "r", "status": "runtime_err", "error_type": "NameError", "error_line": 5,
                     "quality_bucket": None, "env_feedback": "NameError"}
            if "model.score" in current:
                content = "I think it prints a score."
            elif "Examples: scripts that really ran" in prompt:
                content = json.dumps({"predictions": [error, valid]})
            else:
                content = json.dumps({"predictions": [valid, error]})
        self._json({"object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    server.prompts = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_port}/v1"
    yield server
    server.shutdown()
    server.server_close()


def test_the_llm_backend_is_measured_without_and_with_few_shot_examples(tmp_path, stand_in):
    cases = write_cases(tmp_path / "cases.jsonl")
    source = write_cases(tmp_path / "earlier.jsonl", case_lines(prefix="# an earlier run\n"))  # other scripts
    few_shot = tmp_path / "few-shot.jsonl"
    proc = wmrl("--cases", str(cases), "--world-model", f"{{backend: llm, endpoint: {stand_in.url}}}",
                "--few-shot", str(few_shot), "--few-shot-from", str(source), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    data = report(tmp_path / "out")
    assert data["excluded"] == 0 and data["cases"] == 7
    without, with_ = (arm["summary"] for arm in data["arms"])
    assert [arm["name"] for arm in data["arms"]] == ["without few-shot", "with few-shot"]
    # 7 cases: syntax is the compile gate's; nosub prints a score -> prose -> ungraded (a parse failure).
    for s, stats in ((without, data["arms"][0]["stats"]), (with_, data["arms"][1]["stats"])):
        assert (s["cases"], s["graded"], s["ungraded"], s["gated"]) == (7, 6, 1, 1)
        assert stats["unparsable"] == 1 and stats["gated"] == 1
        assert s["latency"]["cases"] == 6
    # Without: [valid high, runtime_err NameError] for every script. Real: syntax(gate), name, key (runtime),
    # forest, knn (valid), linear (ran_no_sub).
    assert without["status_at_1"] == pytest.approx(3 / 6)  # syntax, forest, knn
    assert without["status_at_2"] == pytest.approx(5 / 6)  # + name, key
    assert without["reward"]["all"]["mae"] == pytest.approx((0 + 0.775 + 0.775 + 0.075 + 0.675 + 0.275) / 6)
    assert without["exception_match"] == {"cases": 2, "matched": 0, "rate": 0.0}
    # With: [runtime_err NameError, valid high].
    assert with_["status_at_1"] == pytest.approx(3 / 6)  # syntax, name, key
    assert with_["status_at_2"] == pytest.approx(5 / 6)  # + forest, knn
    assert with_["reward"]["all"]["mae"] == pytest.approx((0 + 0 + 0 + 0.85 + 0.1 + 0.5) / 6)
    assert with_["exception_match"] == {"cases": 2, "matched": 1, "rate": 0.5}
    # The examples reached the prompts of the second arm only, curated from the other file.
    examples = read_examples(few_shot)
    with_prompts = [p for p in stand_in.prompts if "Examples: scripts that really ran" in p]
    assert len(stand_in.prompts) == 12 and len(with_prompts) == 6
    assert all(e.code.rstrip() in p for e in examples for p in with_prompts)
    assert all(e.source.startswith(str(source)) for e in examples)
    assert data["arms"][1]["few_shot"] == str(few_shot)
    table = (tmp_path / "out" / "fidelity.md").read_text()
    assert "| without few-shot | 7 | 6 | 1 | 1 | 0.500 | 0.833 |" in table
    assert "| with few-shot | 7 | 6 | 1 | 1 | 0.500 | 0.833 |" in table


def test_a_spec_may_name_its_few_shot_file_and_the_llm_gets_it(tmp_path, stand_in):
    few_shot = tmp_path / "few-shot.jsonl"
    assert wmrl("--cases", str(write_cases(tmp_path / "c.jsonl")), "--world-model", "learned", "--few-shot",
                str(few_shot), "--out", str(tmp_path / "curate")).returncode == 0
    spec = tmp_path / "wm.yaml"
    spec.write_text(f"backend: llm\nendpoint: {stand_in.url}\nfewShot:\n  path: {few_shot}\n")
    proc = wmrl("--cases", str(write_cases(tmp_path / "c.jsonl")), "--world-model", str(spec),
                "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert len(stand_in.prompts) == 6 and all("Example 5 (task 'toy')" in p for p in stand_in.prompts)
    assert any("spec's own examples" in note for note in report(tmp_path / "out")["notes"])


def test_a_server_that_grades_nothing_exits_1_with_the_report_written(tmp_path):
    """Nothing listens on the port: every case the model was asked about is ungraded (probe failed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = wmrl("--cases", str(write_cases(tmp_path / "c.jsonl")), "--world-model",
                f"{{backend: llm, endpoint: 'http://127.0.0.1:{port}/v1', timeoutSeconds: 2}}",
                "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    assert "graded none of the 6 cases it was asked about" in proc.stderr
    s = report(tmp_path / "out")["arms"][0]["summary"]
    assert (s["graded"], s["gated"], s["status_at_1"]) == (1, 1, 1.0)  # the compile gate's case only
