"""``wmrl eval``: bad input exits 2 naming the field or flag; what it evaluates (checkpoint, tasks,
spec) is decided from its inputs; an evaluation whose sandbox goes down midway is reported partial
with the reason, never as a number (exit 1); the status a mode-eval run gets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from wmrl import cli
from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec
from wmrl_trainer import eval_cli
from wmrl_trainer.services import free_port

MANIFEST = {
    "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": "tiny"},
    "spec": {
        "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
        "worldModel": {"backend": "learned"},
        "tasks": {"builtin": "mini-ml", "heldOut": ["wine", "iris"]},
        "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 2, "maxTurns": 1, "seed": 3},
        "evaluation": {"samples": 2},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"gpusPerNode": 0},
    },
}


def _manifest(tmp_path: Path, **spec) -> Path:
    manifest = json.loads(json.dumps(MANIFEST))
    manifest["spec"].update(spec)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def _wmrl_eval(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["eval", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- bad input: exit 2, naming what is wrong

@pytest.mark.parametrize("extra, named", [
    (("--samples", "0"), "--samples (spec.evaluation.samples: Input should be greater than or equal to 1)"),
    (("--temperature", "0"), "--temperature (spec.evaluation.temperature:"),
    (("--turns", "2"), "spec.algorithm.maxTurns: builtin:tiny-coder writes one script"),
    (("--checkpoint", "{tmp}/nowhere"), "--checkpoint: {tmp}/nowhere is not a directory"),
    (("--checkpoint", "{tmp}"), "--checkpoint: {tmp} holds no complete checkpoint"),
    (("--tasks", "{tmp}/none"), "none: not a directory"),
    (("--tasks", "builtin:mini-ml", "--format", "wmrl"), "--format/--task-list: they apply to a task directory"),
    (("--sandboxes", "0"), "--sandboxes must be >= 1"),
    (("--config", "{tmp}/run.yaml"), "give a WMRLRun manifest or --config, not both"),
])
def test_bad_input_exits_2_naming_the_field_or_flag(tmp_path, capsys, extra, named):
    manifest = _manifest(tmp_path)
    extra = tuple(e.format(tmp=tmp_path) for e in extra)
    code, out, err = _wmrl_eval(capsys, str(manifest), *extra, "--out", str(tmp_path / "out"))
    assert code == 2, err
    assert named.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


@pytest.mark.parametrize("argv, named", [
    ((), "--policy: name the policy to evaluate"),
    (("--policy", "builtin:tiny-coder"), "--tasks: name the tasks to evaluate on"),
    (("--policy", "builtin:tiny-coder", "--tasks", "builtin:no-such-suite"), "spec.tasks.builtin: unknown suite"),
    (("{tmp}/not-a-run.yaml",), "not-a-run.yaml: not a WMRLRun manifest (kind: WMRLRun)"),
])
def test_missing_or_wrong_inputs_exit_2(tmp_path, capsys, argv, named):
    (tmp_path / "not-a-run.yaml").write_text("kind: Deployment\n")
    code, _, err = _wmrl_eval(capsys, *(a.format(tmp=tmp_path) for a in argv), "--out", str(tmp_path / "out"))
    assert code == 2 and named in err, err


def test_unknown_held_out_tasks_and_bad_manifest_fields_name_the_field(tmp_path, capsys):
    manifest = _manifest(tmp_path, tasks={"builtin": "mini-ml", "heldOut": ["iris", "titanic"]})
    code, _, err = _wmrl_eval(capsys, str(manifest))
    assert code == 2 and "spec.tasks.heldOut: unknown task(s) ['titanic']" in err, err
    manifest = _manifest(tmp_path, evaluation={"samples": 2, "checkpoint": "latest"})
    code, _, err = _wmrl_eval(capsys, str(manifest))
    assert code == 2 and "spec.evaluation.checkpoint: String should match pattern" in err, err


def test_eval_and_eval_world_model_coexist_the_longest_match_wins(capsys):
    assert cli._find(["eval", "world-model", "--cases", "x.jsonl"]).words == ("eval", "world-model")
    assert cli._find(["eval", "run.yaml", "--samples", "4"]).module == "wmrl_trainer.eval_cli"
    assert cli._find(["eval", "--help"]).module == "wmrl_trainer.eval_cli"
    with pytest.raises(SystemExit) as done:
        cli.main(["eval", "--help"])
    assert done.value.code == 0 and "usage: wmrl eval [-h] [--config FILE]" in capsys.readouterr().out


# ---------------------------------------------------------------- what is evaluated

def _checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"")
    if complete:
        (path / "COMPLETE").write_text(json.dumps({"step": step}))
    return path


def test_checkpoints_a_folder_the_newest_complete_one_or_saved_weights(tmp_path):
    root = tmp_path / "ckpt"
    _checkpoint(root, 5)
    newest = _checkpoint(root, 10)
    _checkpoint(root, 15, complete=False)  # cut off mid-write: never evaluated
    assert eval_cli.checkpoint_in(root, "--checkpoint") == (newest, 10)
    assert eval_cli.checkpoint_in(root / "step-00000005", "--checkpoint") == (root / "step-00000005", 5)
    assert eval_cli.checkpoint_in(root / "step-00000015", "--checkpoint") == (root / "step-00000015", None)


def test_the_plan_takes_the_manifests_held_out_tasks_in_suite_order_and_the_flags(tmp_path):
    plan = eval_cli.plan(_args(str(_manifest(tmp_path)), "--samples", "5", "--temperature", "0.7", "--seed", "11",
                               "--out", str(tmp_path / "o")))
    assert [t.name for t in plan.tasks] == ["iris", "wine"]  # the run's held-out split keeps the suite's order
    spec = plan.config.spec
    assert (spec.evaluation.samples, spec.evaluation.temperature, spec.algorithm.seed) == (5, 0.7, 11)
    assert plan.seed == 11 + 7919 and plan.checkpoint is None and not plan.cluster
    assert plan.config.runtime.patch_status is False and plan.out == (tmp_path / "o").resolve()
    everything = eval_cli.plan(_args(str(_manifest(tmp_path)), "--tasks", "builtin:mini-ml"))
    assert len(everything.tasks) == 15 and everything.config.spec.tasks.held_out == []
    assert everything.out == (Path.cwd() / "wmrl-eval" / "tiny").resolve()


def _rendered(tmp_path: Path, checkpoint: str, urls=()) -> Path:
    """The run config a mode-eval Job mounts (what the operator renders), pointed at local things."""
    spec = json.loads(json.dumps(MANIFEST["spec"]))
    spec.update(mode="eval", evaluation={"samples": 2, "checkpoint": checkpoint})
    config = RunConfig(metadata=RunMetadata(name="ev", namespace="team"), spec=WMRLRunSpec.model_validate(spec),
                       runtime=Runtime(checkpoint_dir=str(tmp_path / "ckpt"), sandbox_urls=list(urls),
                                       patch_status=False, metrics_port=None))
    path = tmp_path / "rendered.yaml"
    path.write_text(config.to_yaml())
    return path


def test_with_the_rendered_config_spec_evaluation_checkpoint_picks_the_policy(tmp_path):
    root = tmp_path / "ckpt"
    _checkpoint(root, 20)
    newest = _checkpoint(root, 40)
    plan = eval_cli.plan(_args("--config", str(_rendered(tmp_path, ""))))
    assert (plan.checkpoint, plan.checkpoint_step, plan.cluster) == (newest, 40, True)
    assert plan.out == (root / "evaluations" / "ev").resolve()
    plan = eval_cli.plan(_args("--config", str(_rendered(tmp_path, "step-00000020"))))
    assert (plan.checkpoint, plan.checkpoint_step) == (root / "step-00000020", 20)
    assert eval_cli.plan(_args("--config", str(_rendered(tmp_path, "base")))).checkpoint is None
    with pytest.raises(ValueError, match=r"spec.evaluation.checkpoint \(step-00000030 under .*\): .* is not a complete"):
        eval_cli.plan(_args("--config", str(_rendered(tmp_path, "step-00000030"))))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="spec.evaluation.checkpoint .*: no complete checkpoint there"):
        eval_cli.plan(_args("--config", str(_rendered(empty, ""))))


# ---------------------------------------------------------------- the status of a mode-eval run

def test_the_status_holds_the_reward_only_when_complete():
    running = eval_cli.status_progress(None, 40, demand=4, path=None).to_wire()
    assert running["sandboxDemand"] == 4 and running["step"] == 40 and "heldOutReward" not in running
    done = eval_cli.status_progress({"complete": True, "partial": None, "reward": 0.62, "samples": 8, "executed": 5,
                                     "eval_seconds": 3.21}, 40, demand=0, path="/ckpt/evaluations/ev/eval.json").to_wire()
    assert done["heldOutReward"] == 0.62 and done["sandboxDemand"] == 0
    assert done["heldOut"] == {"step": 40, "samples": 8, "evaluations": 1, "executions": 5, "seconds": 3.21,
                               "report": "/ckpt/evaluations/ev/eval.json"}
    partial = eval_cli.status_progress({"complete": False, "partial": "3 of 8 trajectories graded: down",
                                        "reward": None, "samples": 8, "executed": 4}, 40, 0, "r.json").to_wire()
    assert "heldOutReward" not in partial
    assert partial["heldOut"]["partial"] == "checkpoint step 40: 3 of 8 trajectories graded: down"


# ---------------------------------------------------------------- partial: the sandbox goes down

class _DownAfterFirst:
    """The real dispatcher, whose only sandbox server is stopped once the first execution has finished."""

    def __init__(self, dispatcher, server):
        self.dispatcher, self.server, self.calls = dispatcher, server, 0

    def run_task(self, task, code):
        self.calls += 1
        future = self.dispatcher.run_task(task, code)
        if self.calls == 1:
            future.result()  # one real outcome, then the sandbox goes away
            self.server.close()
        return future

    def failing_fast(self, grace):  # as the evaluator asks of the real one
        self.dispatcher = self.dispatcher.failing_fast(grace)
        return self

    def close(self):
        self.dispatcher.close()


@pytest.mark.slow
def test_a_sandbox_that_goes_down_midway_makes_a_partial_report_with_the_reason(tmp_path):
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_sandbox.local import LocalServer

    plan = eval_cli.plan(_args(str(_manifest(tmp_path)), "--samples", "4", "--out", str(tmp_path / "out")))
    server = LocalServer(slots=1)
    try:
        dispatcher = _DownAfterFirst(SandboxDispatcher(StaticEndpoints([server.url]), timeout=60), server)
        try:
            report = eval_cli.evaluate(plan, dispatcher, max_concurrent=1, progress=False)
        finally:
            dispatcher.close()
    finally:
        server.close()
    assert report["complete"] is False and report["reward"] is None
    assert report["overall"] is None and report["by_category"] is None
    assert report["partial"].startswith("1 of 8 trajectories graded: execution of a ")
    assert "failed" in report["partial"]
    assert sum(t["graded"] for t in report["tasks"].values()) == 1
    assert all(t["percentile"] is None for t in report["tasks"].values())  # no task of it was all graded
    eval_cli.write_report(report, plan.out)
    saved = json.loads((plan.out / "eval.json").read_text())
    assert saved["partial"] == report["partial"] and saved["reward"] is None
    assert "**PARTIAL: 1 of 8 trajectories graded" in (plan.out / "eval.md").read_text()


@pytest.mark.slow
def test_no_sandbox_at_all_exits_1_with_a_partial_report(tmp_path, capsys, monkeypatch):
    """The mode-eval Job's command line, its sandbox pool unreachable (a closed port). The run's
    dispatcher retries each execution 3 times, cooling a failing pod down longer each time, and the
    evaluation's executions give up once the whole pool has failed for 5 s; this one gives up at
    the first refusal."""
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_trainer import build

    def impatient(config):
        return SandboxDispatcher(StaticEndpoints(list(config.runtime.sandbox_urls)), timeout=60, max_retries=0,
                                 backoff=0.01)

    monkeypatch.setattr(build, "build_dispatcher", impatient)
    (tmp_path / "ckpt").mkdir()
    config = _rendered(tmp_path, "base", urls=[f"http://127.0.0.1:{free_port()}"])
    code, out, err = _wmrl_eval(capsys, "--config", str(config), "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 1, err
    assert "wmrl eval: partial evaluation, no result: " in err and "Traceback" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["complete"] is False and summary["reward"] is None and summary["percentile"] is None
    saved = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert saved["partial"] == summary["partial"] and "failed" in saved["partial"]


def test_a_mode_eval_manifest_is_evaluated_not_trained(tmp_path, capsys):
    manifest = _manifest(tmp_path, mode="eval")
    code = cli.main(["run", str(manifest), "--results", str(tmp_path / "out")])
    assert code == 2 and "spec.mode: eval trains nothing; evaluate with `wmrl eval" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    from wmrl_trainer.build import build_trainer

    plan = eval_cli.plan(_args(str(manifest)))
    with pytest.raises(ValueError, match="spec.mode: eval trains nothing"):
        build_trainer(plan.config)


# ---------------------------------------------------------------- the policy evaluated

def _nudged_checkpoint(model, tokenizer, directory: Path) -> Path:
    """``model`` with one weight changed, saved as the trainer saves a checkpoint (weights, tokenizer, COMPLETE)."""
    import torch

    with torch.no_grad():
        next(model.parameters()).add_(0.25)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "COMPLETE").write_text(json.dumps({"step": 7}))
    return directory


@pytest.mark.parametrize("kind", ["hub-style directory", "builtin"])
def test_a_checkpoint_loads_its_own_weights_over_the_base_policy(tmp_path, kind):
    import torch

    from wmrl_trainer.policy import load_policy, save_tiny_model

    name = str(save_tiny_model(tmp_path / "base")) if kind != "builtin" else "builtin:tiny-coder"
    model, tokenizer = load_policy(name)
    ckpt = _nudged_checkpoint(model, tokenizer, tmp_path / "step-00000007")
    trained, _ = eval_cli.load_evaluated_policy(name, ckpt)
    base, _ = eval_cli.load_evaluated_policy(name, None)
    first = lambda m: next(m.parameters())  # noqa: E731
    assert torch.equal(first(trained), first(model)) and not torch.equal(first(trained), first(base))
    assert trained.generation_config.eos_token_id == base.generation_config.eos_token_id
    (ckpt / "model.safetensors").unlink()  # what an FSDP run's sharded checkpoint lacks
    with pytest.raises(ValueError, match="has no whole weights"):
        eval_cli.load_evaluated_policy(name, ckpt)
