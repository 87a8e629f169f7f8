"""The figures of a held-out evaluation (pure): per task, per category, overall; the task categories;
and the reports drawn from them (Markdown, curves over steps and compute, plots)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.outcome import Outcome, Status
from wmrl.task_category import category_of, has_free_text, infer_category
from wmrl.tasks import Task, TaskFormatError, from_files
from wmrl_trainer.eval_figures import aggregate, best_valid, task_figures
from wmrl_trainer.eval_report import (compute_axis, curves, curves_markdown, load_eval_points, plot_curves,
                                      plot_report, report_markdown)
from wmrl_trainer.evaluation import summarize
from wmrl_trainer.turns import Trajectory


def _task(name="t", category="") -> Task:
    return Task(name=name, description="d", kind="classification", metric="accuracy", target="y", category=category)


def _trajectory(task: Task, *outcomes: Outcome | None) -> Trajectory:
    """A trajectory of real-graded turns (an anchor trajectory sees the real grade), ended after them."""
    t = Trajectory(task, anchor=True)
    for n, outcome in enumerate(outcomes):
        t.add_turn(f"code {n}", world_model=None, real=outcome, anchor=True)
        if t.done:
            break
    t.end("turns")
    return t


def valid(position: float, medal: str | None = None) -> Outcome:
    return Outcome(status=Status.VALID, rank_score=position, medal=medal)


CRASH = Outcome(status=Status.RUNTIME_ERR)
NO_SUB = Outcome(status=Status.RAN_NO_SUB)


# ---------------------------------------------------------------- against a hand computation

def test_figures_per_task_category_and_overall_match_a_hand_computation():
    """Two tabular tasks and one text task, 4 samples each, 2 turns (a trajectory's best turn counts).

    a (tabular): best positions 0.6 (turn 2 after a crash), 0.2, invalid, invalid
       valid rate 2/4 = 0.5; mean best position (0.6 + 0.2) / 2 = 0.4; percentile 0.5 x 0.4 = 0.2;
       best-turn rewards 0.8, 0.6, 0.1 (crash, crash), 0.2 (no submission) -> mean 1.7 / 4 = 0.425
    b (tabular): positions 1.0, 0.5, 0.5, 0.0 (all valid)
       valid rate 1; mean best position 0.5; percentile 0.5; rewards 1.0, 0.75, 0.75, 0.5 -> 0.75
    c (text): nothing valid: valid rate 0, mean best position None, percentile 0, rewards 0.1 x 4 -> 0.1
    tabular: valid rate 0.75, reward 0.5875, mean best position 0.45, percentile 0.35
    overall: valid rate 0.5, reward (0.425 + 0.75 + 0.1) / 3 = 0.425, mean best position (over a and b) 0.45,
             percentile (0.2 + 0.5 + 0) / 3 = 0.2333...
    """
    a, b, c = _task("a", "tabular"), _task("b", "tabular"), _task("c", "text")
    trajectories = [
        _trajectory(a, CRASH, valid(0.6)), _trajectory(a, valid(0.2), CRASH), _trajectory(a, CRASH, CRASH),
        _trajectory(a, NO_SUB, CRASH),
        _trajectory(b, valid(1.0)), _trajectory(b, valid(0.5), valid(0.3)), _trajectory(b, valid(0.5)),
        _trajectory(b, valid(0.0)),
        *[_trajectory(c, CRASH, CRASH) for _ in range(4)],
    ]
    point = summarize([a, b, c], trajectories, failures=[], executed=20, seconds=1.0, max_turns=2)
    ta, tb, tc = (point["tasks"][n] for n in "abc")
    assert (ta["valid_rate"], ta["mean_best_position"], ta["percentile"]) == (0.5, pytest.approx(0.4), pytest.approx(0.2))
    assert ta["mean_reward"] == pytest.approx(0.425) and ta["best_position"] == 0.6
    assert (tb["valid_rate"], tb["mean_best_position"], tb["percentile"], tb["mean_reward"]) == (1.0, 0.5, 0.5, 0.75)
    assert (tc["valid_rate"], tc["mean_best_position"], tc["percentile"]) == (0.0, None, 0.0)
    assert tc["mean_reward"] == pytest.approx(0.1)
    assert list(point["by_category"]) == ["tabular", "text"]  # in CATEGORIES order, only those present
    tab = point["by_category"]["tabular"]
    assert tab == {"tasks": 2, "valid_rate": 0.75, "mean_reward": pytest.approx(0.5875),
                   "mean_best_position": pytest.approx(0.45), "percentile": pytest.approx(0.35), "any_medal": None}
    overall = point["overall"]
    assert overall["tasks"] == 3 and overall["valid_rate"] == pytest.approx(0.5)
    assert overall["mean_reward"] == pytest.approx(0.425) and overall["mean_best_position"] == pytest.approx(0.45)
    assert overall["percentile"] == pytest.approx(0.7 / 3)
    assert point["reward"] == pytest.approx((1.7 + 3.0 + 0.4) / 12)  # pooled: equal samples, so the task mean too


def test_medals_are_each_trajectorys_best_and_shares_of_all_trajectories():
    t = _task("m")
    trajectories = [_trajectory(t, valid(0.4, "bronze"), valid(0.55, "gold")), _trajectory(t, valid(0.8, "silver")),
                    _trajectory(t, valid(0.5)), _trajectory(t, CRASH)]
    assert best_valid(trajectories[0]) == (0.55, "gold") and best_valid(trajectories[3]) == (None, None)
    figures = task_figures(trajectories, category="tabular", has_medals=True)
    assert figures["medals"] == {"gold": 0.25, "silver": 0.25, "bronze": 0.0, "any": 0.5}
    assert task_figures(trajectories)["medals"] is None  # no medal leaderboard: not zero, not applicable
    assert aggregate({"m": figures})["overall"]["any_medal"] == 0.5


def test_a_task_not_all_graded_has_no_figures_and_nothing_is_averaged():
    t, u = _task("t"), _task("u")
    figures = task_figures([_trajectory(t, valid(0.5)), _trajectory(t, None)])
    assert not figures["complete"] and figures["graded"] == 1
    assert all(figures[k] is None for k in ("mean_reward", "valid_rate", "mean_best_position", "percentile"))
    assert task_figures([])["complete"] is False
    whole = task_figures([_trajectory(u, valid(0.5))])
    assert aggregate({"t": figures, "u": whole}) == {"overall": None, "by_category": None}


# ---------------------------------------------------------------- properties

_OUTCOME = st.one_of(
    st.sampled_from([CRASH, NO_SUB, Outcome(status=Status.SYNTAX_ERR)]),
    st.builds(valid, st.floats(0.0, 1.0), st.sampled_from([None, "gold", "silver", "bronze"])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_OUTCOME, min_size=1, max_size=3), min_size=1, max_size=12))
def test_percentile_is_the_mean_best_position_with_invalid_trajectories_at_zero(turns):
    task = _task()
    trajectories = [_trajectory(task, *outcomes) for outcomes in turns]
    figures = task_figures(trajectories, has_medals=True)
    best = [best_valid(t)[0] for t in trajectories]
    assert figures["percentile"] == pytest.approx(sum(p or 0.0 for p in best) / len(best))
    assert 0.0 <= figures["percentile"] <= figures["valid_rate"] <= 1.0
    if figures["mean_best_position"] is not None:
        assert figures["percentile"] == pytest.approx(figures["valid_rate"] * figures["mean_best_position"])
    assert figures["medals"]["any"] == pytest.approx(sum(figures["medals"][m] for m in ("gold", "silver", "bronze")))
    assert figures["medals"]["any"] <= figures["valid_rate"] + 1e-12
    # Each trajectory's reward is its best turn's; the best valid turn's reward is 0.5 + 0.5 x its position.
    assert figures["mean_reward"] == pytest.approx(sum(t.reward("real") for t in trajectories) / len(trajectories))
    for t, position in zip(trajectories, best):
        if position is not None:
            assert t.reward("real") == pytest.approx(0.5 + 0.5 * position)


_FIGURES = st.fixed_dictionaries({
    "category": st.sampled_from(["tabular", "text", "image", "other"]), "complete": st.just(True),
    "valid_rate": st.floats(0, 1), "mean_reward": st.floats(0, 1), "percentile": st.floats(0, 1),
    "mean_best_position": st.one_of(st.none(), st.floats(0, 1)),
    "medals": st.one_of(st.none(), st.builds(lambda x: {"any": x}, st.floats(0, 1))),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(_FIGURES, min_size=1, max_size=10))
def test_overall_is_the_task_mean_and_the_task_weighted_mean_of_the_categories(tasks):
    per_task = {f"t{i}": t for i, t in enumerate(tasks)}
    out = aggregate(per_task)
    overall, by_category = out["overall"], out["by_category"]
    assert overall["tasks"] == len(tasks) == sum(c["tasks"] for c in by_category.values())
    for name in ("valid_rate", "mean_reward", "percentile"):
        assert overall[name] == pytest.approx(sum(t[name] for t in tasks) / len(tasks))
        weighted = sum(c[name] * c["tasks"] for c in by_category.values()) / len(tasks)
        assert overall[name] == pytest.approx(weighted)
    positions = [t["mean_best_position"] for t in tasks if t["mean_best_position"] is not None]
    assert (overall["mean_best_position"] is None) == (not positions)
    medals = [t["medals"]["any"] for t in tasks if t["medals"]]
    assert overall["any_medal"] == (pytest.approx(sum(medals) / len(medals)) if medals else None)


# ---------------------------------------------------------------- categories

def test_declared_categories_win_and_an_unknown_one_is_refused_naming_the_field():
    files = _task("x", "image").to_files()
    files["data/train.csv"] = b"id,a\n1,2\n"
    assert from_files(files).category == "image" and category_of(from_files(files)) == "image"
    files["task.yaml"] = files["task.yaml"].replace(b"category: image", b"category: audio")
    with pytest.raises(TaskFormatError, match="task.yaml: category must be one of"):
        from_files(files)


PROSE = "the quick brown fox jumps over the lazy dog again and again"


@pytest.mark.parametrize("paths, heads, category", [
    ([f"train/{i}.jpg" for i in range(12)] + ["train.csv"], {"train.csv": "id,label\n1,cat\n"}, "image"),
    (["a.png", "labels.csv"], {"labels.csv": "id,label\n1,0\n"}, "tabular"),  # one picture among tables
    (["images/a.png", "images/b.png", "train.csv"], {}, "image"),  # most data files are pictures
    ([f"clip{i}.wav" for i in range(3)] + ["train.csv"], {}, "other"),
    (["train.csv", "test.csv"], {"train.csv": "id,text,y\n" + "".join(f'{i},"{PROSE}",1\n' for i in range(5))}, "text"),
    (["train.tsv"], {"train.tsv": "id\ttext\n" + "".join(f"{i}\t{PROSE}\n" for i in range(5))}, "text"),
    (["train.csv", "test.csv", "description.md"], {"train.csv": "id,Name,y\n1,\"Braund, Mr. Owen\",0\n"
                                                   "2,\"Cumings, Mrs. John\",1\n3,\"Heikkinen, Miss. Laina\",1\n"},
     "tabular"),
    (["train.parquet"], {}, "tabular"),
    (["corpus.txt", "more.jsonl", "sample_submission.csv"], {}, "text"),  # the sample submission is no data
    (["model.bin", "description.md"], {}, "other"),
])
def test_categories_are_inferred_from_the_public_files(paths, heads, category):
    assert infer_category(paths, heads) == category


def test_free_text_ignores_a_row_cut_off_by_the_head():
    head = "id,text\n" + "".join(f'{i},"{PROSE}"\n' for i in range(4)) + '4,"the quick br'
    assert has_free_text(head) and not has_free_text("id,x\n1,2\n2,3\n3,4\n")


def test_the_bundled_suite_is_tabular():
    from wmrl_demo.suite import builtin_suite

    assert {category_of(t) for t in builtin_suite("mini-ml")} == {"tabular"}


# ---------------------------------------------------------------- reports

def _point(step, percentile_tab, percentile_text, complete=True, compute=None):
    point = {"step": step, "complete": complete, "partial": None if complete else "1 of 2 trajectories graded: boom",
             "reward": 0.6 if complete else None}
    if complete:
        point["overall"] = {"percentile": (percentile_tab + percentile_text) / 2}
        point["by_category"] = {"tabular": {"percentile": percentile_tab}, "text": {"percentile": percentile_text}}
    if compute is not None:
        point["compute"] = compute
    return point


def test_curves_by_category_over_steps_and_compute_list_partial_points_apart(tmp_path):
    points = [_point(0, 0.1, 0.3, compute={"train_seconds": 0.0, "gpus": 8, "gpu_hours": 0.0}),
              _point(5, 0.0, 0.0, complete=False, compute={"train_seconds": 60.0, "gpus": 8, "gpu_hours": 0.13}),
              _point(10, 0.3, 0.5, compute={"train_seconds": 3600.0, "gpus": 8, "gpu_hours": 8.0})]
    for point in points:
        (tmp_path / f"step-{point['step']}.json").write_text(json.dumps(point))
    (tmp_path / "curve.png").write_bytes(b"not a report")  # other files are ignored
    loaded = load_eval_points(tmp_path)
    assert [p["step"] for p in loaded] == [0, 5, 10]
    curve = curves(loaded)
    assert curve["steps"] == [0, 10] and curve["compute"] == [0.0, 8.0] and curve["compute_label"] == "GPU-hours of training"
    assert curve["by_category"] == {"tabular": [0.1, 0.3], "text": [0.3, 0.5]}
    assert curve["overall"] == [pytest.approx(0.2), pytest.approx(0.4)]
    assert curve["partial"] == [{"step": 5, "why": "1 of 2 trajectories graded: boom"}]
    table = curves_markdown(curve)
    assert "| 10 | 8 | 0.600 | 0.400 | 0.300 | 0.500 |" in table and "Step 5: no point (1 of 2" in table
    plot_curves(curve, tmp_path / "out.png")
    assert (tmp_path / "out.png").stat().st_size > 5000


def test_the_compute_axis_is_gpu_hours_else_trainer_seconds_else_none():
    gpu = {"compute": {"train_seconds": 10.0, "gpu_hours": 1.0}}
    cpu = {"compute": {"train_seconds": 10.0, "gpu_hours": None}}
    assert compute_axis([gpu, gpu])[0] == "gpu_hours"
    assert compute_axis([gpu, cpu])[0] == "train_seconds"
    assert compute_axis([cpu, {}]) == (None, None)


def test_a_folder_without_reports_or_with_a_broken_one_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="no held-out reports"):
        load_eval_points(tmp_path)
    (tmp_path / "step-3.json").write_text("{not json")
    with pytest.raises(ValueError, match="step-3.json: not a held-out report"):
        load_eval_points(tmp_path)


def test_the_report_markdown_and_plot_say_partial_and_show_no_result(tmp_path):
    t = _task("t", "tabular")
    point = summarize([t], [_trajectory(t, valid(0.5)), _trajectory(t, None)], failures=["execution of a t script "
                      "failed: SandboxUnavailable: down"], executed=2, seconds=1.0, max_turns=1)
    report = {**point, "policy": "p", "checkpoint": None, "samples_per_task": 2, "max_turns": 1, "temperature": 1.0,
              "seed": 0, "tasks_source": "builtin mini-ml"}
    text = report_markdown(report)
    assert "**PARTIAL: 1 of 2 trajectories graded: execution of a t script failed: SandboxUnavailable: down.**" in text
    assert "| t | tabular | 1/2 | n/a | n/a | n/a | n/a | n/a |" in text and "overall" not in text
    plot_report(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 5000
