"""Links in a public directory and the per-execution upload: a link that leads outside the public directory
(to the private answers beside it, say) is never read or uploaded; the upload is refused naming the file.

The loader refuses a link to the answers outright (test_layouts.py); these links get past it: one
planted after the task was loaded (as a run goes on), one to a file outside the task that is not the
answers, one to a folder outside. A real sandbox server runs the uploads that are allowed.
"""

import os

import pytest

import collections_fixture as cf
from wmrl.collection_tasks import UnsafePublicLink, list_public
from wmrl.task_layouts import load_collection
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_sandbox.local import LocalServer

READ_ALL = """
import os
for base, _, files in os.walk('data'):
    for name in sorted(files):
        print(os.path.join(base, name), open(os.path.join(base, name)).read().replace('\\n', '|'))
"""


def _spaceship(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=False)
    competition = built.root / built.name / "prepared"
    return built, competition / "public", competition / "private" / "test.csv"


def test_a_link_to_the_answers_planted_after_loading_is_not_uploaded(tmp_path):
    built, public, answers = _spaceship(tmp_path)
    (task,) = load_collection(built.root)
    (public / "nested").mkdir()
    os.symlink(answers, public / "nested" / "leak.csv")
    fresh = task.public.__class__(task.public_dir, task.name)  # a new listing sees the link
    with pytest.raises(UnsafePublicLink, match=r"task spaceship-titanic: public file .*public/nested/leak.csv is a "
                                               r"link to .*private/test.csv, outside the public directory"):
        dict(fresh.items())
    with pytest.raises(UnsafePublicLink, match="nested/leak.csv"):
        fresh["nested/leak.csv"]
    # The listing made before the link existed: reading through it still checks where the file leads.
    os.unlink(public / "train.csv")
    os.symlink(answers, public / "train.csv")
    with pytest.raises(UnsafePublicLink, match=r"public file .*public/train.csv is a link to .*private/test.csv"):
        task.data["train.csv"]


def test_links_leading_outside_are_refused_through_the_dispatcher(tmp_path):
    built, public, answers = _spaceship(tmp_path)
    outside = tmp_path / "shared"
    outside.mkdir()
    (outside / "big.csv").write_text("a,b\n1,2\n")
    os.symlink(outside / "big.csv", public / "big.csv")
    os.symlink(outside, public / "shared")
    (task,) = load_collection(built.root)  # links away from the private folder: the loader lets them be
    listing = list_public(public)
    assert [name for name, _ in listing.escaping] == ["big.csv", "shared"]
    assert "big.csv" not in dict(listing.files) and not any(n.startswith("shared/") for n, _ in listing.files)
    with SandboxDispatcher(StaticEndpoints(["http://127.0.0.1:9"]), timeout=5) as dispatcher:
        with pytest.raises(UnsafePublicLink, match=r"public file .*public/big.csv is a link to .*shared/big.csv"):
            dispatcher.run_task(task, READ_ALL)


def test_links_inside_the_public_directory_upload_and_loops_end(tmp_path):
    built, public, answers = _spaceship(tmp_path)
    (public / "folder").mkdir()
    (public / "folder" / "note.txt").write_text("public note\n")
    os.symlink("../train.csv", public / "folder" / "train-again.csv")
    os.symlink("..", public / "folder" / "loop")  # back to the public directory: entered once
    os.symlink("missing.csv", public / "dangling.csv")
    (task,) = load_collection(built.root)
    names = [name for name, _ in task.public.listing]
    assert "folder/train-again.csv" in names and "folder/note.txt" in names and "dangling.csv" not in names
    assert not [n for n in names if "loop" in n] and not task.public.escaping_links
    with LocalServer(slots=1) as server, SandboxDispatcher(StaticEndpoints([server.url]), timeout=60) as dispatcher:
        response = dispatcher.run(READ_ALL, {f"data/{k}": v for k, v in task.data.items()}).result(timeout=120)
    out = response["run_result"]["stdout"]
    assert "data/folder/note.txt public note|" in out
    train = (public / "train.csv").read_text().replace("\n", "|")
    assert f"data/folder/train-again.csv {train}" in out and f"data/train.csv {train}" in out
    assert answers.read_text().splitlines()[1] not in out  # no answer row reached the execution
