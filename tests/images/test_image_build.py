"""The real images: built with buildah on the local Debian base (tests/images/images.py), then run.

A cold build takes about 20 minutes on 2 cores (docs/images.md); later sessions reuse the
tarballs cached under $WMRL_CACHE/images. Needs root (buildah's chroot isolation), as `make test` has.
"""

import json
import re
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import images
from image_keys import BASE_REF, DEFAULT_NAMES, IMAGES

pytestmark = [pytest.mark.slow, pytest.mark.images, pytest.mark.timeout(3600)]


@pytest.fixture(scope="session")
def built():
    """The base and the default images (operator, sandbox, trainer-cpu), built or reused."""
    return images.build(DEFAULT_NAMES)


@pytest.fixture(scope="session")
def buildah(built):
    return images.builder()


def _run(buildah, built, name, argv, user=None, files=None, timeout=600):
    """``argv`` in a fresh container of the image ``name``; its stdout (the test fails on a non-zero exit)."""
    ref = images.ensure_loaded(name).ref if name != "base" else BASE_REF
    proc = buildah.run_in(ref, argv, user=user, files=files, timeout=timeout)
    assert proc.returncode == 0, f"{name}: {argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


SANDBOX_PINS = images.REPO / "sandbox-image" / "wmrl_sandbox" / "requirements.txt"


def _pin(package: str, source: Path) -> str:
    """The version ``source`` (a requirements file or pyproject.toml) pins ``package`` to."""
    found = re.search(rf"(?m)^\s*\"?{re.escape(package)}==([^\"\s;,]+)", source.read_text())
    assert found, f"{source} pins no {package}"
    return found.group(1)


def _archive(path: Path):
    """(manifest entry, image config) of a single-image docker-archive tarball."""
    with tarfile.open(path) as tar:
        [manifest] = json.load(tar.extractfile("manifest.json"))
        config = json.load(tar.extractfile(manifest["Config"]))
    return manifest, config


def _wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel, so that `pip install` is tried without any index."""
    dist = "wmrl_probe-1.0.dist-info"
    files = {"wmrl_probe.py": "VALUE = 42\n",
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: wmrl-probe\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: wmrl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    path = directory / "wmrl_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


def test_the_base_has_python_3_11_and_a_pip_that_installs(built, buildah, tmp_path):
    out = _run(buildah, built, "base", ["sh", "-c", "command -v python; command -v pip; python --version; pip --version; "
                                                    "pip config list"])
    lines = out.splitlines()
    assert lines[:2] == ["/usr/local/bin/python", "/usr/local/bin/pip"]
    assert lines[2].startswith("Python 3.11.")
    assert "site-packages/pip" in lines[3]
    assert "global.cert='/usr/local/share/wmrl/ca-bundle.crt'" in out
    # Debian's system pip refuses to install (PEP 668); the base's /usr/local venv must not.
    wheel = _wheel(tmp_path)
    out = _run(buildah, built, "base", ["sh", "-c", f"pip install --no-index --no-deps /tmp/{wheel.name} && "
                                                    "python -c 'import wmrl_probe; print(wmrl_probe.__file__, wmrl_probe.VALUE)'"],
               files={f"/tmp/{wheel.name}": wheel})
    assert out.splitlines()[-1] == "/usr/local/lib/python3.11/site-packages/wmrl_probe.py 42"


def test_each_tarball_is_a_docker_archive_of_its_image(built):
    expected = {"operator": ("65532:65532", ["wmrl", "operator"]),
                "sandbox": ("10001:10001", ["wmrl", "sandbox", "serve", "--host", "0.0.0.0", "--port", "8080"]),
                "trainer-cpu": ("65532:65532", ["wmrl", "launch"])}
    for name, (user, cmd) in expected.items():
        manifest, config = _archive(built[name].tarball)
        assert manifest["RepoTags"] == [IMAGES[name].ref]
        assert config["config"]["User"] == user
        assert config["config"]["Cmd"] == cmd
        assert not config["config"].get("Entrypoint")
        assert config["os"] == "linux" and config["architecture"] == "amd64"
    _, sandbox = _archive(built["sandbox"].tarball)
    assert "WMRL_SANDBOX_WORK_DIR=/work/exec" in sandbox["config"]["Env"]


def test_the_operator_image_runs_wmrl(built, buildah):
    out = _run(buildah, built, "operator", ["sh", "-c", "id -u; wmrl --help"])
    assert out.splitlines()[0] == "65532"
    assert "operator" in out and "calibration" in out


SANDBOX_PROBE = """
import json
import httpx
from wmrl_sandbox.local import LocalServer
# buildah's chroot run gives no user namespaces: executions restricted (no namespaces of their own);
# tests/e2e runs it isolated in a Pod
with LocalServer(slots=1, args=("--isolation", "restricted")) as server:
    result = httpx.post(server.url + "/run_code", timeout=120, json={"language": "python", "code":
        "import numpy, pandas, scipy, sklearn; print(sklearn.__version__, numpy.__version__)"}).json()
print(json.dumps(result))
"""


def test_the_sandbox_image_has_bubblewrap_and_the_stack_inside_executions(built, buildah, tmp_path):
    out = _run(buildah, built, "sandbox", ["sh", "-c", "id -u; command -v bwrap; "
                                                       "python -c 'import numpy, pandas, scipy, sklearn; print(\"ok\")'"])
    assert out.splitlines() == ["10001", "/usr/bin/bwrap", "ok"]
    probe = tmp_path / "probe.py"
    probe.write_text(SANDBOX_PROBE)
    result = json.loads(_run(buildah, built, "sandbox", ["python", "/work/tmp/probe.py"],
                             files={"/work/tmp/probe.py": probe}).splitlines()[-1])
    assert result["status"] == "Success", result
    assert result["run_result"]["stdout"].split() == [_pin("scikit-learn", SANDBOX_PINS), _pin("numpy", SANDBOX_PINS)], result


def test_the_cpu_trainer_image_trains_the_builtin_policy_with_wmrl_launch(built, buildah):
    out = _run(buildah, built, "trainer-cpu", [
        "python", "-c", "import importlib.util as u, torch; "
        "print(torch.__version__, torch.cuda.is_available(), [m for m in ('triton', 'vllm') if u.find_spec(m)])"])
    version, cuda, present = out.split(maxsplit=2)
    assert version.startswith(_pin("torch", images.REPO / "pyproject.toml")) and cuda == "False" and present.strip() == "[]"
    result = json.loads(_run(buildah, built, "trainer-cpu", ["python", "/tmp/trainer_smoke.py", "/tmp/quickstart.yaml", "2"],
                             files={"/tmp/trainer_smoke.py": Path(__file__).with_name("trainer_smoke.py"),
                                    "/tmp/quickstart.yaml": images.REPO / "examples" / "quickstart.yaml"},
                             timeout=1200).splitlines()[-1])
    assert result["returncode"] == 0, result
    assert "step-00000002" in result["checkpoints"], result
    summary = [json.loads(line) for line in result["stdout"].splitlines() if line.startswith('{"event": "summary"')]
    assert summary, result


def test_a_second_build_reuses_every_cached_tarball(built):
    started = time.monotonic()
    again = images.build(DEFAULT_NAMES)
    assert {n: (b.key, b.tarball, b.tarball.stat().st_mtime) for n, b in again.items()} == \
        {n: (b.key, b.tarball, b.tarball.stat().st_mtime) for n, b in built.items()}
    print(f"warm build_all: {time.monotonic() - started:.1f} s")
