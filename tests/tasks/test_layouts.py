"""Loading each layout, detection, selection by task list, and bad input refused naming task and file."""

import pytest

import collections_fixture as cf
from wmrl.api.schema import TasksSpec
from wmrl.collection_tasks import CollectionTask, TaskTooLargeForUpload
from wmrl.task_layouts import detect_format, load_collection
from wmrl.tasks import TaskFormatError
from wmrl_trainer.tasks import load_tasks, split_held_out


def test_each_layout_loads_as_paths_not_bytes(tmp_path):
    cases = [(cf.spaceship_mlebench(tmp_path / "a", split=False), "mlebench"),
             (cf.spaceship_mlebench(tmp_path / "b", split=True), "mlebench"),
             (cf.leaf_mledojo(tmp_path / "c"), "mledojo"),
             (cf.bikes_rmsle(tmp_path / "n"), "normalised"),
             (cf.santander_dsbench(tmp_path / "d"), "dsbench")]
    for built, fmt in cases:
        assert detect_format(built.root, built.competitions_dir) == fmt
        (task,) = [t for t in load_collection(built.root, "auto", built.competitions_dir) if t.name == built.name]
        assert isinstance(task, CollectionTask) and task.format == fmt
        assert task.higher_is_better is built.higher_is_better
        assert task.answers_path.is_file() and task.public_dir.is_dir()
        assert task.description.strip()
        assert "sample_submission.csv" in task.data and task.public.total_bytes < 64 * 1024
        assert task.data["test.csv"].startswith(task.id_column.encode())  # small: uploadable


def test_spec_fields_and_task_list(tmp_path):
    cf.bikes_rmsle(tmp_path)
    cf.tweets_text(tmp_path)
    cf.own_grade(tmp_path)
    (tmp_path / "tasks_train.txt").write_text("# training split\n1 bike-sharing-demand\n2 tweet-sentiment\n")
    spec = TasksSpec.model_validate({"path": str(tmp_path), "format": "normalised", "taskList": "tasks_train.txt",
                                     "heldOut": ["tweet-sentiment"]})
    train, held = split_held_out(load_tasks(spec), spec.held_out)
    assert [t.name for t in train] == ["bike-sharing-demand"] and [t.name for t in held] == ["tweet-sentiment"]
    (tmp_path / "tasks_train.txt").write_text("no-such-task\n")
    with pytest.raises(TaskFormatError, match=r"no task folder\(s\) \['no-such-task'\]"):
        load_tasks(spec)
    with pytest.raises(ValueError, match="path and pvc sources only"):
        TasksSpec.model_validate({"builtin": "mini-ml", "format": "mlebench"})


def test_auto_refuses_an_ambiguous_directory(tmp_path):
    cf.spaceship_mlebench(tmp_path, split=False)  # tmp/data/spaceship-titanic (mlebench)
    cf.bikes_rmsle(tmp_path / "data")  # a normalised task beside it
    with pytest.raises(TaskFormatError, match="ambiguous layout .*mlebench: spaceship-titanic.*normalised: "
                                              "bike-sharing-demand.*spec.tasks.format"):
        load_collection(tmp_path / "data")
    assert [t.name for t in load_collection(tmp_path / "data", "normalised")] == ["bike-sharing-demand"]


