"""The image cache keys and the Dockerfile reading behind them (pure functions: fast, no builder)."""

from pathlib import Path

import pytest

import image_keys
from image_keys import IMAGES, ImageSpec, copy_sources, image_key, instructions
from images import REPO, context_files

SPEC = ImageSpec("demo", "Dockerfile", "docker.io/wmrl/demo:dev", "PYTHON_IMAGE")
DOCKERFILE = """\
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
COPY pyproject.toml README.md ./
COPY pkg ./pkg
RUN pip install .
"""


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    files = {"Dockerfile": DOCKERFILE, "pyproject.toml": "[project]\nname = 'demo'\n", "README.md": "demo\n",
             "pkg/__init__.py": "", "pkg/sub/mod.py": "X = 1\n", "docs/notes.md": "not copied\n",
             "setup.cfg": "not copied either\n"}
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    return tmp_path


def _key(repo: Path) -> str:
    return image_key(SPEC, (repo / SPEC.dockerfile).read_text(), context_files(SPEC, repo), "sha256:base")


def test_the_key_changes_when_a_copied_file_changes(tmp_path):
    repo = _repo(tmp_path)
    before = _key(repo)
    assert _key(repo) == before  # deterministic
    (repo / "pkg" / "sub" / "mod.py").write_text("X = 2\n")
    assert _key(repo) != before


def test_the_key_changes_when_a_file_is_added_to_a_copied_folder_or_renamed(tmp_path):
    repo = _repo(tmp_path)
    before = _key(repo)
    (repo / "pkg" / "new.py").write_text("")
    added = _key(repo)
    assert added != before
    (repo / "pkg" / "new.py").rename(repo / "pkg" / "other.py")
    assert _key(repo) not in (before, added)


def test_the_key_ignores_files_the_dockerfile_does_not_copy_and_bytecode(tmp_path):
    repo = _repo(tmp_path)
    before = _key(repo)
    (repo / "docs" / "notes.md").write_text("changed\n")
    (repo / "setup.cfg").write_text("changed\n")
    (repo / "pkg" / "__pycache__").mkdir()
    (repo / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (repo / "pkg" / "demo.egg-info").mkdir()
    (repo / "pkg" / "demo.egg-info" / "PKG-INFO").write_text("x")
    assert _key(repo) == before


def test_the_key_changes_with_the_dockerfile_the_base_and_the_build_arguments(tmp_path):
    repo = _repo(tmp_path)
    files = context_files(SPEC, repo)
    key = image_key(SPEC, DOCKERFILE, files, "sha256:base")
    assert image_key(SPEC, DOCKERFILE + "USER 1000\n", files, "sha256:base") != key
    assert image_key(SPEC, DOCKERFILE, files, "sha256:other-base") != key
    with_args = ImageSpec(SPEC.name, SPEC.dockerfile, SPEC.ref, SPEC.base_arg, {"EXTRAS": "train"})
    assert image_key(with_args, DOCKERFILE, files, "sha256:base") != key
    retagged = ImageSpec(SPEC.name, SPEC.dockerfile, "docker.io/wmrl/demo:other", SPEC.base_arg)
    assert image_key(retagged, DOCKERFILE, files, "sha256:base") != key
    with pytest.raises(ValueError, match="base_id"):
        image_key(SPEC, DOCKERFILE, files, "")


def test_a_missing_copy_source_is_named(tmp_path):
    repo = _repo(tmp_path)
    (repo / "README.md").unlink()
    with pytest.raises(FileNotFoundError, match="README.md"):
        context_files(SPEC, repo)


def test_copy_sources_reads_flags_json_continuations_and_skips_other_stages():
    text = """\
# comment
FROM base AS build
COPY --chown=1:1 a.txt \\
     b/ /dst/
ADD ["c d.txt", "/dst/"]
COPY --from=build /opt/x /opt/x
ADD https://example.invalid/f.tar /f.tar
copy a.txt e /dst/
"""
    assert copy_sources(text) == ["a.txt", "b", "c d.txt", "e"]
    [(word, args)] = instructions("RUN a \\\n  # inside\n  && b\n")
    assert (word, args.split()) == ("RUN", ["a", "&&", "b"])


@pytest.mark.parametrize("line,message", [("COPY ../secret /x", "outside the build context"),
                                          ("COPY /etc/passwd /x", "outside the build context"),
                                          ("COPY onlyone", "source and a destination"),
                                          ('COPY ["a", ', "not a JSON array")])
def test_copy_sources_rejects_what_a_build_cannot_copy(line, message):
    with pytest.raises(ValueError, match=message):
        copy_sources(line + "\n")


def test_the_real_images_copy_the_package_sources_and_nothing_else():
    for spec in IMAGES.values():
        files = context_files(spec)
        assert "pyproject.toml" in files and "README.md" in files
        assert any(f.startswith("wmrl/api/") for f in files), spec.name
        assert not [f for f in files if f.startswith(("tests/", "docs/", ".git/"))], spec.name
        assert not [f for f in files if image_keys.is_ignored(f)], spec.name
    # wmrl_demo (the CPU policy) is in the trainer images only.
    assert any(f.startswith("trainer/wmrl_demo/") for f in context_files(IMAGES["trainer-cpu"]))
    assert not any(f.startswith("trainer/wmrl_demo/") for f in context_files(IMAGES["operator"]))


def test_dockerignore_excludes_what_the_keys_ignore():
    lines = (REPO / ".dockerignore").read_text().split()
    assert [name for name in image_keys.IGNORED_NAMES if f"**/{name}" not in lines] == []


def test_the_base_key_follows_its_inputs():
    args = ("FROM scratch\n", "bookworm", "http://deb.debian.org/debian", "http://deb.debian.org/debian-security",
            ("python3", "ca-certificates"), "ca1")
    key = image_keys.base_key(*args)
    assert image_keys.base_key(*args[:4], ("ca-certificates", "python3"), "ca1") == key  # package order is no input
    assert image_keys.base_key(*args[:5], "ca2") != key
    assert image_keys.base_key(args[0], args[1], "http://mirror.invalid/debian", *args[3:]) != key
    assert image_keys.base_key("FROM scratch\nENV A=1\n", *args[1:]) != key


def test_select_names_an_unknown_image():
    assert [s.name for s in image_keys.select(["sandbox", "operator"])] == ["sandbox", "operator"]
    with pytest.raises(ValueError, match="'trainer-gpu'.*known: operator, sandbox"):
        image_keys.select(["trainer-gpu"])


def test_the_cpu_trainer_keeps_the_dockerfile_defaults_for_the_published_trainer():
    cpu, gpu = IMAGES["trainer-cpu"], IMAGES["trainer"]
    assert cpu.dockerfile == gpu.dockerfile == "trainer/Dockerfile"
    assert cpu.build_args["EXTRAS"] == "train" and "torch" not in cpu.build_args["PRUNE"].split()
    assert dict(gpu.build_args) == {}  # the Dockerfile's defaults: train,gpu, nothing pruned
    assert all(spec.ref.startswith("docker.io/wmrl/") for spec in IMAGES.values())


def test_a_build_that_would_fill_the_disk_is_refused_naming_the_space(tmp_path, monkeypatch):
    import images
    monkeypatch.setitem(images.BUILD_SPACE_GIB, "huge", 10**9)  # more than any disk has
    with pytest.raises(RuntimeError, match=r"GiB free under .*building huge needs about 1000000000 GiB"):
        images.check_free_space(tmp_path, "huge")
    images.check_free_space(tmp_path, "tiny-image-with-no-estimate")  # the 3 GiB default: this disk has it
