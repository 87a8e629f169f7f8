"""Run inside the trainer image (test_image_build.py copies it in): a short real training run.

``python trainer_smoke.py QUICKSTART STEPS``: one local sandbox server, then ``wmrl launch`` (the
trainer Job's command) on a run config rendered from examples/quickstart.yaml (the built-in CPU
policy, builtin:tiny-coder, on the mini-ml tasks) cut down to STEPS steps of 2 groups of 4.
Prints one JSON line: the launcher's exit code, its output's tail and the checkpoints written.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from wmrl_sandbox.local import LocalServer

manifest = yaml.safe_load(Path(sys.argv[1]).read_text())
steps = int(sys.argv[2])
spec = manifest["spec"]
spec["algorithm"].update({"steps": steps, "groupSize": 4, "groupsPerStep": 2})
spec["trainer"] = {**spec.get("trainer", {}), "gpusPerNode": 0}  # one CPU process, as small-cpu-run.yaml
work = Path(tempfile.mkdtemp(prefix="wmrl-smoke-"))
# buildah's chroot run gives no user namespaces: executions restricted (no namespaces of their own);
# tests/e2e trains on isolated Pods
with LocalServer(slots=2, args=("--isolation", "restricted")) as server:
    config = {**manifest, "spec": spec,
              "runtime": {"checkpointDir": str(work / "checkpoints"), "patchStatus": False, "metricsPort": None,
                          "sandboxUrls": [server.url]}}
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(["wmrl", "launch", "--config", str(work / "run.yaml")], capture_output=True, text=True,
                          timeout=900)
checkpoints = sorted(os.listdir(work / "checkpoints")) if (work / "checkpoints").is_dir() else []
print(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout[-3000:], "stderr": proc.stderr[-3000:],
                  "checkpoints": checkpoints}))
