"""The operator against the real control plane: children, phases, suspend, restarts, deadlines,
TTL, immutability, status ownership, garbage collection. Pods run on kwok nodes (they run
nothing); the tests finish them with the ``wmrl.dev/kwok-phase`` annotation."""

import json

import pytest
import yaml

from operator_helpers import run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHILDREN = [
    ("configmap", "{r}-config"), ("serviceaccount", "{r}-trainer"), ("role", "{r}-trainer"),
    ("rolebinding", "{r}-trainer"), ("job", "{r}-trainer"), ("deployment", "{r}-sandbox"),
    ("service", "{r}-sandbox"), ("networkpolicy", "{r}-sandbox"), ("deployment", "{r}-world-model"),
    ("service", "{r}-world-model"), ("configmap", "{r}-calibration-state"), ("deployment", "{r}-calibration"),
    ("service", "{r}-calibration"), ("serviceaccount", "{r}-calibration"), ("role", "{r}-calibration"),
    ("rolebinding", "{r}-calibration"), ("secret", "{r}-calibration-token-{u}"), ("networkpolicy", "{r}-calibration"),
]


def rendered_spec(kube, name):
    """The spec the trainer would read: ``run.yaml`` of the run's config ConfigMap (None while absent)."""
    config_map = kube.get("configmap", f"{name}-config")
    return config_map and yaml.safe_load(config_map["data"]["run.yaml"])["spec"]


def sandbox_env(kube, name):
    container = kube.get("deployment", f"{name}-sandbox")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def phase(kube, name):
    return kube.status(name).get("phase")


def condition(kube, name, type_):
    for cond in kube.status(name).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return None


def test_children_appear_owned_and_run_becomes_running(kube, operator):
    kube.apply(run_manifest("alpha"))
    uid = wait_for(lambda: (kube.get("wmrlrun", "alpha") or {}).get("metadata", {}).get("uid"), what="run uid")
    for kind, pattern in CHILDREN:
        name = pattern.format(r="alpha", u=uid[:8])
        obj = wait_for(lambda: kube.get(kind, name), what=f"{kind}/{name}")
        refs = obj["metadata"].get("ownerReferences") or []
        assert [(r["kind"], r["name"], r["uid"], r.get("controller")) for r in refs] == [("WMRLRun", "alpha", uid, True)]
        assert obj["metadata"]["labels"]["wmrl.dev/run"] == "alpha"
    wait_for(lambda: phase(kube, "alpha") == "Running", what="phase Running")
    status = kube.status("alpha")
    assert status["observedGeneration"] == 1 and status["startTime"] and status["restarts"] == 0
    assert condition(kube, "alpha", "Running")["status"] == "True"
    printed = kube.run("get", "wmr", "alpha", "-n", kube.ns).stdout
    assert "Running" in printed and "wmrl" in printed


def test_trainer_success_makes_run_succeeded_and_scales_pools_down(kube, operator, kwok_nodes):
    kube.apply(run_manifest("beta", mode="real"))
    wait_for(lambda: phase(kube, "beta") == "Running", what="Running")
    assert kube.finish_pods("beta", "Succeeded") == 1
    wait_for(lambda: phase(kube, "beta") == "Succeeded", what="Succeeded")
    status = kube.status("beta")
    assert status["completionTime"]
    assert condition(kube, "beta", "Complete")["status"] == "True"
    wait_for(lambda: kube.get("deployment", "beta-sandbox")["spec"]["replicas"] == 0, what="sandbox at 0")
    # The Event is posted just after the status write: wait for it rather than racing it.
    wait_for(lambda: "TrainerCompleted" in kube.events("beta").split(), what="TrainerCompleted event")


