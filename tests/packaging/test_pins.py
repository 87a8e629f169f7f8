"""The pins in pyproject.toml install together.

The trainer image runs ``pip install ".[train,gpu]"`` (trainer/Dockerfile) and ``make venv`` runs
``pip install ".[train,dev]"``. The slow tests ask pip to resolve each set in a new virtual
environment with a pinned pip (``--dry-run --ignore-installed``: nothing is installed, nothing on
this machine is consulted but the package index), and read TRL's declared vLLM range from pip's
installation report, not from whatever TRL happens to be installed here. ``.[train]`` alone is a
subset of both, so it resolves when they do.

Without PEP 658 metadata on the index pip downloads every wheel it considers: the
``.[train,gpu]`` dry-run fetches about 3 GB (torch, vLLM, the CUDA wheels) and took 106-164 s here.
"""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The pip that resolves; pinned so that the answer does not depend on the interpreter's bundled pip.
PIP = "26.3"
# A vLLM outside TRL's declared `vllm` extra range is allowed only when named here and explained
# in docs/trainer.md ("Supported versions"). None: the pinned vLLM is inside TRL's range.
VLLM_OUTSIDE_TRL_RANGE: str | None = None
# What the trainer image installs: the base dependencies plus these extras.
IMAGE_EXTRAS = ("train", "gpu")


def _pins(extra=None):
    """The requirements of ``extra``, or the base dependencies for None."""
    project = PYPROJECT["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


def _pinned_version(name):
    for extra in (None, *IMAGE_EXTRAS):
        for req in _pins(extra):
            if canonicalize_name(req.name) == name:
                (spec,) = req.specifier
                return spec.version
    raise AssertionError(f"{name} is not pinned in pyproject.toml")


def test_image_pins_are_exact():
    """Every requirement the trainer image installs is one `==` pin: a range would let the image
    resolve to versions no one tested."""
    for extra in (None, *IMAGE_EXTRAS):
        for req in _pins(extra):
            specs = list(req.specifier)
            where = "dependencies" if extra is None else f"[{extra}]"
            assert len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version, (
                f"{where}: {req} is not an exact pin (want name==X.Y.Z)"
            )
            assert not req.marker and not req.extras, f"{where}: {req} carries a marker or extras"


def test_docs_state_the_pinned_matrix():
    """docs/trainer.md's "Supported versions" table names the versions pyproject.toml pins."""
    text = (ROOT / "docs" / "trainer.md").read_text()
    assert "## Supported versions" in text
    section = text.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    for name in ("vllm", "trl", "torch", "transformers", "accelerate", "tokenizers", "numpy"):
        row = next((line for line in section.splitlines() if line.startswith(f"| {name} ")), None)
        assert row is not None, f"docs/trainer.md: no '| {name} |' row in Supported versions"
        version = _pinned_version(name)
        assert f"| {version} |" in row, f"docs/trainer.md: {row!r} does not state {name} {version}"


@pytest.fixture(scope="module")
def resolver(tmp_path_factory):
    """A new venv with pip==PIP; returns a function that dry-runs ``.[extras]`` and gives back
    (completed process, installation report or None)."""
    venv = tmp_path_factory.mktemp("pins-venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    up = subprocess.run([python, "-m", "pip", "install", "--quiet", f"pip=={PIP}"],
                        env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, f"could not install pip=={PIP} into the test venv:\n{up.stderr[-3000:]}"
    done = {}

    def dry_run(extras):
        if extras not in done:
            report = tmp_path_factory.mktemp("pins-report") / "report.json"
            proc = subprocess.run(
                [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--progress-bar", "off",
                 "--report", str(report), f".[{extras}]"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
            )
            done[extras] = (proc, json.loads(report.read_text()) if proc.returncode == 0 else None)
        return done[extras]

    return dry_run


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("extras", ["train,gpu", "train,dev"])
def test_extras_resolve(resolver, extras):
    proc, report = resolver(extras)
    assert proc.returncode == 0, (
        f'pip install --dry-run ".[{extras}]" did not resolve (exit {proc.returncode}).\n'
        f"pip's stderr (tail):\n{proc.stderr[-3000:]}\n"
        f"pip's stdout (tail, the conflict's cause):\n{proc.stdout[-3000:]}"
    )
    installed = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    for extra in (None, *extras.split(",")):
        for req in _pins(extra):
            got = installed.get(canonicalize_name(req.name))
            assert got is not None and got in req.specifier, f"{req} resolved to {got}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_vllm_is_in_trls_declared_range(resolver):
    """TRL declares the vLLM versions it supports in its `vllm` extra; the pinned vLLM is inside
    that range, or is the documented exception."""
    proc, report = resolver("train,gpu")
    assert proc.returncode == 0, f'".[train,gpu]" did not resolve (see test_extras_resolve):\n{proc.stderr[-3000:]}'
    meta = {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    vllm, trl = Version(meta["vllm"]["version"]), meta["trl"]
    requires = [Requirement(r) for r in trl.get("requires_dist", [])]
    declared = [
        r for r in requires if canonicalize_name(r.name) == "vllm" and r.marker and r.marker.evaluate({"extra": "vllm"})
    ]
    assert declared, f"trl {trl['version']} declares no vllm requirement in its vllm extra"
    outside = [str(r.specifier) for r in declared if not r.specifier.contains(vllm, prereleases=True)]
    if VLLM_OUTSIDE_TRL_RANGE is None:
        assert not outside, f"vllm {vllm} is outside trl {trl['version']}'s declared range {outside}"
    else:
        assert str(vllm) == VLLM_OUTSIDE_TRL_RANGE, f"vllm {vllm} is not the documented exception"
