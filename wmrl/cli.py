"""The ``wmrl`` console script: one entry point, subcommands imported lazily.

Each subcommand lives in its own module, which exposes
``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``main(args: argparse.Namespace) -> int``. Modules are imported only when their
command runs, so ``wmrl operator`` never pays for torch and ``wmrl --help`` is instant.

Exit codes: 0 success, 1 the work failed, 2 bad usage or invalid input,
130 interrupted (Ctrl-C; long-running commands checkpoint before exiting).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Command(NamedTuple):
    words: tuple[str, ...]
    module: str
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command(("run",), "wmrl_trainer.local", "run a WMRLRun manifest on this machine (no cluster)"),
    Command(("train",), "wmrl_trainer.train", "the trainer Job's entry point: train from a rendered run config"),
    Command(("operator",), "wmrl_operator.main", "run the operator (kopf) that reconciles WMRLRuns"),
    Command(("crd",), "wmrl.api.crd", "print the WMRLRun CustomResourceDefinition YAML"),
    Command(("calibration", "serve"), "wmrl.calibration.service", "serve a shared calibration (ConfigMap or file)"),
    Command(("sandbox", "serve"), "wmrl_sandbox.server", "serve SandboxFusion-compatible code execution"),
    Command(("bench", "operator"), "wmrl_operator.bench", "benchmark: 100 WMRLRuns on a real control plane"),
    Command(("bench", "calibration"), "wmrl.calibration.bench", "benchmark: calibration throughput and refit time"),
    Command(("bench", "sandbox"), "wmrl_sandbox.bench", "benchmark: execution overhead and throughput"),
    Command(("bench", "trainer"), "wmrl_trainer.bench", "benchmark: time per step split by phase, per mode"),
    Command(("bench", "speedup"), "wmrl_trainer.speedup", "benchmark: WMRL against real-execution GRPO"),
    Command(("report",), "wmrl_trainer.report", "render a speedup results JSON as a plot and a Markdown table"),
)


def _usage() -> str:
    width = max(len(" ".join(c.words)) for c in COMMANDS)
    lines = ["usage: wmrl <command> [options]", "", "commands:"]
    lines += [f"  {' '.join(c.words):<{width}}  {c.summary}" for c in COMMANDS]
    lines += ["", "Run 'wmrl <command> --help' for a command's options.",
              "Exit codes: 0 ok, 1 failed, 2 bad usage or invalid input, 130 interrupted."]
    return "\n".join(lines)


def _find(argv: list[str]) -> Command | None:
    for command in sorted(COMMANDS, key=lambda c: -len(c.words)):
        if tuple(argv[: len(command.words)]) == command.words:
            return command
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return EXIT_OK
    if argv[0] == "--version":
        from wmrl import __version__

        print(__version__)
        return EXIT_OK
    command = _find(argv)
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
