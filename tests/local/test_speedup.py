"""`wmrl bench speedup` end to end with an extra-tiny setting: every arm runs, the JSON has the schema."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wmrl_bench.speedup import ARMS, arm_config

pytestmark = pytest.mark.slow


def test_arms_differ_only_in_their_spec():
    configs = {arm: arm_config(arm, seed=3, steps=7).spec.to_wire() for arm in ARMS}
    for arm, spec in configs.items():
        spec = dict(spec)
        mode = spec.pop("mode")
        alg = dict(spec.pop("algorithm"))
        deb, den = alg.pop("debiasing")["enabled"], alg.pop("denoising")["enabled"]
        assert mode == ARMS[arm]["mode"]
        if "debiasing" in ARMS[arm]:
            assert (deb, den) == (ARMS[arm]["debiasing"], ARMS[arm]["denoising"])
        assert alg["seed"] == 3 and alg["steps"] == 7
        reference = dict(configs["real"])
        reference.pop("mode")
        ref_alg = dict(reference.pop("algorithm"))
        ref_alg.pop("debiasing"), ref_alg.pop("denoising")
        assert spec == reference and alg == ref_alg


def test_quick_bench_extra_tiny_produces_the_schema(tmp_path):
    out, png = tmp_path / "speedup.json", tmp_path / "speedup.png"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--quick", "--seeds", "1",
                           "--steps", "1", "--eval-every", "1", "--eval-samples", "1", "--group-size", "2",
                           "--groups-per-step", "2", "--sandboxes", "2", "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == data  # printed as JSON too
    assert set(data["arms"]) == set(ARMS)
    assert isinstance(data["target_reward"], float)
    assert "speedup" in data and data["wall_clock_s"] > 0
    for name, arm in data["arms"].items():
        for key in ("time_to_target_s", "executions_to_target", "final_reward", "final_reward_std"):
            assert key in arm, (name, key)
        assert arm["curve"]["step"] == [0, 1]
        assert len(arm["curve"]["reward"]) == len(arm["curve"]["wall_clock_s"]) == len(arm["curve"]["executions"]) == 2
    assert data["arms"]["real"]["time_to_target_s"] is not None  # the real arm reaches its own final reward
    assert data["arms"]["worldModel"]["executions"] == 0
    assert data["arms"]["real"]["executions"] == 4  # 2 groups x 2 rollouts, all executed
    assert png.stat().st_size > 5000
