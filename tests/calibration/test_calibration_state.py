import json

import numpy as np
import pytest

from wmrl.calibration.state import RECENT_BATCHES, CalibrationConfig, CalibrationState, StateError


def groups(rng, n=8, size=8):
    out = []
    for _ in range(n):
        real = rng.random(size)
        out.append({"task": "t", "wm": np.sqrt(real).tolist(), "env": real.tolist()})
    return out


def test_batches_from_many_trainers_fold_in_and_retries_count_once():
    rng = np.random.default_rng(0)
    state = CalibrationState()
    batches = [(f"trainer-{t}", f"b{i}", groups(rng)) for i in range(20) for t in range(3)]
    for trainer, batch, g in batches:
        assert state.observe(trainer, batch, g)
    for trainer, batch, g in batches[-30:]:
        assert not state.observe(trainer, batch, g)  # retried: not counted again
    view = state.view()
    assert view["pairsSeen"] == 60 * 64 and view["groupsSeen"] == 60 * 8 and view["batches"] == 60
    assert view["pairs"] == 3840 and view["pairsEvicted"] == 0 and view["version"] == 60
    assert view["map"] is not None and view["bias"]["reduction"] > 0.5 and view["weight"] >= 1.0


def test_bad_input_leaves_the_state_untouched():
    rng = np.random.default_rng(1)
    state = CalibrationState()
    state.observe("t", "ok", groups(rng))
    before = state.dumps()
    good = groups(rng)
    for bad in ([], [*good, {"wm": [0.1, float("nan")], "env": [0.1, 0.2]}], [*good, {"wm": [0.1], "env": [0.1, 0.2]}],
                [*good, {"wm": [1.5], "env": [0.1]}], [{"wm": [True], "env": [0.1]}], [{"wm": [0.1], "env": [0.1], "x": 1}]):
        with pytest.raises(ValueError):
            state.observe("t", "bad", bad)
    with pytest.raises(ValueError, match="trainer"):
        state.observe("", "b", good)
    assert state.dumps() == before


def test_json_roundtrip_is_exact_and_compact_at_the_default_buffer():
    rng = np.random.default_rng(2)
    state = CalibrationState()
    for i in range(100):
        state.observe(f"t{i % 8}", str(i), groups(rng))
    assert state.view()["pairs"] == 5000 and state.view()["pairsEvicted"] == 1400
    text = state.dumps()
    assert len(text.encode()) < 150_000  # a ConfigMap holds 1 MiB
    again = CalibrationState.loads(text)
    assert again.dumps() == text and again.view() == state.view()
    g = groups(rng)
    assert state.observe("t0", "next", g) and again.observe("t0", "next", g)
    assert again.dumps() == state.dumps()  # replicas that load the state compute the same numbers


def test_recent_batch_ids_are_bounded_per_trainer():
    state = CalibrationState()
    g = [{"wm": [0.5], "env": [0.5]}]
    for i in range(RECENT_BATCHES + 10):
        state.observe("t", str(i), g)
    assert len(state.recent["t"]) == RECENT_BATCHES
    assert not state.observe("t", str(RECENT_BATCHES + 9), g)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ('{"format": 1}', "missing field"),
    ("[1, 2]", "not a calibration state"),
    ('{"format": 99}', "format 1"),
])
def test_corrupt_state_is_a_clear_error(text, message):
    with pytest.raises(StateError, match=message):
        CalibrationState.loads(text)


def test_tampered_buffer_is_rejected():
    state = CalibrationState(CalibrationConfig(min_pairs=1))
    state.observe("t", "b", [{"wm": [0.2, 0.4], "env": [0.1, 0.3]}])
    data = json.loads(state.dumps())
    data["debiasing"]["env"] = [100000, 7000000]
    with pytest.raises(StateError, match=r"env\[1\]"):
        CalibrationState.from_json(data)


def test_config_defaults_are_the_schema_defaults_and_roundtrip():
    from wmrl.api.schema import AlgorithmSpec

    assert CalibrationConfig.from_spec(AlgorithmSpec()) == CalibrationConfig()
    custom = CalibrationConfig.from_spec(AlgorithmSpec.model_validate({"debiasing": {"bins": 20}, "denoising": {"warmup": 8}}))
    assert CalibrationConfig.from_json(json.loads(json.dumps(custom.to_json()))) == custom
    with pytest.raises(ValueError, match="unknown field"):
        CalibrationConfig.from_json({"bogus": 1})
    with pytest.raises(ValueError, match="target_weight <= max_weight"):
        CalibrationConfig(target_weight=5.0, max_weight=4.0)


def test_service_takes_its_config_from_the_operator_env(monkeypatch):
    import argparse

    from wmrl.calibration.service import add_arguments, config_from_args

    monkeypatch.setenv("WMRL_CALIBRATION_CONFIG", json.dumps(CalibrationConfig(bins=20, warmup=8).to_json()))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--state-file", "x"])) == CalibrationConfig(bins=20, warmup=8)
    assert config_from_args(parser.parse_args(["--state-file", "x", "--bins", "5"])).bins == 5


from hypothesis import given, settings, strategies as st  # noqa: E402

from wmrl.debias import OnlineDebiaser  # noqa: E402
from wmrl.denoise import DisagreementWeighter  # noqa: E402

_reward = st.integers(0, 20).map(lambda k: k / 20)  # coarse values: ties and degenerate groups happen


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(st.tuples(_reward, _reward), min_size=1, max_size=9), min_size=1, max_size=12),
                min_size=1, max_size=12),
       st.integers(1, 40), st.integers(1, 20), st.integers(5, 60))
def test_vectorised_fold_equals_folding_group_by_group(batches, min_pairs, refit_every, buffer_size):
    config = CalibrationConfig(min_pairs=min_pairs, refit_every=refit_every, buffer_size=buffer_size, warmup=3, half_life=4)
    state = CalibrationState(config)
    deb = OnlineDebiaser(config.bins, min_pairs, refit_every, buffer_size)
    weigher = DisagreementWeighter(config.target_weight, config.max_weight, config.half_life, config.warmup)
    for k, batch in enumerate(batches):
        state.observe("t", str(k), [{"wm": [p[0] for p in g], "env": [p[1] for p in g]} for g in batch])
        for g in batch:
            wm, env = np.array([p[0] for p in g]), np.array([p[1] for p in g])
            deb.observe_group(wm, env)
            weigher.observe_group(deb.calibrate(wm), env)
    view = state.view()
    assert view["fits"] == deb.fits and view["pairs"] == len(deb)
    np.testing.assert_array_equal(state.debiaser.wm, deb.wm)
    assert (view["map"] is None) == (deb.map is None)
    if deb.map is not None:
        np.testing.assert_allclose(view["map"]["x"], deb.map.x, atol=1e-12)
        np.testing.assert_allclose(view["map"]["y"], deb.map.y, atol=1e-12)
    assert weigher.observations == state.weighter.observations
    if weigher.disagreement is not None:
        assert abs(weigher.disagreement - state.weighter.disagreement) <= 1e-9 * max(1.0, weigher.disagreement)
        assert abs(weigher.weight - state.weight) <= 1e-9
