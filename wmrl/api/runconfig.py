"""The rendered run config: what the operator mounts into the trainer Job (ConfigMap ``<run>-config``,
key ``run.yaml``) and what ``wmrl run`` builds locally. The trainer reads only this file.

It is the WMRLRun (metadata + validated spec with every default filled in) plus a
``runtime`` block naming the endpoints the trainer talks to, so the same trainer code
runs in a cluster and on a laptop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import Field

from wmrl.api.schema import API_VERSION, KIND, WMRLRunSpec
from wmrl.api.wire import WireModel

CONFIG_KEY = "run.yaml"
SANDBOX_PORT = 8080
CALIBRATION_PORT = 8080
WORLD_MODEL_PORT = 8000
TRAINER_METRICS_PORT = 9090


class RunMetadata(WireModel):
    name: str
    namespace: str = "default"
    uid: Optional[str] = None


class Runtime(WireModel):
    calibration_url: Optional[str] = Field(None, description="Calibration service base URL; empty keeps calibration in-process.")
    sandbox_service: Optional[str] = Field(None, description="Headless Service whose EndpointSlices list the ready sandbox pods.")
    sandbox_port: int = SANDBOX_PORT
    sandbox_urls: list[str] = Field(default_factory=list, description="Static sandbox base URLs (local runs).")
    world_model_url: Optional[str] = Field(None, description="OpenAI-compatible base URL for the llm backend.")
    rollout_url: Optional[str] = Field(None, description="Base URL of the rollout vLLM server the operator deployed "
                                       "(spec.policy.vllmMode server without vllmServerUrl).")
    rollout_wait_seconds: float = Field(240.0, gt=0, description="vllmMode server: how long the trainer waits at "
                                        "start for the rollout server's /health (TRL's vllm_server_timeout).")
    checkpoint_dir: str = "/checkpoints"
    results_dir: Optional[str] = None
    tasks_dir: Optional[str] = Field(None, description="Where task folders are mounted (pvc/configMap sources).")
    sandbox_mounts_tasks: bool = Field(
        False, description="The sandbox Pods mount the tasks volume too (spec.tasks.pvc with isolation namespaces), "
        "at the same path: collection tasks' public directories are mounted into executions, not uploaded.")
    patch_status: bool = Field(True, description="Patch WMRLRun.status.progress through the Kubernetes API.")
    metrics_port: Optional[int] = TRAINER_METRICS_PORT


class RunConfig(WireModel):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: RunMetadata
    spec: WMRLRunSpec
    runtime: Runtime = Field(default_factory=Runtime)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_wire(), sort_keys=False)


def load_run_config(path: str | Path) -> RunConfig:
    return RunConfig.model_validate(yaml.safe_load(Path(path).read_text()))


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A WMRLRun manifest file as a dict (not validated yet); ValueError naming the file when it is none."""
    try:
        manifest = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ValueError(f"{path}: not a WMRLRun manifest (kind: WMRLRun)")
    return manifest


def from_manifest(manifest: dict[str, Any], runtime: Runtime | None = None) -> RunConfig:
    """A RunConfig from a WMRLRun object (as applied with kubectl): validates the spec."""
    meta = manifest.get("metadata") or {}
    return RunConfig(
        metadata=RunMetadata(name=meta.get("name", "run"), namespace=meta.get("namespace", "default"), uid=meta.get("uid")),
        spec=WMRLRunSpec.model_validate(manifest.get("spec") or {}),
        runtime=runtime or Runtime(),
    )
