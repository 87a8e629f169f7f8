"""Pure functions: a validated WMRLRun -> the Kubernetes objects that realise it.

No I/O here; the handlers decide *when* to apply, these decide *what*. Names, labels and
ports are the contract in the brief (``<run>-config``, ``<run>-trainer``, ``<run>-sandbox``,
``<run>-world-model``, ``<calibration>``/``<calibration>-state``).

Which children exist depends on the mode:

- ``wmrl``: trainer, sandbox pool, calibration, world model (when served by the operator);
- ``worldModel``: trainer, sandbox pool (held-out evaluation runs real code), world model;
- ``real``: trainer and sandbox pool only;
- ``eval``: the sandbox pool and, in the trainer Job's place (same name, volumes, RBAC), one
  ``wmrl eval`` process that evaluates a checkpoint and patches its result into status
  (:func:`trainer_command`); no world model, calibration or rollout server.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import Any, Optional

from wmrl.api.runconfig import (
    CALIBRATION_PORT,
    CONFIG_KEY,
    SANDBOX_PORT,
    TRAINER_METRICS_PORT,
    WORLD_MODEL_PORT,
    RunConfig,
    RunMetadata,
    Runtime,
)
from wmrl.calibration import TOKEN_ENV
from wmrl.calibration.state import CalibrationConfig
from wmrl.api.schema import API_VERSION, GROUP, KIND, PLURAL, Mode, Resources, SandboxSpec, WMRLRunSpec
from wmrl.api.vocabulary import (
    ADMISSION_LABELS,
    APPLIED_HASH,
    CALIBRATION_LABEL,
    CALIBRATION_READER_LABEL,
    COMPONENT_LABEL,
    MANAGED_BY,
    QUEUE_LABEL,
    RUN_LABEL,
)

TOKEN_KEY = "token"
KUEUE_WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")  # Kueue's record of a Job it queues
# A Pod that the scheduler preempted or that an eviction or node drain removed gets this
# condition: its failure is not the trainer's, so it neither fails the Job nor counts as a restart.
DISRUPTION_IGNORED = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                                           "status": "True"}]}]}
CONFIG_MOUNT = "/etc/wmrl"
TASKS_MOUNT = "/tasks"
WORK_DIR = "/work"
DEFAULT_OPERATOR_IMAGE = "ghcr.io/wmrl/operator:0.1.0"
MASTER_PORT = 29500
ROLLOUT_PORT = 8000  # trl vllm-serve's HTTP port
ROLLOUT_GROUP_PORT = 51216  # TRL's vllm_group_port: the weight-sync NCCL group (the trainer connects to it)

# ---- Pod defaults (documented in docs/operator.md, "Pod security, resources and scratch space").
# Quantities are written in the apiserver's canonical form ("2Gi", not "2048Mi"; "1", not "1000m")
# so that what is applied reads back unchanged.

# Sandbox Pods, per slot (one concurrent execution), from sandbox-image/wmrl_sandbox/executor.py's
# Limits. Used for cpu/memory when spec.sandbox.resources names neither its request nor its limit.
SANDBOX_CPU_MILLI_PER_SLOT = 1000  # an execution is one Python process: one core each
SANDBOX_SERVER_CPU_MILLI = 250  # the HTTP server, its dispatcher and the probes, next to busy slots
SANDBOX_EXEC_MEMORY_MI = 2048  # Limits.memory_mb: an execution's address-space cap (RLIMIT_AS) when the
                               # request sets no memory_limit_MB, which the trainer never sets
SANDBOX_FILE_MI = 256  # Limits.file_size_mb: the largest file an execution may write (RLIMIT_FSIZE)
SANDBOX_WORK_MI_PER_SLOT = 2 * SANDBOX_FILE_MI  # /work/exec/<execution>: program, files, two max-size outputs
SANDBOX_WORK_MI_BASE = 256  # /work also holds the server's TMPDIR (/work/tmp) and HOME
SANDBOX_TMP_MI_PER_SLOT = SANDBOX_FILE_MI  # /tmp: programs that write there directly (one max-size file)
SANDBOX_TMPFS_MI = 64  # Limits.tmpfs_mb: each of an execution's private /tmp, /var/tmp and /dev/shm
SANDBOX_PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")
SANDBOX_SERVER_MEMORY_MI = 512  # the server: Python + wmrl, 1 MiB output buffers per stream, fetched files
SANDBOX_FORK_SERVER_MEMORY_MI = 256  # each slot's warm fork server: ~200 MiB resident with numpy, scipy, pandas
                                     # and scikit-learn imported (measured), shared with its children until written

# /dev/shm (a memory-backed emptyDir) for the trainer and the vLLM world model: NCCL's shared-memory
# transport, PyTorch's inter-process tensors and vLLM's worker message queue live there, and a
# container runtime's default is 64 MiB. 2 GiB is what vLLM's Kubernetes guide gives one server;
# scaled by the GPUs of the Pod (one rank each), at least one GPU's worth.
SHM_MOUNT = "/dev/shm"
SHM_MI_PER_GPU = 2048

# The trainer image (trainer/Dockerfile): USER 65532:65532, HOME /home/wmrl, HF_HOME and
# TRITON_CACHE_DIR under /var/cache/wmrl. Its root filesystem is read-only in the Pod, so these
# (and /tmp) are emptyDirs, and the cache variables point into them.
TRAINER_UID = 65532
TRAINER_HOME = "/home/wmrl"
TRAINER_CACHE = "/var/cache/wmrl"
TRAINER_TMP = "/tmp"
TRAINER_CACHE_ENV = {
    "HOME": TRAINER_HOME,
    "XDG_CACHE_HOME": TRAINER_CACHE,  # vLLM, torch hub, flashinfer, ... (their default: ~/.cache)
    "HF_HOME": f"{TRAINER_CACHE}/huggingface",  # as in the image
    "TRITON_CACHE_DIR": f"{TRAINER_CACHE}/triton",  # as in the image
    "WMRL_CACHE": f"{TRAINER_CACHE}/wmrl",  # builtin policies and task suites, built on first use
}


@dataclass(frozen=True)
class Run:
    """The identity of a WMRLRun object (what owner references and names need)."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Run":
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta.get("uid", ""))


