"""The ``wmrl`` console script: one entry point, subcommands imported lazily.

Each subcommand lives in its own module, which exposes
``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``main(args: argparse.Namespace) -> int``. Modules are imported only when their
command runs, so ``wmrl operator`` never pays for torch and ``wmrl --help`` is instant.

Exit codes: 0 success, 1 the work failed, 2 bad usage or invalid input,
130 interrupted (Ctrl-C; long-running commands checkpoint before exiting), 141 stdout was
closed early (``wmrl --help | head -1``; quietly, like a tool killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from typing import NamedTuple

from wmrl import __version__

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a tool the signal ended


class Command(NamedTuple):
    words: tuple[str, ...]
    module: str
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command(("run",), "wmrl_trainer.local", "run a WMRLRun manifest on this machine (no cluster)"),
    Command(("launch",), "wmrl_trainer.launch",
            "the trainer Pod's entry point: one training process per GPU, nodes meet at Pod 0"),
    Command(("train",), "wmrl_trainer.train", "one training process: train from a rendered run config"),
    Command(("operator",), "wmrl_operator.main", "run the operator (kopf) that reconciles WMRLRuns"),
    Command(("crd",), "wmrl.api.crd", "print the WMRLRun CustomResourceDefinition YAML"),
    Command(("tasks", "check"), "wmrl.tasks_check",
            "check a task directory (wmrl, MLE-bench, MLE-Dojo, DSBench, normalised); exit 2 naming what is wrong"),
    Command(("tasks", "grade"), "wmrl.tasks_grade", "grade a submission CSV of one task; print its status and position"),
    Command(("calibration", "serve"), "wmrl.calibration.service", "serve a shared calibration (ConfigMap or file)"),
    Command(("sandbox", "serve"), "wmrl_sandbox.server", "serve SandboxFusion-compatible code execution"),
    Command(("bench", "operator"), "wmrl_operator.bench", "benchmark: 100 WMRLRuns on a real control plane"),
    Command(("bench", "calibration"), "wmrl.calibration.bench", "benchmark: calibration throughput and refit time"),
    Command(("bench", "sandbox"), "wmrl_sandbox.bench", "benchmark: execution overhead and throughput"),
    Command(("bench", "trainer"), "wmrl_trainer.bench", "benchmark: time per step split by phase, per mode"),
    Command(("bench", "speedup"), "wmrl_bench.speedup", "benchmark: WMRL against real-execution GRPO"),
    Command(("bench", "quickstart"), "wmrl_bench.robustness",
            "benchmark: the quickstart over seeds x torch threads; exit 1 unless every cell learns"),
    Command(("trajectories",), "wmrl_trainer.trajectories_cli",
            "print or filter a run's trajectory logs (spec.logging.trajectories)"),
    Command(("eval",), "wmrl_trainer.eval_cli",
            "evaluate a checkpoint (or a base policy) on a task set by real execution: JSON + Markdown report"),
    Command(("eval", "world-model"), "wmrl_trainer.fidelity.cli",
            "measure a world model on fidelity cases: status@1/@2, reward error, confusion, reliability"),
    Command(("report",), "wmrl_bench.report",
            "render a speedup results JSON, or a run's held-out reports (--eval-dir), as plots and Markdown"),
)


def _usage(group: str | None = None) -> str:
    """The commands (those of ``group``, e.g. "bench", when given) with their summaries."""
    shown = [c for c in COMMANDS if group is None or (len(c.words) > 1 and c.words[0] == group)]
    width = max(len(" ".join(c.words)) for c in shown)
    lines = [f"usage: wmrl {group + ' ' if group else ''}<command> [options]", "", "commands:"]
    lines += [f"  {' '.join(c.words):<{width}}  {c.summary}" for c in shown]
    lines += ["", "Run 'wmrl <command> --help' for a command's options.",
              "Exit codes: 0 ok, 1 failed, 2 bad usage or invalid input, 130 interrupted,",
              "141 output closed early (| head)."]
    return "\n".join(lines)


def _find(argv: list[str]) -> Command | None:
    for command in sorted(COMMANDS, key=lambda c: -len(c.words)):
        if tuple(argv[: len(command.words)]) == command.words:
            return command
    return None


def main(argv: list[str] | None = None) -> int:
    """Run a command; when its reader goes away (``| head -1``), exit quietly with 141.

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError: here, or at the
    interpreter's final flush, where it would print a traceback. SIGPIPE is not restored to its
    default instead: that would also kill the operator or a server when a peer's socket closes.
    """
    try:
        try:
            code = _dispatch(argv)
        except SystemExit:  # argparse's --help and usage errors print, then exit
            _flush_stdout()
            raise
        _flush_stdout()
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a socket of the command's own, not our stdout: a real error
        # Nothing more can be written; point stdout at /dev/null so the exit-time flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose read end is closed (poll reports POLLERR for it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real stdout (replaced, closed): not ours
        return False


def _dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return EXIT_OK
    if argv[0] == "--version":
        print(__version__)
        return EXIT_OK
    command = _find(argv)
    groups = {c.words[0] for c in COMMANDS if len(c.words) > 1}
    if command is None and argv[0] in groups and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(_usage(argv[0]), file=sys.stdout if len(argv) > 1 else sys.stderr)
        return EXIT_OK if len(argv) > 1 else EXIT_USAGE  # `wmrl bench --help`, or `wmrl bench` alone
    if command is None:
        print(f"wmrl: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(command.module)
    parser = argparse.ArgumentParser(prog="wmrl " + " ".join(command.words), description=command.summary)
    module.add_arguments(parser)
    args = parser.parse_args(argv[len(command.words):])
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        print("wmrl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
