"""Fixtures for the local-runner tests (shared helpers live in local_helpers.py)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def wmrl_env(tmp_path_factory):
    """Environment for `wmrl` subprocesses: offline, shared caches (policy + suite are built once)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env