@dataclass(frozen=True)
class Options:
    """Everything besides the spec that decides the objects (computed by the handlers)."""

    suspended: bool = False
    finished: bool = False
    sandbox_replicas: Optional[int] = None  # None: spec.sandbox.minReplicas
    job_deadline_seconds: Optional[int] = None  # remaining run deadline for the trainer Job
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    admission: tuple[tuple[str, str], ...] = ()  # the run's Kueue labels (admission_labels)
    # Kueue has not admitted the trainer yet: the pools and model servers wait at zero replicas
    # (a queued run holds no sandbox Pods and no vLLM GPUs).
    awaiting_admission: bool = False

    @property
    def idle(self) -> bool:
        """Serving Deployments at zero replicas: suspended, finished or waiting for admission."""
        return self.suspended or self.finished or self.awaiting_admission
    calibration_state_uid: Optional[str] = None  # a shared calibration's state ConfigMap: owns the rest of it


def admission_labels(run_labels: Optional[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """The run's Kueue labels (queue name, priority class) that its trainer Job carries."""
    return tuple((k, run_labels[k]) for k in ADMISSION_LABELS if (run_labels or {}).get(k))


def queue_name(admission: tuple[tuple[str, str], ...]) -> Optional[str]:
    """The Kueue LocalQueue that admits the trainer Job (created suspended; Kueue unsuspends it), if any."""
    return dict(admission).get(QUEUE_LABEL)


# ---------------------------------------------------------------- names


def config_name(run: Run) -> str:
    return f"{run.name}-config"


def trainer_name(run: Run) -> str:
    return f"{run.name}-trainer"


def sandbox_name(run: Run) -> str:
    return f"{run.name}-sandbox"


def world_model_name(run: Run) -> str:
    return f"{run.name}-world-model"


def rollout_name(run: Run) -> str:
    return f"{run.name}-rollout"


def calibration_name(run: Run, spec: WMRLRunSpec) -> str:
    return spec.calibration.name or f"{run.name}-calibration"


def calibration_token_name(run: Run, spec: WMRLRunSpec) -> str:
    """The Secret holding the calibration's token (key ``token``): the operator creates it once, never rewrites it.

    A run's own calibration names its token after the run's uid: a run deleted and made again under
    the same name gets a new Secret, never the old one that the garbage collector is about to delete.
    """
    if calibration_shared(spec) or not run.uid:
        return f"{calibration_name(run, spec)}-token"
    return f"{calibration_name(run, spec)}-token-{run.uid[:8]}"


def calibration_token_env(run: Run, spec: WMRLRunSpec) -> dict[str, Any]:
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": calibration_token_name(run, spec),
                                                                "key": TOKEN_KEY}}}


def calibration_shared(spec: WMRLRunSpec) -> bool:
    return bool(spec.calibration.name)


def needs_calibration(spec: WMRLRunSpec) -> bool:
    return spec.mode == Mode.WMRL


def serves_world_model(spec: WMRLRunSpec) -> bool:
    return (spec.mode not in (Mode.REAL, Mode.EVAL) and spec.world_model.backend == "llm"
            and not spec.world_model.endpoint)


def serves_rollouts(spec: WMRLRunSpec) -> bool:
    """The operator deploys the rollout vLLM server (TRL's server mode) unless the spec names one
    (mode eval generates in its own process)."""
    p = spec.policy
    return spec.mode != Mode.EVAL and p.rollout_engine == "vllm" and p.vllm_mode == "server" and not p.vllm_server_url


def evaluation_dir(run: Run, spec: WMRLRunSpec) -> str:
    """Mode eval: where the evaluation writes its report (eval.json, eval.md, plots) on the checkpoint volume."""
    return posixpath.join(spec.trainer.checkpoint.path, "evaluations", run.name)


def trainer_command(run: Run, spec: WMRLRunSpec) -> list[str]:
    """What the trainer Job runs: ``wmrl launch`` (training), or in mode eval ``wmrl eval`` on the same
    rendered config, writing its report under :func:`evaluation_dir`."""
    config = f"{CONFIG_MOUNT}/{CONFIG_KEY}"
    if spec.mode == Mode.EVAL:
        return ["wmrl", "eval", "--config", config, "--out", evaluation_dir(run, spec), "--no-progress"]
    return ["wmrl", "launch", "--config", config]


# ---------------------------------------------------------------- metadata helpers


def labels(run: Run, component: str) -> dict[str, str]:
    return {RUN_LABEL: run.name, **MANAGED_BY, COMPONENT_LABEL: component}


def owner_reference(run: Run) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": run.name, "uid": run.uid,
            "controller": True, "blockOwnerDeletion": True}


