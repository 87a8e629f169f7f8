"""The learned world model against REAL outcomes: solutions of the bundled suite really run and graded.

The corpus: every reference family on a few tasks, plus realistic defects (crashes, missing
or malformed submissions, a classifier on a regression target, a library the sandbox lacks,
the id column used as a feature), each executed in-process and graded by wmrl.grading.
"""

import numpy as np
import pytest

from suite_runs import run_in_process
from wmrl.api.schema import WorldModelSpec
from wmrl.outcome import BUCKET_RANK_SCORE, Outcome, Status
from wmrl_demo import suite
from wmrl_demo.suite_data import REFERENCE_MODELS
from wmrl_trainer.world_model import build_world_model, compile_gate
from wmrl_trainer.world_model.learned import LearnedWorldModel

TASKS = ("iris", "moons", "circles", "diabetes", "sparse-linear", "sparse-uncorrelated")
BUG_FAMILIES = ("scaled-linear", "random-forest", "knn")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """[(task, code, real outcome)], in a fixed shuffled order."""
    tasks = {t.name: t for t in suite.builtin_suite("mini-ml") if t.name in TASKS}
    root = tmp_path_factory.mktemp("runs")
    items = []
    for name in TASKS:
        task = tasks[name]
        variants = [(m.family, None) for m in REFERENCE_MODELS]
        variants += [(f, bug) for f in BUG_FAMILIES for bug in ("id-as-feature", "bad-import", "no-header", "wrong-kind")]
        for family, bug in variants:
            code = suite.solution_code(task, family, bug=bug)
            items.append((task, code, run_in_process(task, code, root / f"{name}-{family}-{bug}")))
    order = np.random.default_rng(0).permutation(len(items))
    return [items[i] for i in order]


def _rewards(wm, pairs):
    means, variances = wm.predict_reward([(t, c) for t, c, _ in pairs])
    real = np.array([o.reward for _, _, o in pairs])
    return means, variances, real


def test_corpus_spans_the_ladder(corpus):
    statuses = {o.status for _, _, o in corpus}
    assert {Status.VALID, Status.RUNTIME_ERR, Status.RAN_NO_SUB} <= statuses


def test_prior_is_biased_and_noisy_before_any_observation(corpus):
    wm = LearnedWorldModel(seed=0)
    means, _, real = _rewards(wm, corpus)
    err = means - real
    assert np.mean(np.abs(err)) > 0.08, "the prior should be a visibly imperfect judge"
    assert np.corrcoef(means, real)[0, 1] > 0.3, "... but an informative one"
    # Complexity bias: on linear tasks the prior ranks forests above linear models; reality disagrees.
    by = {(t.name, c): (m, o.reward) for (t, c, o), m in zip(corpus, means)}
    for name in ("sparse-linear", "diabetes"):
        task = next(t for t, _, _ in corpus if t.name == name)
        forest = by[(name, suite.solution_code(task, "random-forest"))]
        linear = by[(name, suite.solution_code(task, "scaled-linear"))]
        assert forest[0] > linear[0] and forest[1] < linear[1], name
    # Blind spot: it trusts that any imported library is installed.
    missing = [(m, o.reward) for (t, c, o), m in zip(corpus, means) if "xgboost" in c]
    assert all(r == 0.1 for _, r in missing) and np.mean([m for m, _ in missing]) > 0.4


def test_learns_from_observations_on_held_out_pairs(corpus):
    observe, held_out = corpus[: int(0.65 * len(corpus))], corpus[int(0.65 * len(corpus)):]
    wm = LearnedWorldModel(seed=0)
    before, var_before, real = _rewards(wm, held_out)
    for task, code, outcome in observe:
        wm.observe(task, code, outcome)
    after, var_after, _ = _rewards(wm, held_out)
    mse_before, mse_after = np.mean((before - real) ** 2), np.mean((after - real) ** 2)
    assert mse_after < 0.6 * mse_before, (mse_before, mse_after)
    assert abs(np.mean(after - real)) < abs(np.mean(before - real))  # bias shrinks
    assert np.mean(var_after) < 0.5 * np.mean(var_before)  # and so does the variance
    assert wm.stats["observed"] == len(observe)


