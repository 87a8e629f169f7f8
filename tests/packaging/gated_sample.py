"""Run only by tests/packaging/test_build_deps.py (not a test_*.py file): one test gated on the
background "vllm" build (by its marker), one that needs none, in that order in the file."""

import os
from pathlib import Path

import pytest


@pytest.mark.vllm
def test_gated_on_the_vllm_build():
    assert Path(os.environ["SAMPLE_DIR"], "built").read_text() == "done"


def test_needs_no_build():
    Path(os.environ["SAMPLE_DIR"], "go").write_text("the ungated test ran")
