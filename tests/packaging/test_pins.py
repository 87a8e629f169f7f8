"""The pins in pyproject.toml install together.

The trainer image runs ``pip install ".[train,gpu]"`` (trainer/Dockerfile) and ``make venv`` runs
``pip install ".[train,dev]"``. The slow tests ask pip to resolve each set in a new virtual
environment with a pinned pip (``--dry-run --ignore-installed``: nothing is installed, nothing on
this machine is consulted but the package index), and read TRL's declared vLLM range from pip's
installation report, not from whatever TRL happens to be installed here. ``.[train]`` alone is a
subset of both, so it resolves when they do.

Without PEP 658 metadata on the index pip downloads every wheel it considers: the
``.[train,gpu]`` dry-run fetches about 3 GB (torch, vLLM, the CUDA wheels) and took 106-164 s here.
So a successful answer is cached under ``~/.cache/wmrl/pins/`` (``$WMRL_CACHE/pins``), keyed by
the sha256 of pyproject.toml, the extras, pip, Python and platform, for a week at most: an unchanged
pyproject.toml costs nothing, an edited one asks the index again. ``WMRL_PINS_REFRESH=1`` ignores
the cache.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
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
# Successful dry runs are kept here, one installation report per resolution_key(); pyproject.toml's
# pins are exact, but their own requirements are ranges the index can move, so an answer is trusted
# for a week at most.
CACHE_DIR = Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl") / "pins"
CACHE_MAX_AGE = 7 * 24 * 3600.0


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


def resolution_key(pyproject: bytes, extras: str, pip: str = PIP,
                   python: str = f"{sys.version_info.major}.{sys.version_info.minor}",
                   platform: str = sys.platform) -> str:
    """What a dry run's answer depends on, on our side: the bytes of pyproject.toml, the extras, the
    resolving pip, the interpreter's minor version and the platform."""
    digest = hashlib.sha256()
    for part in (pyproject, extras.encode(), pip.encode(), python.encode(), platform.encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def cached_report(directory: Path, key: str, now: float, max_age: float = CACHE_MAX_AGE) -> dict | None:
    """The installation report of an earlier successful dry run with this key, unless older than max_age."""
    path = directory / f"{key}.json"
    try:
        if now - path.stat().st_mtime <= max_age:
            return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    return None


def store_report(directory: Path, key: str, report: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(report))
    tmp.replace(directory / f"{key}.json")


@pytest.fixture(scope="module")
def resolver(tmp_path_factory):
    """A function that dry-runs ``.[extras]`` and gives back (pip's exit status, its output's tail,
    installation report or None). A successful answer is reused from ``CACHE_DIR`` while its key
    (:func:`resolution_key`) is unchanged and it is younger than ``CACHE_MAX_AGE``; otherwise a new venv
    with pip==PIP asks the index again. ``WMRL_PINS_REFRESH=1`` ignores the cache."""
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    refresh = os.environ.get("WMRL_PINS_REFRESH") == "1"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    venv: list[str] = []
    done = {}

    def python() -> str:
        if not venv:
            path = tmp_path_factory.mktemp("pins-venv")
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
            up = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", f"pip=={PIP}"],
                                env=env, capture_output=True, text=True, timeout=300)
            assert up.returncode == 0, f"could not install pip=={PIP} into the test venv:\n{up.stderr[-3000:]}"
            venv.append(str(path / "bin" / "python"))
        return venv[0]

    def dry_run(extras):
        if extras in done:
            return done[extras]
        key = resolution_key(pyproject, extras)
        report = None if refresh else cached_report(CACHE_DIR, key, time.time())
        if report is not None:
            done[extras] = (0, f"(cached: {CACHE_DIR / key}.json)", report)
            return done[extras]
        path = tmp_path_factory.mktemp("pins-report") / "report.json"
        proc = subprocess.run(
            [python(), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--progress-bar", "off",
             "--report", str(path), f".[{extras}]"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )
        tail = f"pip's stderr (tail):\n{proc.stderr[-3000:]}\npip's stdout (tail, the conflict's cause):\n{proc.stdout[-3000:]}"
        report = json.loads(path.read_text()) if proc.returncode == 0 else None
        if report is not None:
            store_report(CACHE_DIR, key, report)
        done[extras] = (proc.returncode, tail, report)
        return done[extras]

    return dry_run


def test_the_resolution_key_changes_with_each_input():
    base = resolution_key(b"[project]", "train,gpu", "26.3", "3.11", "linux")
    variants = [resolution_key(b"[project] ", "train,gpu", "26.3", "3.11", "linux"),
                resolution_key(b"[project]", "train,dev", "26.3", "3.11", "linux"),
                resolution_key(b"[project]", "train,gpu", "26.2", "3.11", "linux"),
                resolution_key(b"[project]", "train,gpu", "26.3", "3.12", "linux"),
                resolution_key(b"[project]", "train,gpu", "26.3", "3.11", "darwin"),
                resolution_key(b"[project]t", "rain,gpu", "26.3", "3.11", "linux")]  # no ambiguous joins
    assert base == resolution_key(b"[project]", "train,gpu", "26.3", "3.11", "linux")
    assert len({base, *variants}) == 1 + len(variants)


def test_a_cached_report_is_used_only_while_fresh(tmp_path):
    store_report(tmp_path, "k", {"install": []})
    written = (tmp_path / "k.json").stat().st_mtime
    assert cached_report(tmp_path, "k", written + CACHE_MAX_AGE) == {"install": []}
    assert cached_report(tmp_path, "k", written + CACHE_MAX_AGE + 1) is None
    assert cached_report(tmp_path, "other", written) is None
    (tmp_path / "k.json").write_text("{truncated")
    assert cached_report(tmp_path, "k", written) is None


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("extras", ["train,gpu", "train,dev"])
def test_extras_resolve(resolver, extras):
    returncode, tail, report = resolver(extras)
    assert returncode == 0, f'pip install --dry-run ".[{extras}]" did not resolve (exit {returncode}).\n{tail}'
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
    returncode, tail, report = resolver("train,gpu")
    assert returncode == 0, f'".[train,gpu]" did not resolve (see test_extras_resolve):\n{tail}'
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
