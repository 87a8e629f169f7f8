import importlib.util
import sys
from pathlib import Path

import pytest

# tests/vllm_cpu/harness.py (stdlib only), loaded by path like tests/cluster/cluster.py; importable
# afterwards as `wmrl_vllm_harness`.
if "wmrl_vllm_harness" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("wmrl_vllm_harness", Path(__file__).resolve().parent / "harness.py")
    sys.modules["wmrl_vllm_harness"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["wmrl_vllm_harness"])
harness = sys.modules["wmrl_vllm_harness"]


@pytest.fixture(scope="session")
def vllm_build():
    """The cached vLLM venv and tiny model (built on first use: ~10 min cold, 0 s warm)."""
    return harness.build()


@pytest.fixture(scope="module")
def vllm_server(vllm_build, tmp_path_factory):
    """A real ``vllm serve`` from the cached venv, on a free loopback port, started with exactly the
    args the operator renders for the world-model Deployment of a spec whose world model is the
    tiny model; only --host/--port are replaced and harness.CPU_ONLY_FLAGS added. A flag this vLLM
    does not know makes it exit, and the fixture fails with its log. Module-scoped: it stops before
    the next module's vLLM starts (one at a time on a small machine)."""
    spec = harness.world_model_spec(vllm_build.model)
    rendered = harness.rendered_args(spec)
    port = harness.free_port()
    server = harness.VLLMServer([vllm_build.vllm, "serve", *harness.local_args(rendered, port)], port,
                                tmp_path_factory.mktemp("vllm") / "vllm-serve.log")
    server.start()
    server.spec, server.rendered = spec, rendered
    try:
        yield server
    finally:
        server.stop()
