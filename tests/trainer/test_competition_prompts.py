"""Prompts for real competitions: the data overview, the condensed description, what the policy and the
world model read, and the bundled suite's prompts as the tiny demo policy sees them (unchanged)."""

import random

import pytest

from wmrl import competition_text
from wmrl.collection_tasks import CollectionTask, GraderSpec, PublicFiles
from wmrl.data_overview import MAX_TOKENS, approx_tokens, count_rows, overview
from wmrl_sandbox import libraries
from wmrl_trainer.prompts import SANDBOX_LIMITS, task_prompt, world_model_messages

DESCRIPTION = """# House Prices

## Description
Predict the sale price of each house from 3 features.

## Evaluation
Submissions are evaluated on the Root-Mean-Squared-Error (RMSE) between the logarithm of the predicted
value and the logarithm of the observed sales price.

## Timeline
- January 1: entry deadline.

## Prizes
1st place: $10,000
"""


def _competition(tmp_path, rows=50, wide=0):
    public = tmp_path / "house-prices" / "public"
    (public / "images").mkdir(parents=True)
    for i in range(3):
        (public / "images" / f"{i}.jpg").write_bytes(b"\xff" * 10)
    extra = [f"x{j}" for j in range(wide)]
    header = ["Id", "LotArea", "Street", "Built", "Central", "Price", *extra]
    lines = [",".join(header)]
    for i in range(rows):
        lines.append(",".join([str(i), f"{1000 + i * 1.5}", ["Pave", "Grvl"][i % 2], f"2001-01-{1 + i % 28:02d}",
                               ["True", "False"][i % 2], "" if i % 10 == 0 else str(100 + i), *["1"] * wide]))
    (public / "train.csv").write_text("\n".join(lines) + "\n")
    (public / "test.csv").write_text("Id,LotArea\n" + "".join(f"{i},{2.5 * i}\n" for i in range(rows, rows + 20)))
    (public / "sample_submission.csv").write_text("Id,SalePrice\n" + "".join(f"{i},0.5\n" for i in range(rows, rows + 20)))
    answers = tmp_path / "house-prices" / "private" / "answers.csv"
    answers.parent.mkdir()
    answers.write_text("Id,SalePrice\n")
    return CollectionTask(
        name="house-prices", description=DESCRIPTION, kind="regression", metric="rmsle", target="SalePrice",
        id_column="Id", data=PublicFiles(public, "house-prices"), format="normalised", root=public.parent,
        public_dir=public, answers_path=answers, sample_submission_path=public / "sample_submission.csv",
        grader=GraderSpec("builtin", metric="rmsle"), answer_columns=("SalePrice",),
        submission_columns=("SalePrice",), lower_is_better=True, leaderboard=(0.1, 0.2, 0.4))


def test_the_overview_gives_files_rows_columns_types_and_the_submission_format(tmp_path):
    task = _competition(tmp_path)
    text = overview(task.public_dir, task.sample_submission_path)
    assert "  data/images/: 3 files (.jpg 3), 30 B" in text
    assert "data/train.csv: 50 rows, 6 columns" in text and "data/test.csv: 20 rows, 2 columns" in text
    for line in ("  Id: int", "  LotArea: float", "  Street: text, 2 values in the first rows ('Pave', 'Grvl')",
                 "  Built: date", "  Central: bool", "  Price: int, 5 of 50 empty"):
        assert line in text.splitlines(), (line, text)
    assert "Sample submission data/sample_submission.csv (20 rows; write submission.csv in this format):" in text
    assert "  Id,SalePrice\n  50,0.5\n  51,0.5\n  52,0.5" in text
    # train before test, the submission before both; nothing of the private answers.
    assert text.index("sample_submission") < text.index("data/train.csv:") < text.index("data/test.csv:")
    assert "answers" not in text