def test_failed_trainer_restarts_up_to_max_then_run_fails(kube, operator, kwok_nodes):
    kube.apply(run_manifest("gamma", mode="real", failurePolicy={"maxRestarts": 1}))
    wait_for(lambda: phase(kube, "gamma") == "Running", what="Running")
    first = kube.get("job", "gamma-trainer")["metadata"]["uid"]
    kube.finish_pods("gamma", "Failed")
    wait_for(lambda: kube.status("gamma").get("restarts") == 1, what="restarts == 1")
    second = wait_for(lambda: (kube.get("job", "gamma-trainer") or {}).get("metadata", {}).get("uid") not in (None, first)
                      and kube.get("job", "gamma-trainer")["metadata"]["uid"], what="a new trainer Job")
    wait_for(lambda: phase(kube, "gamma") == "Running", what="Running again")
    kube.finish_pods("gamma", "Failed")
    wait_for(lambda: phase(kube, "gamma") == "Failed", what="Failed")
    failed = condition(kube, "gamma", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "MaxRestartsExceeded"
    assert "maxRestarts" in failed["message"]
    status = kube.status("gamma")
    assert status["restarts"] == 1 and status["lastFailedTrainer"] == second
    assert kube.get("job", "gamma-trainer")["metadata"]["uid"] == second  # kept for its logs, not recreated


def test_suspend_and_resume(kube, operator):
    kube.apply(run_manifest("delta", sandbox={"minReplicas": 2, "maxReplicas": 3}))
    wait_for(lambda: phase(kube, "delta") == "Running", what="Running")
    kube.run("patch", "wmrlrun", "delta", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: phase(kube, "delta") == "Suspended", what="Suspended")
    assert kube.get("job", "delta-trainer")["spec"]["suspend"] is True
    wait_for(lambda: kube.get("deployment", "delta-sandbox")["spec"]["replicas"] == 0, what="sandbox 0")
    assert kube.get("deployment", "delta-world-model")["spec"]["replicas"] == 0
    wait_for(lambda: not kube.items("pods", "wmrl.dev/run=delta,app.kubernetes.io/component=trainer"),
             what="trainer pods gone")
    assert condition(kube, "delta", "Suspended")["status"] == "True"
    kube.run("patch", "wmrlrun", "delta", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: phase(kube, "delta") == "Running", what="Running after resume")
    assert kube.get("job", "delta-trainer")["spec"]["suspend"] is False
    assert kube.get("deployment", "delta-sandbox")["spec"]["replicas"] == 2
    assert kube.get("deployment", "delta-world-model")["spec"]["replicas"] == 1


def test_active_deadline_fails_the_run_and_ttl_deletes_it(kube, operator):
    kube.apply(run_manifest("epsilon", mode="real", activeDeadlineSeconds=3, ttlSecondsAfterFinished=2))
    wait_for(lambda: phase(kube, "epsilon") == "Failed", timeout=30, what="Failed by deadline")
    assert condition(kube, "epsilon", "Failed")["reason"] == "DeadlineExceeded"
    # Only the resync loop notices a deadline: its Events must be posted too (kopf.event cannot there).
    wait_for(lambda: "DeadlineExceeded" in kube.events("epsilon").split(), what="DeadlineExceeded event")
    wait_for(lambda: kube.get("wmrlrun", "epsilon") is None, timeout=30, what="run deleted after ttl")


def test_operator_never_overwrites_progress(kube, operator):
    kube.apply(run_manifest("zeta", mode="real"))
    wait_for(lambda: phase(kube, "zeta") == "Running", what="Running")
    progress = {"step": 7, "totalSteps": 10, "meanRealReward": 0.42, "sandboxDemand": 0, "futureField": "kept"}
    kube.patch_status("zeta", {"progress": progress})
    assert rendered_spec(kube, "zeta")["algorithm"]["steps"] != 11
    kube.run("patch", "wmrlrun", "zeta", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"algorithm":{"steps":11}}}')
    wait_for(lambda: kube.status("zeta").get("observedGeneration") == 2, what="generation 2 observed")
    wait_for(lambda: rendered_spec(kube, "zeta")["algorithm"]["steps"] == 11, what="steps 11 in the trainer's config")
    assert kube.status("zeta")["progress"] == progress
    printed = kube.run("get", "wmr", "zeta", "-n", kube.ns).stdout
    assert " 7 " in printed and "0.42" in printed


def ensure_active(kube, name):
    if kube.get("wmrlrun", name) is None:
        kube.apply(run_manifest(name))
    wait_for(lambda: phase(kube, name) in ("Pending", "Running"), what=f"{name} active")


