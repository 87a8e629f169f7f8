"""The names the WMRLRun API puts on the wire besides its schema: labels, annotations, the
finalizer, condition types and reasons, and Event reasons.

The operator writes them, the chart and ``install.yaml`` (generated) carry some of them, users and
tools select by them: each is spelled here once. The group comes from :mod:`wmrl.api.schema`, so
``wmrl.dev`` itself is spelled once too.
"""

from __future__ import annotations

from wmrl.api.schema import GROUP

# ---------------------------------------------------------------- labels

RUN_LABEL = f"{GROUP}/run"
"""On every child of a run: the run's name (the operator finds a run's children by it)."""
CALIBRATION_LABEL = f"{GROUP}/calibration"
"""On a calibration's objects and on the trainer Pods that may reach it: the calibration's name."""
CALIBRATION_READER_LABEL = f"{GROUP}/calibration-reader"
"""On the operator's own Pods: a calibration's NetworkPolicy admits them to read it (into the run's status)."""
COMPONENT_LABEL = "app.kubernetes.io/component"
"""What a child is: trainer, sandbox, world-model, calibration, ... (the operator's Pods: operator)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "wmrl-operator"}
"""On every child the operator writes; the children caches list and watch by it."""
MANAGED_BY_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())

# Kueue: a run labelled with a LocalQueue hands its trainer Job to Kueue, which admits it by
# unsuspending it. The labels are copied from the run to the Job, as Kueue's own integrations do.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
ADMISSION_LABELS = (QUEUE_LABEL, PRIORITY_CLASS_LABEL)
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On the Workload Kueue makes for a Job: the Job's uid."""

# ---------------------------------------------------------------- annotations and finalizer

APPLIED_HASH = f"{GROUP}/applied-hash"
"""On every applied child: the hash of the manifest the operator applied (``builders.stamped``)."""
KOPF_ANNOTATION_PREFIX = GROUP
"""kopf's bookkeeping on a run (handler progress, the last handled spec) is annotations under it."""
LAST_HANDLED_CONFIGURATION = "last-handled-configuration"
"""kopf's diff base: the annotation ``<KOPF_ANNOTATION_PREFIX>/last-handled-configuration``."""
FINALIZER = f"{GROUP}/finalizer"
"""The finalizer kopf puts on a run when a handler needs one (the operator registers none that do)."""
WEBHOOK_CONFIGURATION = GROUP
"""The name of the Validating/MutatingWebhookConfiguration kopf manages with ``--webhook``."""

# ---------------------------------------------------------------- status.conditions

RUNNING_CONDITION = "Running"
SUSPENDED_CONDITION = "Suspended"
COMPLETE_CONDITION = "Complete"
FAILED_CONDITION = "Failed"
CONDITION_TYPES = (RUNNING_CONDITION, SUSPENDED_CONDITION, COMPLETE_CONDITION, FAILED_CONDITION)

# Reasons of the Running condition (and of Suspended, Complete or Failed while it is True).
TRAINER_RUNNING = "TrainerRunning"
TRAINER_PENDING = "TrainerPending"
TRAINER_COMPLETED = "TrainerCompleted"
EVALUATION_COMPLETED = "EvaluationCompleted"  # mode eval: the evaluation Job completed
RESTARTING = "Restarting"  # a failed trainer Job is being replaced
SUSPENDED = "Suspended"  # spec.suspend holds the trainer and the pools at zero
QUEUED = "Queued"  # waiting for Kueue to admit the trainer Job
WAITING_FOR_REFERENCES = "WaitingForReferences"  # nothing created: an object the spec names is missing
REFERENCE_MISSING = "ReferenceMissing"  # the same while the trainer exists: its phase is unchanged
OWNERSHIP_CONFLICT = "OwnershipConflict"  # writing would take over another run's (or a shared) calibration
INVALID_SPEC = "InvalidSpec"
MAX_RESTARTS = "MaxRestartsExceeded"
DEADLINE = "DeadlineExceeded"
# Reasons of Suspended, Complete and Failed while they are False.
NOT_SUSPENDED = "NotSuspended"
NOT_COMPLETE = "NotComplete"
NOT_FAILED = "NotFailed"

SANDBOX_READY_CONDITION = "SandboxReady"
"""Whether the sandbox pool serves: set from its Pods by the operator's resync (not by the phase)."""
# Reasons of SandboxReady.
SANDBOX_PODS_READY = "PodsReady"
SANDBOX_PODS_STARTING = "PodsStarting"
SANDBOX_SCALED_TO_ZERO = "ScaledToZero"
SANDBOX_PODS_FAILING = "PodsFailing"  # Pods crash or cannot be created, for a reason of their own
ISOLATION_UNAVAILABLE = "IsolationUnavailable"  # the node's runtime cannot give spec.sandbox.isolation
SANDBOX_ISOLATION_REFUSAL = "isolation unavailable"
"""How a sandbox server's refusal to start without its isolation begins (its Pod's termination
message, where the operator reads it)."""

# ---------------------------------------------------------------- Event reasons (besides the conditions')

TRAINER_RESTARTED = "TrainerRestarted"
SANDBOX_SCALED = "SandboxScaled"