def test_large_public_data_is_refused_for_upload(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    (tmp_path / built.name / "data" / "public" / "images.bin").write_bytes(b"\0" * (17 * 1024 * 1024))
    (task,) = load_collection(tmp_path)
    assert "images.bin" in task.data  # listing is fine
    with pytest.raises(TaskTooLargeForUpload, match="task bike-sharing-demand: .* 17.0 MiB.* mounted"):
        dict(task.data.items())


def test_the_small_format_is_unchanged(tmp_path):
    from wmrl.tasks import Task

    small = Task(name="t1", description="d", kind="regression", metric="rmse", target="y",
                 data={"train.csv": b"id,x,y\n1,1,1\n"}, hidden_labels=b"id,y\n2,1\n", leaderboard=(1.0,))
    for rel, content in small.to_files().items():
        (tmp_path / "t1" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "t1" / rel).write_bytes(content)
    (task,) = load_tasks(TasksSpec.model_validate({"path": str(tmp_path)}))
    assert task == small and not isinstance(task, CollectionTask)


# --------------------------------------------------------------------------- bad input


def _bad_no_answers(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    path = tmp_path / built.name / "data" / "private" / "test_answer.csv"
    path.unlink()
    return built, r"task bike-sharing-demand: no answers: .*private/test_answer.csv does not exist"


def _bad_unknown_metric(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    (tmp_path / built.name / "metric.yaml").write_text("metric: bleu-9000\n")
    return built, r"task bike-sharing-demand: unknown metric 'bleu-9000' in .*metric.yaml"


def _bad_empty_leaderboard(tmp_path):
    built = cf.tweets_text(tmp_path)
    (tmp_path / built.name / "data" / "private" / "private_leaderboard.csv").write_text("rank,score\n")
    return built, r"task tweet-sentiment: leaderboard .*private_leaderboard.csv is empty"


def _bad_sample(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    sample = tmp_path / built.name / "data" / "public" / "sample_submission.csv"
    sample.write_text("\n".join(sample.read_text().splitlines()[:-3]) + "\n")
    return built, r"task bike-sharing-demand: sample submission .*sample_submission.csv does not match the answers"


def _bad_private_under_public(tmp_path):
    built = cf.leaf_mledojo(tmp_path)
    private = built.root / built.name / "data" / "private" / "test_answer.csv"
    (built.root / built.name / "data" / "public" / "labels_copy.csv").write_bytes(private.read_bytes())
    return built, r"task leaf-classification: .*public/labels_copy.csv is a copy of the answers"


def _bad_mlebench_answers(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=True)
    (built.root / "spaceship-titanic" / "prepared" / "private" / "test.csv").unlink()
    return built, r"task spaceship-titanic: no answers \(dataset.answers in .*config.yaml\)"


def _bad_nested_private_file(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    nested = tmp_path / built.name / "data" / "public" / "extra" / "deep" / "test_answer.csv"
    nested.parent.mkdir(parents=True)
    nested.write_text("datetime,count\n")
    return built, r"task bike-sharing-demand: private file .*public/extra/deep/test_answer.csv is under public/"


def _bad_nested_copy_of_the_answers(tmp_path):
    built = cf.leaf_mledojo(tmp_path)
    private = built.root / built.name / "data" / "private" / "test_answer.csv"
    nested = built.root / built.name / "data" / "public" / "images" / "meta" / "index.csv"
    nested.parent.mkdir(parents=True)
    nested.write_bytes(private.read_bytes())
    return built, r"task leaf-classification: .*public/images/meta/index.csv is a copy of the answers"


def _bad_link_to_the_answers(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=False)
    public = built.root / built.name / "prepared" / "public"
    (public / "sub").mkdir()
    (public / "sub" / "extra.csv").symlink_to("../../private/test.csv")
    return built, r"task spaceship-titanic: .*public/sub/extra.csv is a link to the private .*private/test.csv"


def _bad_link_to_the_private_folder(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    public = built.root / built.name / "data" / "public"
    (public / "more").symlink_to(built.root / built.name / "data" / "private")
    return built, r"task bike-sharing-demand: .*public/more is a link to the private .*data/private"


def _bad_answers_format(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=False)
    competition = built.root / built.name
    (competition / "prepared" / "private" / "test.csv").rename(competition / "prepared" / "private" / "test.parquet")
    config = competition / "config.yaml"
    config.write_text(config.read_text().replace("private/test.csv", "private/test.parquet"))
    return built, r"task spaceship-titanic: answers .*test.parquet: unsupported format '.parquet'"


def _bad_jsonl_answers(tmp_path):
    built = cf.labels_jsonl_mlebench(tmp_path)
    answers = built.root / built.name / "prepared" / "private" / "test.jsonl"
    answers.write_text(answers.read_text() + "[1, 2]\n")
    return built, r"task spaceship-titanic: answers .*test.jsonl: line 81 is a list, not a JSON object"


BAD = [_bad_no_answers, _bad_unknown_metric, _bad_empty_leaderboard, _bad_sample, _bad_private_under_public,
       _bad_mlebench_answers, _bad_nested_private_file, _bad_nested_copy_of_the_answers, _bad_link_to_the_answers,
       _bad_link_to_the_private_folder, _bad_answers_format, _bad_jsonl_answers]


@pytest.mark.parametrize("make", BAD, ids=lambda f: f.__name__[5:])
def test_load_tasks_refuses_bad_input(tmp_path, make):
    built, message = make(tmp_path)
    spec = {"path": str(built.root)}
    if built.competitions_dir:
        spec["competitionsDir"] = str(built.competitions_dir)
    with pytest.raises(TaskFormatError, match=message):
        load_tasks(TasksSpec.model_validate(spec))


def test_a_declared_category_is_read_else_the_public_files_tell(tmp_path):
    from wmrl.task_category import category_of

    cf.bikes_rmsle(tmp_path / "n")
    cf.tweets_text(tmp_path / "n")
    (tmp_path / "n" / "tweet-sentiment" / "metric.yaml").write_text("metric: f1_macro\ncategory: text\n")
    bikes, tweets = load_collection(tmp_path / "n", "normalised")
    assert (bikes.category, tweets.category) == ("", "text")
    assert (category_of(bikes), category_of(tweets)) == ("tabular", "text")  # bikes: inferred from its CSVs
    built = cf.spaceship_mlebench(tmp_path / "m", split=False)
    config = built.root / built.name / "config.yaml"
    config.write_text(config.read_text() + "category: tabular\n")
    (spaceship,) = load_collection(built.root)
    assert spaceship.category == "tabular"
    config.write_text(config.read_text().replace("category: tabular", "category: speech"))
    with pytest.raises(TaskFormatError, match=r"category in .*config.yaml must be one of \['tabular', 'text', "
                                              r"'image', 'other'\], got 'speech'"):
        load_collection(built.root)
