"""Leaderboards: direction from the order, position (fraction beaten), MLE-bench's medal thresholds."""

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl import leaderboards as lb
from wmrl.tasks import TaskFormatError


def _write(tmp_path, frame, name="board.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_kaggle_export_and_rank_score_files(tmp_path):
    kaggle = lb.read_leaderboard(_write(tmp_path, pd.DataFrame({"teamId": [1, 2, 3], "score": [0.9, None, 0.7]})),
                                 "leaderboard", "task t")
    assert kaggle.scores == (0.9, 0.7) and kaggle.higher_is_better is True
    dojo = lb.read_leaderboard(_write(tmp_path, pd.DataFrame({"rank": [2, 1, 3], "score": [0.2, 0.1, 0.5]})),
                               "private", "task t")
    assert dojo.scores == (0.1, 0.2, 0.5) and dojo.higher_is_better is False


def test_empty_leaderboard_is_refused(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("rank,score\n")
    with pytest.raises(TaskFormatError, match="task t: leaderboard .* is empty"):
        lb.read_leaderboard(path, "private", "task t")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=40), st.floats(-100, 100), st.booleans())
def test_position_is_the_fraction_beaten_or_tied(scores, score, higher):
    board = lb.Leaderboard("private", tuple(sorted(scores, reverse=higher)))
    beaten = sum(score >= s if higher else score <= s for s in scores)
    assert lb.position(score, [board], higher) == pytest.approx(beaten / len(scores))


def test_medal_thresholds_follow_mlebench():
    # 40 teams (< 100): gold at position int(4) -> 4th, silver int(8) -> 8th, bronze int(16) -> 16th
    board = lb.Leaderboard("leaderboard", tuple(float(100 - i) for i in range(40)))
    t = lb.medal_thresholds(board, True)
    assert (t.gold, t.silver, t.bronze) == (97.0, 93.0, 85.0)
    assert lb.medal(97.0, board, True) == "gold"
    assert lb.medal(96.0, board, True) == "silver"
    assert lb.medal(85.0, board, True) == "bronze"
    assert lb.medal(84.9, board, True) is None
    # 500 teams: gold at 10 + int(1) = 11th, silver 50th, bronze 100th; lower is better
    big = lb.Leaderboard("leaderboard", tuple(float(i) for i in range(500)))
    t = lb.medal_thresholds(big, False)
    assert (t.gold, t.silver, t.bronze) == (10.0, 49.0, 99.0)
    assert lb.above_median(200.0, big, False) and not lb.above_median(300.0, big, False)