def _meta(run: Run, name: str, component: str, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": run.namespace, "labels": labels(run, component)}
    if owned:
        meta["ownerReferences"] = [owner_reference(run)]
    return meta


def _mi(mebibytes: int) -> str:
    """A memory quantity in canonical form: whole GiB as ``Gi``, otherwise ``Mi``."""
    return f"{mebibytes // 1024}Gi" if mebibytes % 1024 == 0 else f"{mebibytes}Mi"


def _cpu(millicores: int) -> str:
    """A CPU quantity in canonical form: whole cores without a suffix, otherwise ``m``."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def _resources(res: Resources, gpus: int = 0, defaults: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The container's resources: the spec's, plus ``defaults`` (request = limit) for each resource
    the spec names neither a request nor a limit for. A resource is taken whole from one side, so
    a default request never lands above a limit the user set (or the reverse)."""
    requests = dict(res.requests)
    limits = dict(res.limits)
    for name, quantity in (defaults or {}).items():
        if name not in requests and name not in limits:
            requests[name] = quantity
            limits[name] = quantity
    if gpus > 0:  # extended resources: request == limit
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _service(meta: dict[str, Any], selector: dict[str, str], port: int, port_name: str, headless: bool,
             not_ready: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector, "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}]}
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = not_ready
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


# ---------------------------------------------------------------- runtime + config


def runtime(run: Run, spec: WMRLRunSpec) -> Runtime:
    if spec.world_model.endpoint:
        wm_url: Optional[str] = spec.world_model.endpoint
    elif serves_world_model(spec):
        wm_url = f"http://{world_model_name(run)}.{run.namespace}.svc:{WORLD_MODEL_PORT}/v1"
    else:
        wm_url = None
    tasks = spec.tasks
    return Runtime(
        calibration_url=(f"http://{calibration_name(run, spec)}.{run.namespace}.svc:{CALIBRATION_PORT}"
                         if needs_calibration(spec) else None),
        sandbox_service=sandbox_name(run),
        sandbox_port=SANDBOX_PORT,
        world_model_url=wm_url,
        rollout_url=f"http://{rollout_name(run)}.{run.namespace}.svc:{ROLLOUT_PORT}" if serves_rollouts(spec) else None,
        checkpoint_dir=spec.trainer.checkpoint.path,
        tasks_dir=TASKS_MOUNT if (tasks.pvc or tasks.config_map) else None,
        sandbox_mounts_tasks=sandbox_mounts_tasks(spec),
        patch_status=True,
        metrics_port=TRAINER_METRICS_PORT,
    )


def run_config(run: Run, spec: WMRLRunSpec) -> RunConfig:
    return RunConfig(metadata=RunMetadata(name=run.name, namespace=run.namespace, uid=run.uid or None),
                     spec=spec, runtime=runtime(run, spec))


def config_map(run: Run, spec: WMRLRunSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(run, config_name(run), "trainer"),
            "data": {CONFIG_KEY: run_config(run, spec).to_yaml()}}


# ---------------------------------------------------------------- pod security and scratch space


def _hardened_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod and container securityContext for the images that run as a numeric non-root USER
    (trainer, sandbox, calibration): runAsNonRoot makes the kubelet refuse anything else."""
    pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                 "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    return pod, container


def _root_image_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """For an image that may run as root (vLLM's official image does): no runAsNonRoot, which
    would make the kubelet refuse to start it, and a writable root filesystem (vLLM and the
    libraries under it write caches and sockets in several places); but no capabilities, no
    privilege escalation (no setuid gains) and the runtime's default seccomp profile."""
    pod = {"seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                 "seccompProfile": {"type": "RuntimeDefault"}}
    return pod, container


def shm_size(gpus: int) -> str:
    """The sizeLimit of a Pod's /dev/shm: ``SHM_MI_PER_GPU`` per GPU, at least one GPU's worth."""
    return _mi(SHM_MI_PER_GPU * max(1, gpus))


def _shm_volume(gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(gpus)}},
            {"name": "shm", "mountPath": SHM_MOUNT})


def sandbox_default_resources(slots: int, sandbox: Optional[SandboxSpec] = None) -> dict[str, str]:
    """cpu and memory of a sandbox Pod with ``slots`` concurrent executions (request = limit) and the
    per-execution settings of ``sandbox`` (spec.sandbox; None: the defaults): per slot its CPUs
    (``cpusPerExecution``, at least one core's worth) plus the server's share; per slot an execution's
    memory (``memoryMB``), its fork server, its private tmpfs mounts beyond the default 3 x 64 MiB (a
    program rarely fills those; larger ones are counted whole) and its share of the memory-backed
    emptyDirs (their pages count against the container's memory), plus the server."""
    s = sandbox or SandboxSpec()
    work, tmp = sandbox_volume_mebibytes(slots, s.file_size_mb)
    tmpfs_extra = len(SANDBOX_PRIVATE_TMPFS) * max(0, s.tmpfs_mb - SANDBOX_TMPFS_MI)
    per_slot = s.memory_mb + SANDBOX_FORK_SERVER_MEMORY_MI + tmpfs_extra
    cpu_per_slot = max(SANDBOX_CPU_MILLI_PER_SLOT, int(round(s.cpus_per_execution * 1000)))
    return {"cpu": _cpu(cpu_per_slot * slots + SANDBOX_SERVER_CPU_MILLI),
            "memory": _mi(per_slot * slots + work + tmp + SANDBOX_SERVER_MEMORY_MI)}


def sandbox_volume_mebibytes(slots: int, file_mi: int = SANDBOX_FILE_MI) -> tuple[int, int]:
    """sizeLimit (MiB) of the sandbox Pod's memory-backed ``/work`` and ``/tmp`` with ``slots`` slots whose
    executions may each write files of ``file_mi`` (spec.sandbox.fileSizeMB): per slot the program, its
    files and two max-size outputs in /work, one max-size file in /tmp."""
    return SANDBOX_WORK_MI_BASE + 2 * file_mi * slots, file_mi * slots


SANDBOX_GPU_DEVICES = "/dev/nvidia*"
"""What a sandbox server with ``spec.sandbox.gpus`` binds into its executions (``--device``): the nodes
the NVIDIA device plugin puts in the container (nvidia0..N, nvidiactl, nvidia-uvm...)."""


def sandbox_env(spec: WMRLRunSpec) -> list[dict[str, str]]:
    """The sandbox server's settings (its WMRL_SANDBOX_* flags' defaults) for spec.sandbox."""
    s = spec.sandbox
    namespaces = s.isolation == "namespaces"
    env = [("WMRL_SANDBOX_SLOTS", str(s.slots_per_pod)),
           ("WMRL_SANDBOX_TIMEOUT_SECONDS", str(s.timeout_seconds)),
           ("WMRL_SANDBOX_WORK_DIR", f"{WORK_DIR}/exec"),
           ("WMRL_SANDBOX_ISOLATION", s.isolation),
           ("WMRL_SANDBOX_REQUIRE_ISOLATION", str(namespaces).lower()),
           ("WMRL_SANDBOX_CGROUPS", s.cgroups),
           ("WMRL_SANDBOX_MEMORY_MB", str(s.memory_mb)),
           ("WMRL_SANDBOX_TMPFS_MB", str(s.tmpfs_mb)),
           ("WMRL_SANDBOX_FILE_SIZE_MB", str(s.file_size_mb)),
           ("WMRL_SANDBOX_CPUS", f"{s.cpus_per_execution:g}")]
    if sandbox_mounts_tasks(spec):
        env.append(("WMRL_SANDBOX_TASKS_DIR", TASKS_MOUNT))
    if s.gpus > 0:  # the device plugin's nodes, bound into every execution (which then gets no RLIMIT_AS)
        env.append(("WMRL_SANDBOX_DEVICES", SANDBOX_GPU_DEVICES))
    return [{"name": name, "value": value} for name, value in env]


def sandbox_mounts_tasks(spec: WMRLRunSpec) -> bool:
    """Whether the sandbox Pods mount the tasks volume: a PVC source, and executions in mount namespaces of
    their own, which hide everything of it but the public directory an execution asks for (its private
    answers above all). ``restricted`` executions could read the answers: they get uploads only."""
    return bool(spec.tasks.pvc) and spec.sandbox.isolation == "namespaces"


# ---------------------------------------------------------------- trainer


def trainer_rbac(run: Run) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding: patch this run's status, discover sandbox pods, read its config."""
    name = trainer_name(run)
    rules = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [run.name], "verbs": ["get"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [run.name], "verbs": ["get", "patch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [config_name(run)], "verbs": ["get"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(run, name, "trainer")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(run, name, "trainer"), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(run, name, "trainer"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": run.namespace}]},
    ]


