"""Anchor cases from a real local run round-trip through `wmrl eval world-model`.

`wmrl run` on examples/quickstart.yaml cut to two steps, with the judge frozen (the paper's setting;
the quickstart itself learns online), so that the command's learned judge, built afresh with the
run's seed, must predict exactly what the run's world model predicted on every case.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _wmrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wmrl.cli", *args]


def test_anchor_cases_of_a_short_quickstart_round_trip_through_the_fidelity_command(tmp_path, wmrl_env):
    manifest = yaml.safe_load(QUICKSTART.read_text())
    manifest["spec"]["algorithm"]["steps"] = 2
    manifest["spec"]["worldModel"]["learnOnline"] = False
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump(manifest))
    results = tmp_path / "run"
    proc = subprocess.run(_wmrl("run", str(path), "--results", str(results), "--sandboxes", "2", "--eval-samples", "1",
                                "--no-progress"), capture_output=True, text=True, env=wmrl_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads((results / "results.json").read_text())["records"]
    case_dir = results / "checkpoints" / "fidelity"
    lines = [json.loads(line) for line in (case_dir / "cases.jsonl").read_text().splitlines()]
    executed = sum(r["executions"] - r["failed_executions"] for r in records)
    assert len(lines) == executed > 0  # one case per executed anchor rollout
    held_out = set(manifest["spec"]["tasks"]["heldOut"])
    assert all(line["source"]["run"] == "quickstart" and line["source"]["step"] in (0, 1) for line in lines)
    assert not {line["task"] for line in lines} & held_out
    # The run's rolling figures are those of the world model's predictions in the file.
    fidelity = records[-1]["fidelity"]
    graded = [line for line in lines if line["world_model"] is not None]
    hits = sum(line["world_model"]["status"] == line["real"]["status"] for line in graded)
    mae = sum(abs(line["world_model"]["reward"] - line["real"]["reward"]) for line in graded) / len(graded)
    assert fidelity["cases"] == len(lines) and fidelity["recorded"] == len(lines)
    assert fidelity["status_at_1"] == pytest.approx(hits / len(graded))
    assert fidelity["reward_mae"] == pytest.approx(mae)
    assert records[0]["fidelity"]["cases"] == records[0]["executions"] - records[0]["failed_executions"]

    out = tmp_path / "fidelity"
    proc = subprocess.run(_wmrl("eval", "world-model", "--cases", str(case_dir), "--world-model", "learned",
                                "--seed", str(manifest["spec"]["algorithm"]["seed"]), "--out", str(out)),
                          capture_output=True, text=True, env=wmrl_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "fidelity.json").read_text())
    [arm] = report["arms"]
    rows = [json.loads(line) for line in (out / arm["predictions"]).read_text().splitlines()]
    assert len(rows) == len(lines)
    for row, line in zip(rows, lines):
        assert row["source"] == line["source"]
        top = row["predictions"][0]
        assert (top["status"], top["reward"]) == (line["world_model"]["status"], pytest.approx(line["world_model"]["reward"]))
    assert arm["summary"]["status_at_1"] == pytest.approx(fidelity["status_at_1"])
    assert arm["summary"]["reward"]["all"]["mae"] == pytest.approx(fidelity["reward_mae"])