@pytest.mark.parametrize("patch,field", [
    ({"policy": {"model": "other/model"}}, "spec.policy.model"),
    ({"mode": "worldModel"}, "spec.mode"),
    ({"tasks": {"builtin": None, "path": "/data/tasks"}}, "spec.tasks"),
    ({"worldModel": {"model": "other/wm"}}, "spec.worldModel.model"),
    ({"worldModel": {"backend": "learned"}}, "spec.worldModel.backend"),
])
def test_identity_fields_immutable_while_active(kube, operator, patch, field):
    ensure_active(kube, "eta")
    res = kube.run("patch", "wmrlrun", "eta", "-n", kube.ns, "--type=merge", "-p", json.dumps({"spec": patch}), check=False)
    assert res.returncode != 0
    assert field in res.stderr and "immutable" in res.stderr


def test_mutable_fields_still_change_while_active(kube, operator):
    """Accepted while active, and the children follow: the trainer's config and the sandbox pool."""
    ensure_active(kube, "eta")
    wait_for(lambda: rendered_spec(kube, "eta"), what="eta's config")
    before = rendered_spec(kube, "eta")
    assert (before["sandbox"]["maxReplicas"], before["algorithm"]["steps"]) != (5, 99)
    assert kube.get("deployment", "eta-sandbox")["spec"]["replicas"] == before["sandbox"]["minReplicas"] == 1
    assert sandbox_env(kube, "eta")["WMRL_SANDBOX_TIMEOUT_SECONDS"] != "123"
    res = kube.run("patch", "wmrlrun", "eta", "-n", kube.ns, "--type=merge", "-p",
                   '{"spec":{"sandbox":{"minReplicas":2,"maxReplicas":5,"timeoutSeconds":123},"algorithm":{"steps":99}}}',
                   check=False)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: rendered_spec(kube, "eta")["algorithm"]["steps"] == 99, what="steps 99 in the trainer's config")
    after = rendered_spec(kube, "eta")["sandbox"]
    assert (after["minReplicas"], after["maxReplicas"], after["timeoutSeconds"]) == (2, 5, 123)
    wait_for(lambda: kube.get("deployment", "eta-sandbox")["spec"]["replicas"] == 2, what="sandbox pool at minReplicas 2")
    assert sandbox_env(kube, "eta")["WMRL_SANDBOX_TIMEOUT_SECONDS"] == "123"


def test_a_missing_reference_waits_and_nothing_is_created(kube, operator):
    kube.apply(run_manifest("theta", tasks={"configMap": "no-such-tasks"}))
    wait_for(lambda: condition(kube, "theta", "Running") and
             condition(kube, "theta", "Running")["reason"] == "WaitingForReferences", what="WaitingForReferences")
    assert phase(kube, "theta") == "Pending" and condition(kube, "theta", "Failed")["status"] == "False"
    assert "spec.tasks.configMap" in condition(kube, "theta", "Running")["message"]
    for kind in ("job", "deployment", "configmap", "service"):
        assert kube.items(kind, "wmrl.dev/run=theta") == []
    # Creating the object lets the run proceed by itself.
    kube.run("create", "configmap", "no-such-tasks", "-n", kube.ns, "--from-literal=task.yaml=name: t")
    wait_for(lambda: kube.get("job", "theta-trainer"), timeout=30, what="run proceeds")
    wait_for(lambda: phase(kube, "theta") == "Running", timeout=60, what="Running")
    # Deleting it while the trainer runs never fails the run: the condition says so, the phase stays.
    kube.run("delete", "configmap", "no-such-tasks", "-n", kube.ns)
    wait_for(lambda: condition(kube, "theta", "Running")["reason"] == "ReferenceMissing", timeout=30,
             what="ReferenceMissing")
    assert phase(kube, "theta") == "Running" and condition(kube, "theta", "Failed")["status"] == "False"


def test_children_the_spec_no_longer_wants_are_pruned(kube, operator):
    kube.apply(run_manifest("kappa", sandbox={"clientAccess": {"enabled": True}}))
    wait_for(lambda: kube.get("service", "kappa-sandbox-api"), what="the sandbox API service")
    res = kube.run("patch", "wmrlrun", "kappa", "-n", kube.ns, "--type=merge", "-p",
                   '{"spec":{"sandbox":{"clientAccess":{"enabled":false}}}}', check=False)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: kube.get("service", "kappa-sandbox-api") is None, timeout=30, what="the API service pruned")
    assert kube.get("service", "kappa-sandbox") is not None and kube.get("deployment", "kappa-sandbox") is not None