def _scratch() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(volume, mount) of the writable scratch directories the trainer image needs on a read-only root."""
    return [({"name": name, "emptyDir": {}}, {"name": name, "mountPath": path})
            for name, path in (("tmp", TRAINER_TMP), ("home", TRAINER_HOME), ("cache", TRAINER_CACHE))]


def _place(pod_spec: dict[str, Any], placed: Any) -> None:
    """``placed``'s node selector and tolerations (a spec section that has them) on ``pod_spec``."""
    if placed.node_selector:
        pod_spec["nodeSelector"] = dict(placed.node_selector)
    if placed.tolerations:
        pod_spec["tolerations"] = [tol.to_wire() for tol in placed.tolerations]


def _deployment(run: Run, name: str, component: str, replicas: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
    pod_labels = labels(run, component)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(run, name, component),
        "spec": {"replicas": replicas, "selector": {"matchLabels": pod_labels},
                 "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec}},
    }


def _trainer_volumes(run: Run, spec: WMRLRunSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ckpt = spec.trainer.checkpoint
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_name(run)}},
        {"name": "checkpoints", **({"persistentVolumeClaim": {"claimName": ckpt.claim_name}} if ckpt.claim_name else {"emptyDir": {}})},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "checkpoints", "mountPath": ckpt.path},
    ]
    if spec.tasks.pvc:
        volumes.append({"name": "tasks", "persistentVolumeClaim": {"claimName": spec.tasks.pvc, "readOnly": True}})
        mounts.append({"name": "tasks", "mountPath": TASKS_MOUNT, "readOnly": True})
    elif spec.tasks.config_map:
        volumes.append({"name": "tasks", "configMap": {"name": spec.tasks.config_map}})
        mounts.append({"name": "tasks", "mountPath": TASKS_MOUNT, "readOnly": True})
    # Writable scratch for a read-only root filesystem, and /dev/shm. A scratch directory that the
    # checkpoint volume already occupies (checkpoint.path: /tmp, say) is left to that volume.
    taken = {posixpath.normpath(m["mountPath"]) for m in mounts}
    shm_volume, shm_mount = _shm_volume(spec.trainer.gpus_per_node)
    for volume, mount in [(shm_volume, shm_mount)] + _scratch():
        if posixpath.normpath(mount["mountPath"]) not in taken:
            volumes.append(volume)
            mounts.append(mount)
    return volumes, mounts


