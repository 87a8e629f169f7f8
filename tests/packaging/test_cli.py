"""The installed ``wmrl`` console script when its reader stops reading (``wmrl --help | head -1``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

WMRL = Path(sys.executable).parent / "wmrl"  # the console script pip installed next to this interpreter


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run ``wmrl args`` with stdout a real pipe whose read end is already closed.

    Closing it before the start, rather than racing a ``head``, makes every write fail on every run.
    """
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([str(WMRL), *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("--help",), ("crd",)])  # our usage text; a subcommand's output (30 kB)
def test_output_cut_short_exits_quietly(args):
    proc = _run_into_closed_pipe(*args)
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" either
    assert proc.returncode == 141  # 128 + SIGPIPE, what a shell shows for any tool whose reader left


def test_a_subcommand_help_cut_short_exits_quietly():
    proc = _run_into_closed_pipe("crd", "--help")
    assert proc.stderr == ""
    assert proc.returncode == 0  # argparse ignores its own write errors, then exits 0 as after any --help


def test_head_sees_the_first_line_through_a_shell_pipe():
    proc = subprocess.run(["sh", "-c", f"'{WMRL}' --help | head -1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "usage: wmrl <command> [options]\n"
    assert proc.stderr == ""


def test_a_reader_that_stays_gets_everything():
    proc = subprocess.run([str(WMRL), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "calibration serve" in proc.stdout and proc.stdout.endswith("141 output closed early (| head).\n")


def test_a_command_group_lists_its_commands():
    """`wmrl bench --help` lists the bench commands (exit 0); `wmrl tasks` alone is a usage error (exit 2)."""
    listed = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and "usage: wmrl bench <command>" in listed.stdout
    assert "bench speedup" in listed.stdout and "  run " not in listed.stdout
    bare = subprocess.run([sys.executable, "-m", "wmrl.cli", "tasks"], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "tasks check" in bare.stderr and "tasks grade" in bare.stderr