def test_the_rollout_server_comes_and_goes_with_server_mode(kube, operator):
    """vllmMode server without a URL: the operator deploys TRL's rollout server and points the trainer
    at it; naming a server of your own prunes it (its GPUs are released)."""
    policy = {"model": "builtin:tiny-coder", "rolloutEngine": "vllm", "vllmMode": "server"}
    kube.apply(run_manifest("lambda", policy=policy))
    deployment = wait_for(lambda: kube.get("deployment", "lambda-rollout"), what="the rollout server")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["trl", "vllm-serve"]
    assert kube.get("service", "lambda-rollout") is not None
    assert rendered_spec(kube, "lambda")["policy"]["vllmMode"] == "server"
    runtime = yaml.safe_load(kube.get("configmap", "lambda-config")["data"]["run.yaml"])["runtime"]
    assert runtime["rolloutUrl"] == f"http://lambda-rollout.{kube.ns}.svc:8000"
    res = kube.run("patch", "wmrlrun", "lambda", "-n", kube.ns, "--type=merge", "-p",
                   '{"spec":{"policy":{"vllmServerUrl":"http://my-rollouts:8000"}}}', check=False)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: kube.get("deployment", "lambda-rollout") is None and kube.get("service", "lambda-rollout") is None,
             timeout=30, what="the rollout server pruned")


def test_naming_another_runs_calibration_waits_under_a_conflict_and_touches_nothing(kube, operator):
    kube.apply(run_manifest("mu"))
    owner = wait_for(lambda: kube.get("deployment", "mu-calibration"), what="mu's own calibration")
    kube.apply(run_manifest("nu", calibration={"name": "mu-calibration"}))
    wait_for(lambda: (condition(kube, "nu", "Running") or {}).get("reason") == "OwnershipConflict",
             what="nu's OwnershipConflict condition")
    message = condition(kube, "nu", "Running")["message"]
    assert f"Deployment {kube.ns}/mu-calibration belongs to WMRLRun 'mu'" in message
    assert kube.status("nu")["phase"] == "Pending" and kube.get("job", "nu-trainer") is None
    after = kube.get("deployment", "mu-calibration")
    assert after["metadata"]["ownerReferences"] == owner["metadata"]["ownerReferences"]  # still mu's
    assert after["metadata"]["generation"] == owner["metadata"]["generation"]  # not rewritten


def test_deleting_a_run_garbage_collects_children_but_not_a_shared_calibration(kube, operator):
    kube.apply(run_manifest("iota", calibration={"name": "shared-cal"}))
    wait_for(lambda: kube.get("job", "iota-trainer"), what="job")
    wait_for(lambda: kube.get("deployment", "shared-cal"), what="shared calibration")
    kube.run("delete", "wmrlrun", "iota", "-n", kube.ns, "--wait=true", "--timeout=30s")
    for kind, pattern in CHILDREN:
        name = pattern.format(r="iota", u="")
        if "calibration" in name:
            continue
        wait_for(lambda: kube.get(kind, name) is None, timeout=60, what=f"{kind}/{name} collected")
    state = kube.get("configmap", "shared-cal-state")
    assert state is not None and "ownerReferences" not in state["metadata"]  # the calibration's own object
    others = (("deployment", "shared-cal"), ("service", "shared-cal"), ("secret", "shared-cal-token"),
              ("networkpolicy", "shared-cal"), ("serviceaccount", "shared-cal"), ("role", "shared-cal"),
              ("rolebinding", "shared-cal"))
    for kind, name in others:
        obj = kube.get(kind, name)
        assert obj is not None and obj["metadata"]["labels"]["wmrl.dev/calibration"] == "shared-cal"
        assert [(r["kind"], r["name"], r["uid"]) for r in obj["metadata"]["ownerReferences"]] == [
            ("ConfigMap", "shared-cal-state", state["metadata"]["uid"])], kind
    # Deleting that one object deletes the whole shared calibration.
    kube.run("delete", "configmap", "shared-cal-state", "-n", kube.ns)
    for kind, name in others:
        wait_for(lambda: kube.get(kind, name) is None, timeout=60, what=f"{kind}/{name} collected")