def trainer_job(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> dict[str, Any]:
    """The trainer Job. backoffLimit 0: the operator restarts failed trainers itself (resuming
    from the checkpoint) so that restarts are counted per run, across Job incarnations."""
    t = spec.trainer
    name = trainer_name(run)
    pod_labels = labels(run, "trainer")
    volumes, mounts = _trainer_volumes(run, spec)
    pod_sec, container_sec = _hardened_security()
    # fsGroup: a checkpoint PVC is usually root-owned; the kubelet makes it group-writable for the
    # image's group (only when its root does not match yet: large volumes are not re-chowned).
    pod_sec.update({"fsGroup": TRAINER_UID, "fsGroupChangePolicy": "OnRootMismatch"})
    env = [
        {"name": "WMRL_RUN", "value": run.name},
        {"name": "WMRL_NAMESPACE", "value": run.namespace},
        {"name": "WMRL_NODES", "value": str(t.nodes)},
    ] + [{"name": k, "value": v} for k, v in TRAINER_CACHE_ENV.items()]
    if t.nodes > 1:
        env += [{"name": "MASTER_ADDR", "value": f"{name}-0.{name}"}, {"name": "MASTER_PORT", "value": str(MASTER_PORT)}]
    if needs_calibration(spec):  # its token, and the label its calibration's NetworkPolicy admits
        env.append(calibration_token_env(run, spec))
        pod_labels[CALIBRATION_LABEL] = calibration_name(run, spec)
    ports = [{"name": "metrics", "containerPort": TRAINER_METRICS_PORT}]
    if t.nodes > 1:
        ports.append({"name": "dist", "containerPort": MASTER_PORT})
    container = {
        "name": "trainer",
        "image": t.image,
        "imagePullPolicy": t.image_pull_policy,
        # One process per GPU; with several nodes, node rank = JOB_COMPLETION_INDEX, rendezvous at MASTER_ADDR.
        "command": trainer_command(run, spec),
        "env": env,
        "ports": ports,
        "securityContext": container_sec,
        "volumeMounts": mounts,
    }
    res = _resources(t.resources, t.gpus_per_node)
    if res:
        container["resources"] = res
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": name,
        "securityContext": pod_sec,
        "containers": [container],
        "volumes": volumes,
    }
    _place(pod_spec, t)  # the trainer's nodes (its GPU pool)
    if t.nodes > 1:
        pod_spec["subdomain"] = name
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "podFailurePolicy": DISRUPTION_IGNORED,
        "completions": t.nodes,
        "parallelism": t.nodes,
        # Queued: created suspended, and only Kueue unsuspends it (at admission).
        "suspend": bool(opts.suspended) or bool(queue_name(opts.admission)),
        "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
    }
    if t.nodes > 1:
        job_spec["completionMode"] = "Indexed"
    if opts.job_deadline_seconds is not None:
        # The Job controller restarts this clock whenever the Job is unsuspended: under Kueue it
        # counts admitted time only.
        job_spec["activeDeadlineSeconds"] = max(1, int(opts.job_deadline_seconds))
    meta = _meta(run, name, "trainer")
    meta["labels"].update(dict(opts.admission))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}


def trainer_service(run: Run) -> dict[str, Any]:
    """Headless Service giving Indexed Job pods stable DNS names (``<job>-<i>.<job>``). Not-ready Pods are
    published: the nodes must find Pod 0 while they rendezvous, before anything is ready."""
    return _service(_meta(run, trainer_name(run), "trainer"), labels(run, "trainer"), MASTER_PORT, "dist", headless=True,
                    not_ready=True)


# ---------------------------------------------------------------- sandbox pool


