"""The calibration measures the anchor disagreement on the world-model rewards trainers train on.

``CalibrationConfig.debiasing_enabled`` (``spec.algorithm.debiasing.enabled``): calibrated
world-model rewards when true (the paper), raw ones when false.
"""

import argparse
import json

import numpy as np
import pytest

from wmrl.api.schema import AlgorithmSpec
from wmrl.calibration.state import CalibrationConfig, CalibrationState
from wmrl.debias import OnlineDebiaser
from wmrl.denoise import DisagreementWeighter


def affine_groups(n_groups: int, seed: int = 0) -> list[dict]:
    """Groups of 8 with a constant monotone bias: wm = 0.5 * real + 0.4 (no noise)."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(n_groups):
        real = np.round(rng.random(8), 6)
        groups.append({"wm": np.round(0.5 * real + 0.4, 6).tolist(), "env": real.tolist()})
    return groups


def folded(debiasing_enabled: bool, groups: list[dict]) -> CalibrationState:
    config = CalibrationConfig(min_pairs=32, refit_every=16, warmup=4, half_life=8.0,
                               debiasing_enabled=debiasing_enabled)
    state = CalibrationState(config)
    for k in range(0, len(groups), 5):  # batches of several groups: the vectorised fold
        state.observe("t", str(k), groups[k:k + 5])
    return state


def test_debiasing_off_measures_the_raw_disagreement():
    state = folded(False, affine_groups(60))
    # centred(0.5 r + 0.4) - centred(r) = -0.5 centred(r): s^2 = 0.25 in every group, whatever the map
    assert state.weighter.disagreement == pytest.approx(0.25, abs=1e-5)
    assert state.weighter.observations == 60
    assert state.map is not None and state.view()["bias"]["reduction"] > 0.5  # still fitted and reported


def test_debiasing_on_measures_the_disagreement_after_calibration_as_group_by_group():
    groups = affine_groups(60)
    state = folded(True, groups)
    deb = OnlineDebiaser(10, 32, 16, 5000)
    weigher = DisagreementWeighter(2.0, 4.0, 8.0, 4)
    for group in groups:
        wm, env = np.array(group["wm"]), np.array(group["env"])
        deb.observe_group(wm, env)
        weigher.observe_group(deb.calibrate(wm), env)  # after the push: the map the group saw
    assert state.weighter.disagreement == pytest.approx(weigher.disagreement, rel=1e-9)
    assert state.weighter.disagreement < 0.05  # far below the raw 0.25: the map removed the bias
    assert state.weight == pytest.approx(weigher.weight, rel=1e-9)


def test_both_settings_fit_the_same_map():
    groups = affine_groups(40, seed=3)
    on, off = folded(True, groups), folded(False, groups)
    assert on.view()["map"] == off.view()["map"] and on.debiaser.fits == off.debiaser.fits


def test_config_json_omits_the_default_and_roundtrips():
    assert "debiasingEnabled" not in CalibrationConfig().to_json()  # what older services read
    off = CalibrationConfig(debiasing_enabled=False)
    assert off.to_json()["debiasingEnabled"] is False
    assert CalibrationConfig.from_json(json.loads(json.dumps(off.to_json()))) == off
    assert CalibrationConfig.from_json({"debiasingEnabled": True}) == CalibrationConfig()
    with pytest.raises(ValueError, match="debiasingEnabled must be true or false"):
        CalibrationConfig.from_json({"debiasingEnabled": "false"})
    assert CalibrationConfig.from_spec(AlgorithmSpec.model_validate({"debiasing": {"enabled": False}})) == off
    assert CalibrationConfig.from_spec(AlgorithmSpec()).debiasing_enabled is True


def test_stored_state_keeps_the_setting():
    state = folded(False, affine_groups(10))
    again = CalibrationState.loads(state.dumps())
    assert again.config.debiasing_enabled is False and again.view()["config"]["debiasingEnabled"] is False
    old_format = json.loads(CalibrationState(CalibrationConfig()).dumps())  # as written before the setting
    assert "debiasingEnabled" not in old_format["config"]
    assert CalibrationState.from_json(old_format).config.debiasing_enabled is True


@pytest.mark.parametrize("enabled", [True, False])
def test_service_flags_of_a_local_run_carry_the_setting(enabled, monkeypatch):
    from wmrl.calibration.service import add_arguments, config_from_args
    from wmrl_trainer.services import calibration_flags

    monkeypatch.delenv("WMRL_CALIBRATION_CONFIG", raising=False)
    algorithm = AlgorithmSpec.model_validate({"debiasing": {"enabled": enabled, "bins": 12},
                                              "denoising": {"warmup": 5}})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--state-file", "x", *calibration_flags(algorithm)])
    assert config_from_args(args) == CalibrationConfig.from_spec(algorithm)


def test_service_takes_the_setting_from_the_operator_env_and_flags(monkeypatch):
    from wmrl.calibration.service import add_arguments, config_from_args

    monkeypatch.setenv("WMRL_CALIBRATION_CONFIG", json.dumps(CalibrationConfig(debiasing_enabled=False).to_json()))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--state-file", "x"])).debiasing_enabled is False
    assert config_from_args(parser.parse_args(["--state-file", "x", "--debiasing-enabled", "true"])).debiasing_enabled
    with pytest.raises(SystemExit):
        parser.parse_args(["--state-file", "x", "--debiasing-enabled", "maybe"])