def test_predicted_outcomes_follow_the_blended_reward(corpus):
    wm = LearnedWorldModel(seed=0)
    for task, code, outcome in corpus:
        wm.observe(task, code, outcome)
    pairs = [(t, c) for t, c, _ in corpus]
    outs = wm.grade(pairs)
    means, _ = wm.predict_reward(pairs)
    rungs = [0.1, 0.2] + [0.5 + 0.5 * s for s in BUCKET_RANK_SCORE.values()]
    for out, mean in zip(outs, means):
        assert abs(out.reward - mean) == pytest.approx(min(abs(r - mean) for r in rungs))  # the nearest rung
    statuses = [o.status for o in outs]
    real = [o.status for _, _, o in corpus]
    assert np.mean([a == b for a, b in zip(statuses, real)]) > 0.7
    crash = next(o for o, (t, c, r) in zip(outs, corpus) if "xgboost" in c)
    assert crash.status is Status.RUNTIME_ERR and crash.error_type == "ModuleNotFoundError"


def test_deterministic_given_seed_and_state_dict_round_trips(corpus):
    a, b = LearnedWorldModel(seed=3), LearnedWorldModel(seed=3)
    for task, code, outcome in corpus[:40]:
        a.observe(task, code, outcome)
        b.observe(task, code, outcome)
    pairs = [(t, c) for t, c, _ in corpus[40:]]
    np.testing.assert_array_equal(a.predict_reward(pairs)[0], b.predict_reward(pairs)[0])
    restored = LearnedWorldModel(seed=99)
    restored.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.predict_reward(pairs)[0], restored.predict_reward(pairs)[0])
    for task, code, outcome in corpus[40:60]:  # and it keeps learning identically after a resume
        a.observe(task, code, outcome)
        restored.observe(task, code, outcome)
    np.testing.assert_array_equal(a.predict_reward(pairs)[1], restored.predict_reward(pairs)[1])
    other = LearnedWorldModel(seed=4)
    assert not np.array_equal(LearnedWorldModel(seed=3).predict_reward(pairs)[0], other.predict_reward(pairs)[0])


def test_state_dict_rejects_an_incompatible_state():
    state = LearnedWorldModel(seed=0, members=4).state_dict()
    with pytest.raises(ValueError, match="ensemble size"):
        LearnedWorldModel(seed=0, members=8).load_state_dict(state)


def test_without_observations_it_stays_at_the_prior(corpus):
    wm = build_world_model(WorldModelSpec(backend="learned"), None)
    pairs = [(t, c) for t, c, _ in corpus[:30]]
    first = wm.predict_reward(pairs)[0]
    wm.grade(pairs)
    np.testing.assert_array_equal(first, wm.predict_reward(pairs)[0])
    np.testing.assert_allclose(first, [wm.prior_reward(t, c) for t, c in pairs])


def test_uninformative_observations_teach_nothing(corpus):
    wm = LearnedWorldModel(seed=0)
    task, code, _ = corpus[0]
    wm.observe(task, code, None)  # an execution that could not be graded
    wm.observe(task, "def f(:\n", Outcome(status=Status.SYNTAX_ERR))  # the compile gate's business
    assert wm.stats["observed"] == 0
    assert compile_gate("def f(:\n").reward == 0.0


def test_syntax_errors_are_gated(corpus):
    wm = LearnedWorldModel(seed=0)
    task = corpus[0][0]
    [out] = wm.grade([(task, "import numpy as np\nif True print(1)\n")])
    assert out.status is Status.SYNTAX_ERR and out.reward == 0.0 and wm.stats["gated"] == 1


def test_continuous_scores_keep_within_bucket_differences(corpus):
    wm = LearnedWorldModel(seed=0, continuous=True)
    outs = wm.grade([(t, c) for t, c, _ in corpus])
    valid = [o for o in outs if o.status is Status.VALID]
    assert len({o.rank_score for o in valid}) > 4 * len({o.quality_bucket for o in valid})