def sandbox_deployment(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> dict[str, Any]:
    s = spec.sandbox
    pod_sec, container_sec = _hardened_security()
    namespaces = s.isolation == "namespaces"
    if namespaces:
        # Each execution gets its own user, PID, network, mount and IPC namespaces (bubblewrap), which
        # the runtime's default seccomp profile forbids; the executions themselves run under the
        # server's own filter, which refuses what they could misuse (docs/sandbox.md). bubblewrap mounts
        # a /proc of each execution's PID namespace, which the kernel refuses over the runtime's masked
        # /proc: procMount Unmasked, which the kubelet accepts only in a user namespace (hostUsers: false).
        container_sec = {**container_sec, "seccompProfile": {"type": "Unconfined"}, "procMount": "Unmasked"}
    if opts.idle:
        replicas = 0
    elif opts.sandbox_replicas is None:
        replicas = s.min_replicas
    else:
        replicas = min(max(opts.sandbox_replicas, s.min_replicas), s.max_replicas)
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "args": ["wmrl", "sandbox", "serve", "--port", str(SANDBOX_PORT)],
        "env": sandbox_env(spec),
        "ports": [{"name": "http", "containerPort": SANDBOX_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": SANDBOX_PORT}, "periodSeconds": 5},
        # A server that refuses to start writes why to the termination message (else its last log lines
        # stand in): the operator reads it into the run's SandboxReady condition.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_sec,
        "volumeMounts": [{"name": "work", "mountPath": WORK_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    container["resources"] = _resources(s.resources, gpus=s.gpus,
                                        defaults=sandbox_default_resources(s.slots_per_pod, s))
    work_mi, tmp_mi = sandbox_volume_mebibytes(s.slots_per_pod, s.file_size_mb)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_sec,
        "containers": [container],
        "volumes": [{"name": "work", "emptyDir": {"medium": "Memory", "sizeLimit": _mi(work_mi)}},
                    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _mi(tmp_mi)}}],
    }
    if sandbox_mounts_tasks(spec):
        # The whole claim, read-only: each execution sees only its task's public directory (the server
        # hides the rest, private answers included, in the execution's mount namespace; docs/sandbox.md).
        pod_spec["volumes"].append({"name": "tasks", "persistentVolumeClaim": {"claimName": spec.tasks.pvc,
                                                                               "readOnly": True}})
        container["volumeMounts"].append({"name": "tasks", "mountPath": TASKS_MOUNT, "readOnly": True})
    if namespaces:
        pod_spec["hostUsers"] = False
    if s.runtime_class_name:
        pod_spec["runtimeClassName"] = s.runtime_class_name
    _place(pod_spec, s)
    return _deployment(run, sandbox_name(run), "sandbox", replicas, pod_spec)


def sandbox_service(run: Run) -> dict[str, Any]:
    return _service(_meta(run, sandbox_name(run), "sandbox"), labels(run, "sandbox"), SANDBOX_PORT, "http", headless=True)


def sandbox_api_name(run: Run) -> str:
    return f"{sandbox_name(run)}-api"


def sandbox_api_service(run: Run) -> dict[str, Any]:
    """``spec.sandbox.clientAccess``: a ClusterIP Service, so that clients other than the trainers
    (which pick Pods themselves through the headless Service) are load-balanced across the pool."""
    return _service(_meta(run, sandbox_api_name(run), "sandbox"), labels(run, "sandbox"), SANDBOX_PORT, "http",
                    headless=False)


def sandbox_network_policy(run: Run, spec: WMRLRunSpec) -> dict[str, Any]:
    """Ingress only from this run's trainer pods on the sandbox port (and, with
    ``spec.sandbox.clientAccess``, from the Pods it selects); no egress at all."""
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": labels(run, "trainer")}}]
    access = spec.sandbox.client_access
    if access.enabled:
        peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(access.pod_selector)}}
        if access.namespace_selector is not None:
            peer["namespaceSelector"] = {"matchLabels": dict(access.namespace_selector)}
        peers.append(peer)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(run, sandbox_name(run), "sandbox"),
        "spec": {
            "podSelector": {"matchLabels": labels(run, "sandbox")},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]}],
            "egress": [],
        },
    }


# ---------------------------------------------------------------- world model (vLLM)


WORLD_MODEL_STRUCTURED_OUTPUTS = {"backend": "guidance", "disable_any_whitespace": True}
"""vLLM's structured-output backend for the world model. Under the default (xgrammar, vLLM 0.32) a
string with ``maxLength`` admits raw control characters, so answers to the world model's schema
were not JSON; under guidance without free whitespace every answer was (tests/vllm_cpu/parse_rate.py)."""


