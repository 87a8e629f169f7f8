"""The API's wire names (``wmrl.api.vocabulary``): clusters, selectors and kopf's bookkeeping
depend on their exact spelling, so each is pinned here."""

from wmrl.api import vocabulary as v


def test_labels_and_annotations_keep_their_wire_names():
    assert v.RUN_LABEL == "wmrl.dev/run"
    assert v.CALIBRATION_LABEL == "wmrl.dev/calibration"
    assert v.CALIBRATION_READER_LABEL == "wmrl.dev/calibration-reader"
    assert v.APPLIED_HASH == "wmrl.dev/applied-hash"
    assert v.MANAGED_BY_SELECTOR == "app.kubernetes.io/managed-by=wmrl-operator"
    assert v.ADMISSION_LABELS == ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class")


def test_kopf_bookkeeping_keeps_its_names():
    assert (v.KOPF_ANNOTATION_PREFIX, v.LAST_HANDLED_CONFIGURATION) == ("wmrl.dev", "last-handled-configuration")
    assert v.FINALIZER == "wmrl.dev/finalizer"
    assert v.WEBHOOK_CONFIGURATION == "wmrl.dev"


def test_condition_types_and_reasons_keep_the_names_docs_operator_md_lists():
    assert v.CONDITION_TYPES == ("Running", "Suspended", "Complete", "Failed")
    reasons = (v.TRAINER_RUNNING, v.TRAINER_PENDING, v.TRAINER_COMPLETED, v.RESTARTING, v.SUSPENDED, v.QUEUED,
               v.WAITING_FOR_REFERENCES, v.REFERENCE_MISSING, v.OWNERSHIP_CONFLICT, v.INVALID_SPEC,
               v.MAX_RESTARTS, v.DEADLINE)
    assert reasons == ("TrainerRunning", "TrainerPending", "TrainerCompleted", "Restarting", "Suspended", "Queued",
                       "WaitingForReferences", "ReferenceMissing", "OwnershipConflict", "InvalidSpec",
                       "MaxRestartsExceeded", "DeadlineExceeded")
    assert (v.NOT_SUSPENDED, v.NOT_COMPLETE, v.NOT_FAILED) == ("NotSuspended", "NotComplete", "NotFailed")
    assert (v.TRAINER_RESTARTED, v.SANDBOX_SCALED) == ("TrainerRestarted", "SandboxScaled")  # Event reasons


def test_the_sandbox_condition_and_its_reasons_keep_their_names():
    assert v.SANDBOX_READY_CONDITION == "SandboxReady" and v.SANDBOX_READY_CONDITION not in v.CONDITION_TYPES
    assert (v.SANDBOX_PODS_READY, v.SANDBOX_PODS_STARTING, v.SANDBOX_SCALED_TO_ZERO, v.SANDBOX_PODS_FAILING,
            v.ISOLATION_UNAVAILABLE) == ("PodsReady", "PodsStarting", "ScaledToZero", "PodsFailing",
                                         "IsolationUnavailable")
    # Between the sandbox server (its termination message) and the operator (which reads it).
    assert v.SANDBOX_ISOLATION_REFUSAL == "isolation unavailable"