@pytest.mark.slow
def test_optional_minilm_embeddings_extend_the_features(corpus):
    from wmrl_trainer.world_model.features import N_FEATURES, CodeEmbedder

    # The bundled MiniLM, loaded offline. At 256 tokens (the default) the corpus' scripts (240-298
    # tokens) are partly truncated, partly padded: batching them exercises the attention mask.
    embedder = CodeEmbedder(dims=16, seed=0, max_length=256)
    a = LearnedWorldModel(seed=0, embeddings=embedder)
    b = LearnedWorldModel(seed=0, embeddings=embedder)
    assert a.dim == N_FEATURES + 16
    observe, held_out = corpus[:24], corpus[24:36]
    before, _, real = _rewards(a, held_out)
    _rewards(a, observe)  # embeds the batch at once (and fills the cache observe uses)
    for task, code, outcome in observe:
        a.observe(task, code, outcome)
        b.observe(task, code, outcome)
    after, _, _ = _rewards(a, held_out)
    assert np.mean((after - real) ** 2) < np.mean((before - real) ** 2)
    # b embedded codes one at a time, a in batches: other shapes, so other float32 summation
    # orders. Measured (torch threads 1 and 2, batches of 1 to 22, reversed order): embeddings
    # differ by <= 5.4e-7, these predictions by <= 3e-9 (4e-8 relative seen on another machine).
    # Real regressions move them by >= 5e-4: pooling over the padding (5.4e-4), no attention mask
    # (5.0e-4), embeddings paired with the wrong codes (1.9e-2). 1e-6 lies between, far from both.
    np.testing.assert_allclose(after, _rewards(b, held_out)[0], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="feature set"):
        LearnedWorldModel(seed=0).load_state_dict(a.state_dict())


def test_the_spec_default_is_the_papers_frozen_judge(corpus):
    frozen = build_world_model(WorldModelSpec(backend="learned"), None)
    online = build_world_model(WorldModelSpec(backend="learned", learn_online=True), None)
    pairs = [(t, c) for t, c, _ in corpus]
    before = frozen.predict_reward(pairs)[0]
    for task, code, outcome in corpus[:30]:
        frozen.observe(task, code, outcome)
        online.observe(task, code, outcome)
    np.testing.assert_array_equal(before, frozen.predict_reward(pairs)[0])
    assert frozen.stats["observed"] == 0 and online.stats["observed"] == 30
    assert not np.array_equal(before, online.predict_reward(pairs)[0])


def test_optimism_grows_with_complexity(corpus):
    from wmrl_demo import solutions
    from wmrl_trainer.world_model.features import code_facts
    from wmrl_trainer.world_model.learned import complexity

    def script(*names):
        return solutions.render([solutions.BY_NAME[n] for n in names])

    simple, elaborate = script("load", "linreg"), script("load", "poly_features", "rf_reg")
    assert 0.0 <= complexity(code_facts(simple)) < complexity(code_facts(elaborate)) <= 1.0
    task = next(t for t, _, _ in corpus if t.kind == "regression")
    plain = LearnedWorldModel(seed=0, learn_online=False)
    biased = LearnedWorldModel(seed=0, learn_online=False, optimism=0.3)
    lift = {code: biased.prior_reward(task, code) - plain.prior_reward(task, code) for code in (simple, elaborate)}
    assert 0.0 <= lift[simple] < lift[elaborate] <= 0.3 + 1e-12
    with pytest.raises(ValueError, match="optimism"):
        LearnedWorldModel(seed=0, optimism=1.5)


def test_a_predicted_runtime_error_names_the_line_it_would_fail_on():
    """The judge's imitation of a traceback points at the failing line (what a multi-turn agent reads)."""
    from wmrl.tasks import Task
    from wmrl_demo import solutions
    from wmrl_trainer.observation import line_kind
    from wmrl_trainer.world_model.features import code_facts

    task = Task(name="r", description="d", kind="regression", metric="r2", target="target",
                data={"train.csv": b"id,f0,target\n", "test.csv": b"id,f0\n"})
    wm = LearnedWorldModel()
    cases = {("load_wrong_path", "ridge"): ("FileNotFoundError", "load"),
             ("load", "rf_clf"): ("ValueError", "fit"),
             ("load", "ridge"): ("Exception", None)}
    for names, (error, kind) in cases.items():
        code = solutions.render([solutions.BY_NAME[n] for n in names])
        outcome = wm._outcome(0.1, code_facts(code), task, code)  # the runtime-error rung
        assert outcome.status is Status.RUNTIME_ERR and outcome.error_type == error
        assert line_kind(code, outcome.error_line) == kind