def world_model_deployment(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> dict[str, Any]:
    wm = spec.world_model
    model = wm.model or spec.policy.model
    args = ["--model", model, "--served-model-name", model, "--host", "0.0.0.0", "--port", str(WORLD_MODEL_PORT),
            "--structured-outputs-config", json.dumps(WORLD_MODEL_STRUCTURED_OUTPUTS, separators=(",", ":"))]
    if wm.gpus_per_replica > 1:
        args += ["--tensor-parallel-size", str(wm.gpus_per_replica)]
    pod_sec, container_sec = _root_image_security()
    shm_volume, shm_mount = _shm_volume(wm.gpus_per_replica)
    container: dict[str, Any] = {
        "name": "vllm",
        "image": wm.image,
        "args": args,
        "ports": [{"name": "http", "containerPort": WORLD_MODEL_PORT}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": WORLD_MODEL_PORT}, "periodSeconds": 10},
        "securityContext": container_sec,
        "volumeMounts": [shm_mount],
    }
    res = _resources(wm.resources, wm.gpus_per_replica)
    if res:
        container["resources"] = res
    replicas = 0 if opts.idle else wm.replicas
    pod_spec: dict[str, Any] = {"automountServiceAccountToken": False, "securityContext": pod_sec,
                                "containers": [container], "volumes": [shm_volume]}
    return _deployment(run, world_model_name(run), "world-model", replicas, pod_spec)


def rollout_deployment(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> dict[str, Any]:
    """TRL's rollout server (``trl vllm-serve``, from the trainer image) for ``vllmMode: server``: the
    trainer's rank 0 sends it prompts and, after each step, the new weights (an NCCL group on
    ``ROLLOUT_GROUP_PORT``); it shards the policy over ``vllmTensorParallelSize`` GPUs."""
    p, t = spec.policy, spec.trainer
    pod_sec, container_sec = _hardened_security()
    shm_volume, shm_mount = _shm_volume(p.vllm_tensor_parallel_size)
    scratch = _scratch()
    container: dict[str, Any] = {
        "name": "vllm",
        "image": t.image,
        "imagePullPolicy": t.image_pull_policy,
        "command": ["trl", "vllm-serve", "--model", p.model, "--tensor-parallel-size", str(p.vllm_tensor_parallel_size),
                    "--host", "0.0.0.0", "--port", str(ROLLOUT_PORT)],
        "env": [{"name": k, "value": v} for k, v in TRAINER_CACHE_ENV.items()],
        "ports": [{"name": "http", "containerPort": ROLLOUT_PORT}, {"name": "weights", "containerPort": ROLLOUT_GROUP_PORT}],
        "readinessProbe": {"httpGet": {"path": "/health/", "port": ROLLOUT_PORT}, "periodSeconds": 10},
        "securityContext": container_sec,
        "volumeMounts": [shm_mount] + [m for _, m in scratch],
    }
    res = _resources(Resources(), p.vllm_tensor_parallel_size)
    if res:
        container["resources"] = res
    pod_spec: dict[str, Any] = {"automountServiceAccountToken": False, "securityContext": pod_sec,
                                "containers": [container], "volumes": [shm_volume] + [v for v, _ in scratch]}
    _place(pod_spec, t)  # the trainer's nodes (its GPU pool)
    replicas = 0 if opts.idle else 1
    return _deployment(run, rollout_name(run), "rollout", replicas, pod_spec)


def rollout_service(run: Run) -> dict[str, Any]:
    service = _service(_meta(run, rollout_name(run), "rollout"), labels(run, "rollout"), ROLLOUT_PORT, "http",
                       headless=False)
    service["spec"]["ports"].append({"name": "weights", "port": ROLLOUT_GROUP_PORT, "targetPort": ROLLOUT_GROUP_PORT,
                                     "protocol": "TCP"})
    return service


def world_model_service(run: Run) -> dict[str, Any]:
    return _service(_meta(run, world_model_name(run), "world-model"), labels(run, "world-model"),
                    WORLD_MODEL_PORT, "http", headless=False)


# ---------------------------------------------------------------- calibration service


def calibration_state_name(run: Run, spec: WMRLRunSpec) -> str:
    return f"{calibration_name(run, spec)}-state"


def _calibration_meta(run: Run, spec: WMRLRunSpec, name: str, state_uid: Optional[str] = None) -> dict[str, Any]:
    """A run's own calibration is owned and run-labelled. A shared one belongs to no run: its state
    ConfigMap (the calibration's data, owned by nobody) owns the rest of it, so deleting that one
    object deletes the whole calibration (``state_uid``: the ConfigMap's uid, once it exists)."""
    cname = calibration_name(run, spec)
    if calibration_shared(spec):
        meta: dict[str, Any] = {"name": name, "namespace": run.namespace,
                                "labels": {CALIBRATION_LABEL: cname, **MANAGED_BY, COMPONENT_LABEL: "calibration"}}
        state = calibration_state_name(run, spec)
        if state_uid and name != state:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": state, "uid": state_uid,
                                        "controller": True, "blockOwnerDeletion": False}]
        return meta
    meta = _meta(run, name, "calibration")
    meta["labels"][CALIBRATION_LABEL] = cname
    return meta


def calibration_config(spec: WMRLRunSpec) -> dict[str, Any]:
    """The debiasing/denoising knobs for the calibration service (env ``WMRL_CALIBRATION_CONFIG``,
    the JSON of ``wmrl.calibration.state.CalibrationConfig``)."""
    return CalibrationConfig.from_spec(spec.algorithm).to_json()


def calibration_objects(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> list[dict[str, Any]]:
    """State ConfigMap (no ``data``: the service owns it) + SA/Role/RoleBinding + Deployment + Service."""
    c = calibration_name(run, spec)
    state = calibration_state_name(run, spec)
    uid = opts.calibration_state_uid
    selector = {CALIBRATION_LABEL: c, COMPONENT_LABEL: "calibration"}
    args = ["wmrl", "calibration", "serve", "--configmap", f"{run.namespace}/{state}", "--port", str(CALIBRATION_PORT)]
    pod_sec, container_sec = _hardened_security()
    container = {
        "name": "calibration",
        "image": spec.calibration.image or opts.operator_image,
        "args": args,
        "env": [{"name": "WMRL_CALIBRATION_CONFIG", "value": json.dumps(calibration_config(spec), sort_keys=True)},
                calibration_token_env(run, spec)],
        "ports": [{"name": "http", "containerPort": CALIBRATION_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": CALIBRATION_PORT}, "periodSeconds": 5},
        "securityContext": container_sec,
    }
    deployment_labels = {**_calibration_meta(run, spec, c, uid)["labels"], **selector}
    pod_spec: dict[str, Any] = {"serviceAccountName": c, "securityContext": pod_sec, "containers": [container]}
    _place(pod_spec, spec.calibration)
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _calibration_meta(run, spec, state)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _calibration_meta(run, spec, c, uid)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _calibration_meta(run, spec, c, uid),
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [state],
                    "verbs": ["get", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _calibration_meta(run, spec, c, uid),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": c},
         "subjects": [{"kind": "ServiceAccount", "name": c, "namespace": run.namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _calibration_meta(run, spec, c, uid),
         "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                  "template": {"metadata": {"labels": deployment_labels}, "spec": pod_spec}}},
        _service(_calibration_meta(run, spec, c, uid), selector, CALIBRATION_PORT, "http", headless=False),
        calibration_network_policy(run, spec, uid),
    ]


def calibration_token_secret(run: Run, spec: WMRLRunSpec, token: str, state_uid: Optional[str] = None) -> dict[str, Any]:
    """The calibration's token Secret, created once with ``token`` (the reconciler draws it) and never rewritten:
    re-applying would rotate it under running trainers."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _calibration_meta(run, spec, calibration_token_name(run, spec), state_uid),
            "stringData": {TOKEN_KEY: token}}


def calibration_network_policy(run: Run, spec: WMRLRunSpec, state_uid: Optional[str] = None) -> dict[str, Any]:
    """Ingress to the calibration service only from the trainers that share it (any run's, labelled with
    its name) and from the operator's Pods (reads for the run's status)."""
    c = calibration_name(run, spec)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _calibration_meta(run, spec, c, state_uid),
        "spec": {
            "podSelector": {"matchLabels": {CALIBRATION_LABEL: c, COMPONENT_LABEL: "calibration"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {CALIBRATION_LABEL: c, COMPONENT_LABEL: "trainer"}}},
                                  {"namespaceSelector": {},
                                   "podSelector": {"matchLabels": {CALIBRATION_READER_LABEL: "true"}}}],
                         "ports": [{"protocol": "TCP", "port": CALIBRATION_PORT}]}],
        },
    }


def ownership_conflict(run: Run, desired: dict[str, Any], existing: Optional[dict[str, Any]]) -> Optional[str]:
    """Why applying ``desired`` would take over an object that is not this run's to write, or None.

    Child names are derived from the run's own name, except a calibration's, which the spec names
    (``spec.calibration.name``): a run could name another run's calibration (``<other>-calibration``)
    or make its own collide with a shared one. Server-side apply from the same field manager would
    then silently take the object over (and drop the other run's owner reference).
    """
    if existing is None:
        return None
    where = f"{desired['kind']} {run.namespace}/{desired['metadata']['name']}"
    owners = [r for r in existing["metadata"].get("ownerReferences") or [] if r.get("controller")]
    labels = existing["metadata"].get("labels") or {}
    wanted = desired["metadata"].get("labels") or {}
    shared_desired = RUN_LABEL not in wanted and CALIBRATION_LABEL in wanted
    shared_existing = RUN_LABEL not in labels and CALIBRATION_LABEL in labels and \
        all(o.get("kind") == "ConfigMap" and o.get("name") == f"{labels[CALIBRATION_LABEL]}-state" for o in owners)
    if shared_existing and not shared_desired:
        return f"{where} is the shared calibration {labels[CALIBRATION_LABEL]!r}, not this run's own"
    if owners and owners[0].get("uid") != run.uid and not (shared_existing and shared_desired):
        return f"{where} belongs to {owners[0].get('kind')} {owners[0].get('name')!r} (spec.calibration.name)"
    if desired["kind"] == "Deployment" and shared_desired:
        # Runs sharing a calibration must agree on what it computes: the first one's settings stand.
        theirs, ours = _calibration_settings(existing), _calibration_settings(desired)
        if theirs is not None and ours is not None and theirs != ours:
            differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            return (f"the shared calibration {desired['metadata']['name']!r} runs with other settings "
                    f"({', '.join(differ)}): runs that share it must agree on spec.algorithm's debiasing and denoising")
    return None


def _calibration_settings(deployment: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The calibration service's settings (its WMRL_CALIBRATION_CONFIG) in a Deployment, if any."""
    for container in deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for env in container.get("env") or []:
            if env.get("name") == "WMRL_CALIBRATION_CONFIG" and env.get("value"):
                return json.loads(env["value"])
    return None


# ---------------------------------------------------------------- everything


def children(run: Run, spec: WMRLRunSpec, opts: Options = Options()) -> list[dict[str, Any]]:
    """Every object of the run, in apply order (config and RBAC before the pods that use them).

    The trainer Job is last so that, when it starts, its config, RBAC and services exist.
    """
    objs: list[dict[str, Any]] = [config_map(run, spec)]
    objs += trainer_rbac(run)
    if needs_calibration(spec):
        objs += calibration_objects(run, spec, opts)
    objs += [sandbox_network_policy(run, spec), sandbox_service(run)]
    if spec.sandbox.client_access.enabled:
        objs.append(sandbox_api_service(run))
    objs.append(sandbox_deployment(run, spec, opts))
    if serves_world_model(spec):
        objs += [world_model_service(run), world_model_deployment(run, spec, opts)]
    if serves_rollouts(spec):
        objs += [rollout_service(run), rollout_deployment(run, spec, opts)]
    if spec.trainer.nodes > 1:
        objs.append(trainer_service(run))
    objs.append(trainer_job(run, spec, opts))
    return objs


PRUNABLE: tuple[tuple[str, str], ...] = (("apps/v1", "Deployment"), ("v1", "Service"))
"""Kinds of child that a spec change can make unwanted (the vLLM world model once an endpoint is given,
the rollout server once a vllmServerUrl is given or vllmMode is colocate, the sandbox API Service once
clientAccess is off, the trainer's Service below two nodes)."""


def unwanted(run: Run, desired: list[dict[str, Any]], existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of ``existing`` (listed by the run's label) that this run owns and no longer wants.

    Only objects whose owner reference is this very run (by uid) are candidates: a shared
    calibration (owned by no run) or another run's object with the same label is never pruned.
    """
    want = {(o["kind"], o["metadata"]["name"]) for o in desired}
    return [o for o in existing
            if (o.get("kind"), o["metadata"]["name"]) not in want
            and any(ref.get("uid") == run.uid for ref in o["metadata"].get("ownerReferences") or [])]


def stamped(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with :data:`APPLIED_HASH` set to a hash of everything else in it: two manifests get
    the same stamp exactly when they are the same (key order aside)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "annotations"}
    annotations = {k: v for k, v in (obj["metadata"].get("annotations") or {}).items() if k != APPLIED_HASH}
    canonical = json.dumps({**obj, "metadata": {**meta, "annotations": annotations}}, sort_keys=True,
                           separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:20]
    return {**obj, "metadata": {**meta, "annotations": {**annotations, APPLIED_HASH: digest}}}


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