def test_a_run_made_again_under_its_name_gets_a_token_of_its_own(kube, operator):
    """The old run's token Secret is deleted by the garbage collector after the new run exists: the new
    run must never be handed (and its Pods never wait on) the Secret that is about to disappear."""
    kube.apply(run_manifest("rho"))
    first = wait_for(lambda: kube.get("job", "rho-trainer"), what="rho's job")
    first_token = _token_ref(first["spec"]["template"]["spec"]["containers"][0])["name"]
    kube.run("delete", "wmrlrun", "rho", "-n", kube.ns, "--wait=true", "--timeout=30s")
    kube.apply(run_manifest("rho"))
    uid = wait_for(lambda: (kube.get("wmrlrun", "rho") or {}).get("metadata", {}).get("uid"), what="new uid")
    def new_runs_job():  # one GET: the old run's Job may be garbage-collected between two
        job = kube.get("job", "rho-trainer")
        owners = (job or {}).get("metadata", {}).get("ownerReferences") or []
        return job if owners and owners[0]["uid"] == uid else None

    second = wait_for(new_runs_job, timeout=60, what="the new run's job")
    token = _token_ref(second["spec"]["template"]["spec"]["containers"][0])["name"]
    assert token == f"rho-calibration-token-{uid[:8]}" != first_token
    secret = wait_for(lambda: kube.get("secret", token), what="the new token")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
    wait_for(lambda: kube.get("secret", first_token) is None, timeout=60, what="the old token collected")
    assert kube.get("secret", token) is not None


def _token_ref(container):
    refs = [e["valueFrom"]["secretKeyRef"] for e in container.get("env") or []
            if e["name"] == "WMRL_CALIBRATION_TOKEN"]
    return refs[0] if refs else None


def test_a_calibration_token_is_made_once_and_only_its_trainers_are_admitted(kube, operator):
    """Issue 14 item 4: the calibration service needs a per-calibration token from a Secret the operator
    creates once (never rotated under running trainers; shared by the runs that share the calibration),
    and a NetworkPolicy admits only the trainers labelled with that calibration, and the operator."""
    import base64

    kube.apply(run_manifest("omicron", calibration={"name": "omicron-shared"}))
    kube.apply(run_manifest("pi", calibration={"name": "omicron-shared"}))
    secret = wait_for(lambda: kube.get("secret", "omicron-shared-token"), what="token secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 40
    assert secret["metadata"]["ownerReferences"][0]["name"] == "omicron-shared-state"  # shared: belongs to no run
    service = wait_for(lambda: kube.get("deployment", "omicron-shared"), what="calibration deployment")
    assert _token_ref(service["spec"]["template"]["spec"]["containers"][0]) == {"name": "omicron-shared-token",
                                                                                 "key": "token"}
    for run in ("omicron", "pi"):
        job = wait_for(lambda: kube.get("job", f"{run}-trainer"), what=f"{run}'s job")
        template = job["spec"]["template"]
        assert _token_ref(template["spec"]["containers"][0])["name"] == "omicron-shared-token"
        assert template["metadata"]["labels"]["wmrl.dev/calibration"] == "omicron-shared"
    policy = kube.get("networkpolicy", "omicron-shared")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"wmrl.dev/calibration": "omicron-shared",
                                                    "app.kubernetes.io/component": "calibration"}
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    assert peers == [{"wmrl.dev/calibration": "omicron-shared", "app.kubernetes.io/component": "trainer"},
                     {"wmrl.dev/calibration-reader": "true"}]
    # A spec change re-applies every child: the token stays what the trainers already hold.
    kube.run("patch", "wmrlrun", "omicron", "-n", kube.ns, "--type=merge", "-p",
             json.dumps({"spec": {"algorithm": {"steps": 7}}}))
    wait_for(lambda: (kube.status("omicron") or {}).get("observedGeneration") == 2, what="generation 2 reconciled")
    assert kube.get("secret", "omicron-shared-token")["data"]["token"] == secret["data"]["token"]
