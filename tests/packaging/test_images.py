"""Checks on the Dockerfiles by reading them (tests/images builds them for real, with buildah).

What they guard: every COPY source exists (a renamed folder breaks the build), the process runs
as a numeric non-root user (so runAsNonRoot can verify it), and there is no ENTRYPOINT: the
operator's builders give pods their whole command line (``args: [wmrl, calibration, serve, ...]``),
which an ENTRYPOINT would prefix; and the sandbox image's scientific stack (and optional torch) is
pinned to pyproject.toml's versions.
"""

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"operator/Dockerfile": ["wmrl", "operator"], "trainer/Dockerfile": ["wmrl", "launch"]}


def _instructions(path):
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in (ROOT / path).read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


@pytest.mark.parametrize("path", DOCKERFILES)
def test_copy_sources_exist(path):
    copies = [shlex.split(a) for i, a in _instructions(path) if i == "COPY"]
    assert copies
    for *sources, _dest in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"{path}: COPY {src} does not exist"


@pytest.mark.parametrize("path", DOCKERFILES)
def test_runs_as_numeric_non_root_user(path):
    users = [a for i, a in _instructions(path) if i == "USER"]
    assert users, f"{path} has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


@pytest.mark.parametrize("path,cmd", DOCKERFILES.items())
def test_default_command_and_no_entrypoint(path, cmd):
    instructions = _instructions(path)
    assert not [a for i, a in instructions if i == "ENTRYPOINT"]
    assert json.loads([a for i, a in instructions if i == "CMD"][-1]) == cmd


def test_installs_only_what_the_image_needs():
    operator_runs = " ".join(a for i, a in _instructions("operator/Dockerfile") if i == "RUN")
    assert "pip install . " in operator_runs + " " and "[train" not in operator_runs
    trainer = _instructions("trainer/Dockerfile")
    trainer_runs = " ".join(a for i, a in trainer if i == "RUN")
    assert '".[${EXTRAS}]"' in trainer_runs
    # The published image's extras stay the default; the CPU image passes EXTRAS=train.
    assert ("ARG", "EXTRAS=train,gpu") in trainer


@pytest.mark.parametrize("path,arg,default", [("operator/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim"),
                                              ("sandbox-image/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim"),
                                              ("trainer/Dockerfile", "BASE_IMAGE",
                                               "nvidia/cuda:12.9.1-cudnn-runtime-ubuntu24.04")])
def test_the_base_image_is_a_build_argument_with_the_published_default(path, arg, default):
    instructions = _instructions(path)
    assert ("ARG", f"{arg}={default}") in instructions
    assert [a for i, a in instructions if i == "FROM"] == [f"${{{arg}}}"]


def _pyproject_pins() -> dict[str, str]:
    """name -> version of every `name==version` in pyproject.toml (base and extras)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in [*project["dependencies"], *(r for reqs in project["optional-dependencies"].values() for r in reqs)]:
        name, _, version = req.partition("==")
        pins[name.strip().lower()] = version.strip()
    return pins


def test_the_sandbox_stack_is_the_dev_environments():
    """The sandbox image installs its stack from sandbox-image/wmrl_sandbox/requirements.txt, the one
    source of truth (the prompts list it): exact pins only, numpy, pandas, scipy and scikit-learn
    "pinned like the dev environment" (pyproject.toml's: results of local runs and of the cluster must
    not differ, and `pip install .` would replace numpy), the image's import check requiring every one
    of them, and torch (optional) at pyproject's version."""
    from wmrl_sandbox import libraries

    instructions = _instructions("sandbox-image/Dockerfile")
    pins = _pyproject_pins()
    copied = [a for i, a in instructions if i == "COPY" and "requirements.txt" in a]
    assert copied == ["sandbox-image/wmrl_sandbox/requirements.txt /tmp/sandbox-requirements.txt"], copied
    stack = [a for i, a in instructions if i == "RUN" and "pip install -r /tmp/sandbox-requirements.txt" in a]
    assert len(stack) == 1, "sandbox-image/Dockerfile: no single `pip install -r` of the sandbox requirements"
    assert not [a for i, a in instructions if i == "RUN" and "pip install" in a and "==" in a.split("&&")[0]], \
        "sandbox-image/Dockerfile: a package pinned outside requirements.txt"
    named = dict(libraries.pinned())  # raises on anything but name==version
    for name in ("numpy", "pandas", "scipy", "scikit-learn"):
        assert named.get(name) == pins[name], f"requirements.txt pins {name}=={named.get(name)}, pyproject.toml {pins[name]}"
    assert {"xgboost-cpu", "lightgbm"} <= set(named)
    env = " ".join(a for i, a in instructions if i == "ENV")
    assert f"WMRL_SANDBOX_REQUIRE_IMPORTS={','.join(libraries.import_names())}" in env
    torch_arg = [a for i, a in instructions if i == "ARG" and a.startswith("TORCH_VERSION=")]
    assert torch_arg == [f"TORCH_VERSION={pins['torch']}"], f"sandbox-image/Dockerfile: {torch_arg}, pyproject.toml torch=={pins['torch']}"


@pytest.mark.parametrize("path", DOCKERFILES)
def test_dependencies_install_before_the_sources_arrive(path):
    """A change to wmrl's code or README must not reinstall torch: the layer that installs the
    dependencies sees pyproject.toml alone, and the one after the sources installs with --no-deps."""
    instructions = _instructions(path)
    first_source = next(n for n, (i, a) in enumerate(instructions) if i == "COPY" and "README.md" in a)
    before = [a for i, a in instructions[:first_source] if i in ("COPY", "RUN")]
    assert [a for a in before if a.startswith("pyproject.toml")] == ["pyproject.toml ./"], f"{path}: {before}"
    assert any("pip install" in a and "--no-deps" not in a for a in before), f"{path}: no dependency layer"
    after = " ".join(a for i, a in instructions[first_source:] if i == "RUN")
    assert "pip install --no-deps ." in after, f"{path}: the sources install their dependencies again"