def test_the_overview_is_capped_in_tokens_and_says_what_it_left_out(tmp_path):
    task = _competition(tmp_path, wide=400)
    for k in range(20):  # many tables of many columns (a relational competition): past the budget
        (task.public_dir / f"table{k:02d}.csv").write_text(",".join(f"column_{k}_{j}" for j in range(40)) + "\n"
                                                            + ",".join("1.5" for _ in range(40)) + "\n")
    full = overview(task.public_dir, task.sample_submission_path, max_tokens=100_000)
    assert approx_tokens(full) > MAX_TOKENS
    capped = overview(task.public_dir, task.sample_submission_path)
    assert approx_tokens(capped) <= MAX_TOKENS
    assert capped.splitlines()[-1].startswith(f"[overview cut at {MAX_TOKENS} tokens: ")
    # A tokenizer's count can be given: here one token a word.
    words = overview(task.public_dir, task.sample_submission_path, max_tokens=60,
                     count_tokens=lambda t: len(t.split()))
    assert len(words.split()) <= 60 and "overview cut at 60 tokens" in words
    assert "  ... 366 more columns: x34, x35" in full  # 40 listed (6 named, x0..x33), the rest counted


def test_count_rows_with_and_without_a_final_newline(tmp_path):
    (tmp_path / "a.csv").write_text("h\n1\n2\n")
    (tmp_path / "b.csv").write_text("h\n1\n2")
    (tmp_path / "c.csv").write_text("h\n")
    assert [count_rows(tmp_path / n) for n in ("a.csv", "b.csv", "c.csv")] == [2, 2, 0]


def test_the_description_keeps_evaluation_and_drops_what_no_script_needs():
    text = competition_text.condense(DESCRIPTION)
    assert "## Evaluation" in text and "logarithm of the observed sales price" in text
    assert "Timeline" not in text and "$10,000" not in text and "Predict the sale price" in text
    long = DESCRIPTION.replace("from 3 features.", "from 3 features. " + "Background. " * 2000)
    cut = competition_text.condense(long, max_chars=1500)
    assert len(cut) <= 1500 and "[...]" in cut
    assert "value and the logarithm of the observed sales price." in cut  # the Evaluation section, whole


def test_a_competitions_prompt_holds_description_overview_paths_and_the_sandbox_libraries(tmp_path):
    task = _competition(tmp_path)
    text = task_prompt(task)
    assert "## Evaluation" in text and "Prizes" not in text
    assert "data/train.csv: 50 rows, 6 columns" in text and "data/sample_submission.csv" in text
    assert "header `Id,SalePrice` and one row per test id" in text
    assert "rmsle, lower is better" in text
    assert libraries.prompt_line() in text and "pandas 3.1.1" in text and "no pandas" not in text
    messages = world_model_messages(task, "print(1)")
    user = messages[-1]["content"]
    assert overview(task.public_dir, task.sample_submission_path) in user  # the same overview
    assert "## Evaluation" in user and f"Sandbox: {SANDBOX_LIMITS}." in user


def test_the_sandbox_line_lists_the_images_libraries_and_allows_pandas():
    assert "no pandas" not in SANDBOX_LIMITS
    for name, version in libraries.pinned():
        assert f"{libraries.PROMPT_NAMES.get(name, name)} {version}" in SANDBOX_LIMITS


def test_the_bundled_suite_looks_the_same_to_the_tiny_demo_policy():
    """builtin:tiny-coder reads only keywords of a prompt (kind, metric, direction, data words): the new
    library line adds none, so its warm start and the quickstart see exactly what they saw."""
    from wmrl_demo import demo_policy

    tok = demo_policy.build_tokenizer()
    rng = random.Random(5)
    for _ in range(20):
        task = demo_policy.synthetic_task(rng)
        words = tok.convert_ids_to_tokens(tok(task_prompt(task))["input_ids"])
        description = tok.convert_ids_to_tokens(tok(task.description, add_special_tokens=False)["input_ids"])
        # <bos>, the kind, the description's keywords, the score line's metric, "ranks higher": nothing else.
        assert words == ["<bos>", task.kind, *description, task.metric, "higher"]
